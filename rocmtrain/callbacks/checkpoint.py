"""``AtomicCheckpoint``: the Lightning callback that writes :mod:`rocmtrain.checkpoint`'s atomic
sharded checkpoints every N steps and/or at epoch ends, keeping the last N.

    trainer = pl.Trainer(callbacks=[AtomicCheckpoint(run_dir / "checkpoints", keep_last=3)])

The write protocol, integrity checks and resume discovery live in :mod:`rocmtrain.checkpoint`;
this module only decides when to call :func:`rocmtrain.checkpoint.save`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from rocmtrain.callbacks.progress import after_epoch_metrics_written, write_step_metrics_now
from rocmtrain.checkpoint import checkpoint_name, is_complete, save


class AtomicCheckpoint(pl.Callback):
    """Write atomic sharded checkpoints every N steps and/or at epoch ends; keep the last N."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        every_n_train_steps: int | None = None,
        every_n_epochs: int = 1,
        keep_last: int = 2,
    ) -> None:
        self.root = Path(root)
        self.every_n_train_steps = every_n_train_steps
        self.every_n_epochs = every_n_epochs
        self.keep_last = keep_last
        self.last_saved: Path | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        n = self.every_n_train_steps
        step = trainer.global_step
        every = bool(n) and step > 0 and step % n == 0
        # the last step of a run cut by max_steps is saved here, as a step inside its epoch: the
        # epoch-end save that follows would store the loop as if the epoch's data had all run,
        # and the next run (more steps, same epochs) would skip the rest of that epoch
        last = 0 < trainer.max_steps <= step
        if every or (last and (n or self.every_n_epochs)):
            write_step_metrics_now(trainer)  # the step's row on disk before its checkpoint
            save(trainer, self.root, self.keep_last)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        n = self.every_n_epochs
        if n and (trainer.current_epoch + 1) % n == 0:
            name = checkpoint_name(trainer.global_step)
            if self.last_saved is not None and self.last_saved.name == name:
                return
            # a complete checkpoint of this very step is the one this run resumed from (no step
            # trained since): writing it again would store the loop as if the epoch had run here
            # too, and the next resume would skip an epoch nobody trained
            if is_complete(self.root / name):
                self.last_saved = self.root / name
                return
            # after the epoch's row (logged in the module's own on_train_epoch_end, which runs
            # after this hook) is on disk
            after_epoch_metrics_written(trainer, lambda: save(trainer, self.root, self.keep_last))
