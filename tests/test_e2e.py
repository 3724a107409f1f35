"""End to end through the real CLI: ``python -m rocmtrain`` trains the CPU recipe on 2 gloo ranks
(Lightning re-runs the command for rank 1), prints per-epoch metrics, writes an atomic checkpoint,
and a second invocation with the same ``run_dir`` auto-resumes from it."""

from __future__ import annotations

import pytest
from test_cli import run_cli

from rocmtrain import checkpoint as ckpt

pytestmark = pytest.mark.slow


def test_cli_trains_then_auto_resumes(tmp_path):
    run = tmp_path / "run"
    common = [
        "data.num_train_batches=8",
        "data.num_val_batches=2",
        "data.batch_size=64",
        "trainer.progress_bar=false",
        f"run_dir={run}",
    ]
    first = run_cli("trainer.max_epochs=1", *common, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    line = next(ln for ln in first.stdout.splitlines() if ln.startswith("epoch 1/1:"))
    for key in ("train_loss=", "train_auc=", "val_loss=", "val_auc=", "val_ne=", "samples/s="):
        assert key in line, line
    assert f"run dir: {run}" in first.stderr
    assert ckpt.find_resume(run / "checkpoints") == run / "checkpoints" / "step-000000008"

    second = run_cli("trainer.max_epochs=2", *common, cwd=tmp_path)
    text = second.stdout + second.stderr
    assert second.returncode == 0, text[-3000:]
    assert "resuming from" in text and "step-000000008" in text
    epochs = [ln for ln in second.stdout.splitlines() if ln.startswith("epoch ")]
    assert len(epochs) == 1 and epochs[0].startswith("epoch 2/2:"), epochs
    names = [p.name for p in ckpt.list_checkpoints(run / "checkpoints")]
    assert names == ["step-000000008", "step-000000016"]
    assert (run / "logs" / "metrics.csv").is_file()
