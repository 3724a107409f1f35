"""A checkpoint never exists on disk without the metrics row of its step (real processes).

``AtomicCheckpoint`` saves in ``on_train_batch_end``; Lightning writes the step's logged values to
the loggers only after that hook. A process killed between the two resumed after a step whose row
no attempt had written: the row was lost for good (the chaos run's "91 == 92 steps"). Here a
plain Lightning script is SIGKILLed right after the checkpoint of step 6 is complete, then
resumed: the two attempts' metrics hold every step's row exactly once."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import pytorch_lightning as pl
    from pytorch_lightning.demos.boring_classes import BoringModel
    from pytorch_lightning.loggers import CSVLogger
    from pathlib import Path
    from rocmtrain.callbacks.checkpoint import AtomicCheckpoint

    run, version, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])

    class Logged(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("loss", out["loss"])
            return out

    class KillAfterSave(pl.Callback):  # after AtomicCheckpoint: its save of this step is done
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == kill_at and Path(f"{run}/ck/step-{kill_at:09d}").exists():
                os.kill(os.getpid(), signal.SIGKILL)

    trainer = pl.Trainer(
        max_steps=9, accelerator="cpu", devices=1, log_every_n_steps=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        logger=CSVLogger(run, name="logs", version=version),
        callbacks=[AtomicCheckpoint(f"{run}/ck", every_n_train_steps=3), KillAfterSave()],
    )
    # a plain Lightning strategy writes each checkpoint as one file (no atomic folder)
    found = sorted(Path(f"{run}/ck").glob("step-*"))
    trainer.fit(Logged(), ckpt_path=str(found[-1]) if found else None)
    """
)


def _attempt(run: Path, version: str, kill_at: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(run), version, str(kill_at)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _loss_steps(path: Path) -> list[int]:
    with open(path) as fh:
        return [int(r["step"]) for r in csv.DictReader(fh) if r.get("loss")]


def test_killed_right_after_a_save_the_resumed_run_has_every_steps_row(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = _attempt(run, "a1", kill_at=6)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert (run / "ck" / "step-000000006").exists(), first.stderr[-3000:]
    # Lightning's logged step counts from 0: global step 6 is row 5
    assert _loss_steps(run / "logs" / "a1" / "metrics.csv") == list(range(6))

    second = _attempt(run, "a2", kill_at=-1)
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = _loss_steps(run / "logs" / "a2" / "metrics.csv")
    assert resumed == [6, 7, 8]  # once each: the early write is not repeated by Lightning's own


EPOCH_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    import pytorch_lightning as pl
    from pytorch_lightning.demos.boring_classes import BoringModel
    from pytorch_lightning.loggers import CSVLogger
    from pathlib import Path
    import rocmtrain.callbacks.checkpoint as checkpoint_callback
    from rocmtrain.callbacks.checkpoint import AtomicCheckpoint

    run, version, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])

    class EpochLogged(BoringModel):
        # like DLRMModule: the epoch row (its loss, the validation values) is logged in the
        # module's on_train_epoch_end, and only for an epoch this process trained batches of
        def __init__(self):
            super().__init__()
            self.trained = 0

        def training_step(self, batch, batch_idx):
            self.trained += 1
            return super().training_step(batch, batch_idx)

        def on_train_epoch_end(self):
            if self.trained:
                self.log("epoch_row", float(self.current_epoch))
            self.trained = 0

    real_save = checkpoint_callback.save

    def save_then_die(trainer, root, keep_last):  # SIGKILL right after a complete save
        out = real_save(trainer, root, keep_last)
        if trainer.global_step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    checkpoint_callback.save = save_then_die
    trainer = pl.Trainer(
        max_epochs=3, limit_train_batches=3, limit_val_batches=0, accelerator="cpu", devices=1,
        log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, logger=CSVLogger(run, name="logs", version=version),
        callbacks=[AtomicCheckpoint(f"{run}/ck", every_n_epochs=1, keep_last=5)],
    )
    found = sorted(Path(f"{run}/ck").glob("step-*"))
    trainer.fit(EpochLogged(), ckpt_path=str(found[-1]) if found else None)
    """
)


def _epoch_rows(path: Path) -> list[tuple[int, int]]:
    with open(path) as fh:
        return [
            (int(float(r["epoch_row"])), int(r["step"]))
            for r in csv.DictReader(fh)
            if r.get("epoch_row")
        ]


def test_killed_right_after_an_epoch_end_save_no_epoch_row_is_lost(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = subprocess.run(
        [sys.executable, "-c", EPOCH_SCRIPT, str(run), "a1", "6"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert (run / "ck" / "step-000000006").exists(), first.stderr[-3000:]
    # the checkpoint of epoch 1's end exists only after epoch 1's row: both rows are on disk,
    # each at its epoch's last step (Lightning's index of the epoch row)
    assert _epoch_rows(run / "logs" / "a1" / "metrics.csv") == [(0, 2), (1, 5)]

    second = subprocess.run(
        [sys.executable, "-c", EPOCH_SCRIPT, str(run), "a2", "-1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    # resumed at epoch 2 (not at epoch 1 again): its row only, at the same step as uninterrupted
    assert _epoch_rows(run / "logs" / "a2" / "metrics.csv") == [(2, 8)]
    assert (run / "ck" / "step-000000009").exists()
