"""The Lightning DataModule of every data kind: rank sharding, loaders and the resumable position.

Built by :func:`rocmtrain.data.build_datamodule`. ``setup()`` reads rank and world size from
``torch.distributed`` (after the strategy initialised the process group) unless they were given.

Data position (``state_dict``/``load_state_dict``, which Lightning calls when it saves/restores a
checkpoint): ``{"epoch": e, "batch": b}`` = batch ``b`` of epoch ``e`` is the next one to train on.
While a Trainer is fitting, the position is read from the trainer's own progress counters
(batches *processed*), so look-ahead of a prefetcher or a pipelined train loop does not skew
it; without a trainer it is the number of batches the loader has handed out (``num_workers=0``;
with workers, save the position yourself from your loop's step count and ``load_state_dict`` it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch.distributed as dist
from torch.utils.data import DataLoader

from rocmtrain.config.data import DataConfig
from rocmtrain.data.loader import BatchSource, ResumableBatches

SourceFactory = Callable[[str, int, int], BatchSource | None]
"""``factory(split, rank, world_size)`` -> this rank's source of ``split`` (``None``: no split)."""


class RecDataModule(pl.LightningDataModule):
    """DataModule yielding ``torchrec.datasets.utils.Batch`` (dense, KJT, labels) per rank."""

    def __init__(
        self,
        cfg: DataConfig,
        factory: SourceFactory,
        *,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self._factory = factory
        self._rank = rank
        self._world_size = world_size
        self.train_data: ResumableBatches | None = None
        self.val_data: ResumableBatches | None = None
        self._pending_state: dict[str, int] | None = None

    @property
    def rank(self) -> int:
        if self._rank is None:
            self._rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return self._rank

    @property
    def world_size(self) -> int:
        if self._world_size is None:
            initialised = dist.is_available() and dist.is_initialized()
            self._world_size = dist.get_world_size() if initialised else 1
        return self._world_size

    def setup(self, stage: str | None = None) -> None:
        """Build this rank's train and validation sources (once)."""
        if self.train_data is not None:
            return
        train = self._factory("train", self.rank, self.world_size)
        if train is None:
            raise RuntimeError("data factory returned no training data")
        self.train_data = ResumableBatches(train, epoch_fn=self._trainer_epoch)
        val = self._factory("val", self.rank, self.world_size)
        self.val_data = ResumableBatches(val) if val is not None else None
        if self._pending_state is not None:
            self.train_data.load_state_dict(self._pending_state)
            self._pending_state = None

    def _loader(self, data: ResumableBatches) -> DataLoader:
        return DataLoader(
            data,
            batch_size=None,  # items are whole batches
            num_workers=self.cfg.num_workers,
            pin_memory=self.cfg.pin_memory,
            persistent_workers=False,
        )

    def train_dataloader(self) -> DataLoader:
        self.setup()
        assert self.train_data is not None
        return self._loader(self.train_data)

    def val_dataloader(self) -> DataLoader | list:
        self.setup()
        return self._loader(self.val_data) if self.val_data is not None else []

    # ---- data position -------------------------------------------------------------------
    def _fitting_trainer(self) -> Any | None:
        trainer = getattr(self, "_trainer", None) or getattr(self, "trainer", None)
        if trainer is None or getattr(trainer.state, "fn", None) != "fit":
            return None
        return trainer

    def _trainer_epoch(self) -> int | None:
        trainer = self._fitting_trainer()
        return None if trainer is None else int(trainer.current_epoch)

    def state_dict(self) -> dict[str, int]:
        """The training data position ``{"epoch", "batch"}`` (see the module docstring)."""
        trainer = self._fitting_trainer()
        if trainer is not None:
            progress = trainer.fit_loop.epoch_loop.batch_progress.current
            return {"epoch": int(trainer.current_epoch), "batch": int(progress.processed)}
        if self.train_data is None:
            return dict(self._pending_state or {"epoch": 0, "batch": 0})
        return self.train_data.state_dict()

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Continue training at ``state_dict``'s position (before or after ``setup``)."""
        state = {"epoch": int(state_dict["epoch"]), "batch": int(state_dict["batch"])}
        if self.train_data is None:
            self._pending_state = state
        else:
            self.train_data.load_state_dict(state)
