"""The new bench_e2e_gpu.sh stage scripts in their CPU smoke forms: the swap-in user module
(``swapin_user_module.py --cpu-smoke``) and the anchor's convergence run (``--fresh-epochs``),
then the summary over both."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "scripts" / "bench"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.slow
def test_swapin_and_fresh_anchor_smoke_then_summary(tmp_path):
    swap = tmp_path / "runs" / "swapin_1gpu_bf16"
    out = subprocess.run(
        [sys.executable, str(BENCH / "swapin_user_module.py"), "--cpu-smoke", "--out-dir", str(swap)],
        env=_env(), capture_output=True, text=True, timeout=500, check=True,
    )  # fmt: skip
    assert "samples/s " in out.stdout.strip().splitlines()[-1]
    doc = json.loads((swap / "throughput.json").read_text())
    assert doc["final"] and doc["samples_per_s"] > 0 and doc["batch_per_rank"] == 256

    anchor = tmp_path / "anchor_1gpu_bf16_fresh.json"
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
         str(BENCH / "e2e_torchrec_anchor.py"), "--cpu", "--global-batch", "128",
         "--rows-cap", "500", "--dim", "8", "--small-dense", "--bf16", "--warmup", "1",
         "--steps", "3", "--sync-every", "1", "--fresh-epochs", "2", "--val-batches", "1",
         "--workers", "0", "--out", str(anchor)],
        env=_env(), capture_output=True, text=True, timeout=500, check=True,
    )  # fmt: skip
    res = json.loads(anchor.read_text())
    assert len(res["step_losses"]) == 6  # 2 epochs x 3 new batches, every one trained
    assert [h["epoch"] for h in res["history"]] == [0.0, 1.0]
    assert all(0.0 <= h["val_auc"] <= 1.0 for h in res["history"])
    assert res["median_step_ms_windows"] > 0

    stages = [
        {"name": "anchor_1gpu_bf16_fresh", "kind": "anchor", "gpus": 1, "status": "ok",
         "result": str(anchor)},
        {"name": "swapin_1gpu_bf16", "kind": "swapin", "gpus": 1, "status": "ok",
         "result": str(swap / "throughput.json"), "run_dir": str(swap)},
    ]  # fmt: skip
    (tmp_path / "stages.jsonl").write_text("\n".join(json.dumps(s) for s in stages) + "\n")
    subprocess.run(
        [sys.executable, str(BENCH / "e2e_summary.py"), "--stages", str(tmp_path / "stages.jsonl"),
         "--out", str(tmp_path / "e2e"), "--mode", "cpu"],
        check=True, timeout=120,
    )  # fmt: skip
    md = (tmp_path / "e2e" / "summary.md").read_text()
    assert "| swapin_1gpu_bf16 | user module + strategy | 1 |" in md
    assert (tmp_path / "e2e" / "convergence.png").is_file()
