"""The Lightning DataModule of every data kind: rank sharding, loaders and the resumable position.

Built by :func:`rocmtrain.data.build_datamodule`. ``setup()`` reads rank and world size from
``torch.distributed`` (after the strategy initialised the process group) unless they were given.

Data position (``state_dict``/``load_state_dict``): ``{"epoch": e, "batch": b}`` = batch ``b`` of
epoch ``e`` is the next one to train on, with ``world_size`` and ``samples`` (the global count of
samples of epoch ``e`` trained by all ranks), so that a run on another world size continues at
the same sample (:func:`rocmtrain.data.loader.resume_position`). Lightning stores it twice in a
checkpoint (the datamodule's entry and the fit loop's stateful-loader entry; both are the same)
and restores it on ``fit(ckpt_path=...)``. A custom checkpoint saves ``dm.state_dict()`` and calls
``dm.load_state_dict(...)`` before training resumes (before or after ``setup``).

Consumption is counted in ``on_before_batch_transfer`` (Lightning calls it for each training
batch right before its step), so batches a prefetcher or a pipelined loop fetched ahead are not
counted. Batches pulled without that hook (``dataloader_iter`` training steps, plain loops)
count when they are handed out, unless the loop calls :meth:`RecDataModule.mark_consumed` per
batch it trains on (do that in a pipelined loop that fetches ahead).
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from rocmtrain.config.data import DataConfig, auto_num_workers
from rocmtrain.data.loader import BatchSource, EpochBatches, PositionedLoader

SourceFactory = Any
"""``factory(split, rank, world_size, device)`` -> this rank's :class:`BatchSource` of ``split`` or
None; ``device`` is the training device (a source may build its batches there)."""


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
        self.train_source: BatchSource | None = None
        self.val_source: BatchSource | None = None
        self._train_loader: PositionedLoader | None = None
        self._pending_state: dict[str, Any] | None = None

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
        if self.train_source is not None:
            return
        device = self.train_device
        self.train_source = self._factory("train", self.rank, self.world_size, device)
        self.val_source = self._factory("val", self.rank, self.world_size, device)

    @property
    def train_device(self) -> torch.device:
        """The device the trainer trains on (the CPU before a trainer is attached)."""
        trainer = self.trainer
        return trainer.strategy.root_device if trainer is not None else torch.device("cpu")

    def _loader_kwargs(self) -> dict[str, Any]:
        """Workers and pinning: as set, or chosen from the training device and the host."""
        gpu = self.train_device.type != "cpu"
        on_device = getattr(self.train_source, "device", torch.device("cpu")).type != "cpu"
        workers = self.cfg.num_workers
        if workers is None:
            ranks_on_node = self.trainer.num_devices if self.trainer is not None else 1
            workers = auto_num_workers(ranks_on_node) if gpu and not on_device else 0
        pin = self.cfg.pin_memory if self.cfg.pin_memory is not None else gpu
        # batches made on the device need no pinning; cached ones were pinned once by the source
        cached = self.cfg.kind == "synthetic" and self.cfg.cache_batches
        return {
            "num_workers": workers,
            "pin_memory": bool(pin) and not on_device and not cached,
            # every new iterator draws a base seed from its loader's generator, by default the
            # global torch RNG; a resumed run creates its iterator after the checkpoint's RNG
            # state is restored, which would leave the training RNG (dropout, a user's
            # torch.rand) one draw away from the uninterrupted run's
            "generator": torch.Generator(),
        }

    def train_dataloader(self) -> PositionedLoader:
        """The training loader (one per datamodule: it carries the data position)."""
        self.setup()
        if self._train_loader is None:
            assert self.train_source is not None
            self._train_loader = PositionedLoader(
                EpochBatches(self.train_source), **self._loader_kwargs()
            )
            if self._pending_state is not None:
                self._train_loader.load_state_dict(self._pending_state)
                self._pending_state = None
        return self._train_loader

    def val_dataloader(self) -> DataLoader | list:
        """Validation batches (fixed order; empty list when there is no validation split)."""
        self.setup()
        if self.val_source is None:
            return []
        return DataLoader(EpochBatches(self.val_source), batch_size=None, **self._loader_kwargs())

    def mark_consumed(self) -> None:
        """Count the oldest training batch handed out as trained on (called per training batch by
        ``on_before_batch_transfer``; a pipelined loop that pulls batches itself calls it once per
        batch it trains on, so its look-ahead is not saved as consumed)."""
        if self._train_loader is not None:
            self._train_loader.mark_consumed()

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self.trainer
        if trainer is not None and trainer.training:
            self.mark_consumed()
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The training data position ``{"epoch", "batch", ...}`` (see the module docstring)."""
        if self._train_loader is not None:
            return self._train_loader.state_dict()
        return dict(self._pending_state or {"epoch": 0, "batch": 0})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue training at ``state_dict``'s position (saved on any world size: see
        :func:`rocmtrain.data.loader.resume_position`)."""
        state = dict(state_dict)
        if self._train_loader is None:
            self._pending_state = state
        else:
            self._train_loader.load_state_dict(state)

    def resume_batch(self, state_dict: dict[str, Any]) -> tuple[int, int]:
        """``(epoch, batch)`` at which the training loader continues from ``state_dict`` (the
        loader is built, and set to it, when needed)."""
        loader = self.train_dataloader()
        loader.load_state_dict(state_dict)
        return loader.state_dict()["epoch"], loader.state_dict()["batch"]
