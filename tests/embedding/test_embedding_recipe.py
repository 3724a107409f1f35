"""The CPU recipe (``python -m rocmtrain``, 2 gloo ranks, table-wise DLRM) trained with
``kernel=torch`` (rocmtrain's sharder + reference kernel) follows the ``kernel=fbgemm`` loss curve
(TorchRec's FBGEMM-CPU TBE), step by step. Real CLI subprocesses."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two 2-rank training runs

REPO = Path(__file__).resolve().parents[2]


def _run(kernel: str, run_dir: Path) -> tuple[list[float], dict[str, float]]:
    cmd = [
        sys.executable, "-m", "rocmtrain", f"kernel={kernel}",
        "model.embedding_optimizer=rowwise_adagrad",  # our kernels: sgd, rowwise_adagrad, adam
        "trainer.max_epochs=1", "trainer.log_every_n_steps=1",
        "data.num_train_batches=12", "data.num_val_batches=2", f"run_dir={run_dir}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    placed = "customized_kernel" if kernel == "torch" else "fused"  # the plan summary
    assert f"table_wise       {placed}" in proc.stdout + proc.stderr
    rows = list(csv.DictReader((run_dir / "logs" / "metrics.csv").open()))
    losses = [float(r["loss"]) for r in rows if r.get("loss")]
    final = {k: float(v) for r in rows for k, v in r.items() if k.startswith("val_") and v}
    return losses, final


def test_cpu_recipe_kernel_torch_matches_fbgemm_curve(tmp_path):
    ours, ours_val = _run("torch", tmp_path / "torch")
    ref, ref_val = _run("fbgemm", tmp_path / "fbgemm")
    assert len(ours) == len(ref) >= 10
    assert ours == pytest.approx(ref, rel=1e-4, abs=1e-6)
    assert ours_val.keys() == ref_val.keys() and "val_loss" in ours_val
    for k, v in ref_val.items():
        assert ours_val[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
