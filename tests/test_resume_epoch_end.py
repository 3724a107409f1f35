"""Resuming from an epoch-end checkpoint loses no epoch (real CLI, 2 gloo ranks).

A run resumed from the checkpoint written at the end of epoch 1 and stopped by ``max_steps``
inside epoch 2 used to crash at the resumed epoch's end (no batch trained there: empty AUC) after
re-writing that checkpoint as if the epoch had run again; the next run then skipped epoch 2 and
exited 0 having trained nothing."""

from __future__ import annotations

import pytest
from test_cli import run_cli

from rocmtrain import checkpoint as ckpt

pytestmark = pytest.mark.slow


def test_resume_from_an_epoch_end_checkpoint_trains_the_next_epoch(tmp_path):
    run = tmp_path / "run"
    common = [
        "data.num_train_batches=22",
        "checkpoint.every_n_train_steps=5",
        "trainer.progress_bar=false",
        f"run_dir={run}",
    ]
    first = run_cli("trainer.max_epochs=1", *common, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert ckpt.find_resume(run / "checkpoints").name == "step-000000022"
    cut = run_cli("trainer.max_epochs=2", "trainer.max_steps=25", *common, cwd=tmp_path)
    assert cut.returncode == 0, cut.stderr[-3000:]
    last = run_cli("trainer.max_epochs=2", *common, cwd=tmp_path)
    assert last.returncode == 0, last.stderr[-3000:]
    assert ckpt.find_resume(run / "checkpoints").name == "step-000000044"  # epoch 2 trained
    assert any(line.startswith("epoch 2/2:") for line in last.stdout.splitlines())


def test_a_run_cut_by_max_steps_resumes_inside_its_epoch(tmp_path):
    """``max_steps`` ending a run inside an epoch leaves a checkpoint of a step *inside* that
    epoch: the next run (same epochs, no step cap) trains the epoch's remaining batches instead of
    taking the epoch as done, and its epoch line's rate counts the batches it trained."""
    run = tmp_path / "run"
    common = [
        "data.num_train_batches=22",
        "checkpoint.every_n_train_steps=5",
        "trainer.progress_bar=false",
        "trainer.max_epochs=1",
        f"run_dir={run}",
    ]
    cut = run_cli("trainer.max_steps=12", *common, cwd=tmp_path)
    assert cut.returncode == 0, cut.stderr[-3000:]
    assert ckpt.find_resume(run / "checkpoints").name == "step-000000012"
    rest = run_cli(*common, cwd=tmp_path)
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert ckpt.find_resume(run / "checkpoints").name == "step-000000022"  # batches 13-22 ran
    (line,) = [ln for ln in rest.stdout.splitlines() if ln.startswith("epoch 1/1:")]
    rate = float(line.split("samples/s=")[1].split()[0].replace(",", ""))
    assert rate > 100, line  # samples over this fit's own time, not since the clock's zero
