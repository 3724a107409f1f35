"""What a user runs is what is measured: the CPU recipe through the real CLI (2 gloo ranks).

* The epoch line's samples/s is the steady-state rate of ``rocmtrain.callbacks.throughput`` (the number
  the benchmarks read from ``throughput.json``), not a whole-epoch average with the warm-up in it.
* The data pipeline alone (no model) delivers the recipe's batches at >= 3x its training step
  rate on this machine, so the CPU recipe is never input-bound.
"""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch
from test_cli import REPO, compose, run_cli

sys.path.insert(0, str(REPO / "scripts" / "bench"))
from data_pipeline import pipeline_rate  # noqa: E402

pytestmark = pytest.mark.slow


def test_epoch_line_prints_the_steady_state_rate_and_data_outpaces_the_step(tmp_path):
    run = tmp_path / "run"
    res = run_cli(
        "trainer.max_epochs=1",
        "data.num_train_batches=60",
        "trainer.progress_bar=false",
        "checkpoint=off",
        "monitor.throughput_warmup_steps=10",
        "monitor.throughput_window_steps=5",
        f"run_dir={run}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("epoch 1/1:"))
    printed = float(re.search(r"samples/s=([\d,]+)", line).group(1).replace(",", ""))
    assert "(whole epoch)" not in line
    doc = json.loads((run / "throughput.json").read_text())
    assert doc["final"] and len(doc["windows"]) == (60 - 10) // 5
    assert printed == round(doc["epochs"][0]["samples_per_s"])

    step_s = doc["step_ms_median"] / 1e3
    cfg = compose("dlrm_cpu")
    data = pipeline_rate(cfg, torch.device("cpu"), batches=60)
    assert data["generated_on"] == "cpu" and data["num_workers"] == 0
    assert data["batches_per_s"] >= 3.0 / step_s, (data, doc["step_ms_median"])


def test_an_epoch_shorter_than_the_warm_up_says_so(tmp_path):
    from rocmtrain.models.module import format_epoch

    steady = {"epoch": 0.0, "samples_per_s": 1200.0, "samples_per_s_epoch": 1000.0}
    whole = {"epoch": 0.0, "samples_per_s": 1000.0, "samples_per_s_epoch": 1000.0}
    assert format_epoch(steady).endswith("samples/s=1,200")
    assert format_epoch(whole).endswith("samples/s=1,000 (whole epoch)")
