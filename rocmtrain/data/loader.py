"""Rank-sharded, resumable batch iteration shared by every data kind.

A *source* knows how many batches this rank has per epoch and builds batch ``k`` of epoch ``e``
deterministically (:class:`BatchSource`). :class:`ResumableBatches` iterates a source and keeps
the data position ``(epoch, batch)`` so a resumed run continues with exactly the batches an
uninterrupted run would have seen::

    data = ResumableBatches(source)
    it = iter(data); next(it); next(it)          # two batches handed out
    state = data.state_dict()                    # {"epoch": 0, "batch": 2}
    fresh = ResumableBatches(source); fresh.load_state_dict(state)
    next(iter(fresh))                            # == batch 2 of epoch 0

File rows are split into global rounds of ``world_size * batch_size`` rows; rank ``r`` takes the
``r``-th block of each round (:func:`rank_row_slices`), so shards are disjoint and, with
``drop_last=False``, complete.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch.utils.data import IterableDataset, get_worker_info
from torchrec.datasets.utils import Batch


class BatchSource(Protocol):
    """Deterministic batches of one rank."""

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        ...

    def batch(self, epoch: int, index: int) -> Batch:
        """Batch ``index`` (0-based) of ``epoch`` on this rank."""
        ...


class ResumableBatches(IterableDataset):
    """Iterable over a :class:`BatchSource` with a saveable position.

    Each ``iter()`` runs one epoch: from the restored position if one was loaded for that epoch,
    else from batch 0. The epoch counter advances when an epoch is exhausted; ``set_epoch`` (or
    ``epoch_fn``, e.g. the trainer's ``current_epoch``) overrides it. With DataLoader workers,
    worker ``w`` builds batches ``w, w+n, ...`` and the DataLoader returns them in order.
    """

    def __init__(self, source: BatchSource, *, epoch_fn=None) -> None:
        self.source = source
        self.epoch = 0
        self.batch_in_epoch = 0
        self._resume: tuple[int, int] | None = None
        self._epoch_fn = epoch_fn

    def __len__(self) -> int:
        return len(self.source)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "batch"}``: batches of ``epoch`` handed out so far (main-process loading)."""
        return {"epoch": self.epoch, "batch": self.batch_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue at batch ``state["batch"]`` of ``state["epoch"]`` on the next ``iter()``."""
        epoch, batch = int(state["epoch"]), int(state["batch"])
        if batch >= len(self.source):  # saved at the end of an epoch: next epoch from its start
            epoch, batch = epoch + 1, 0
        self.epoch, self.batch_in_epoch = epoch, batch
        self._resume = (epoch, batch)

    def _current_epoch(self) -> int:
        if self._epoch_fn is not None:
            epoch = self._epoch_fn()
            if epoch is not None:
                return int(epoch)
        return self.epoch

    def __iter__(self):
        epoch = self._current_epoch()
        start = 0
        if self._resume is not None and self._resume[0] == epoch:
            start = self._resume[1]
        self._resume = None
        self.epoch, self.batch_in_epoch = epoch, start
        worker = get_worker_info()
        step, offset = (1, 0) if worker is None else (worker.num_workers, worker.id)
        for index in range(start + offset, len(self.source), step):
            batch = self.source.batch(epoch, index)
            self.batch_in_epoch = index + 1  # counts batches handed out (main-process loading)
            yield batch
        self.epoch, self.batch_in_epoch = epoch + 1, 0


def rank_row_slices(
    num_rows: int, *, batch_size: int, rank: int, world_size: int, drop_last: bool
) -> list[tuple[int, int]]:
    """Half-open ``(start, end)`` positions (into the epoch's row order) of this rank's batches.

    Round ``g`` covers positions ``[g*W*B, (g+1)*W*B)``; rank ``r`` takes ``B`` rows at offset
    ``r*B``. Rows left over (``R < W*B``) are dropped with ``drop_last``; otherwise they form a
    last round split as evenly as possible, merged into the previous round when ``R < W``.
    Every rank gets the same number of batches (collectives stay in step).
    """
    round_rows = world_size * batch_size
    full_rounds, remainder = divmod(num_rows, round_rows)
    slices = [
        (g * round_rows + rank * batch_size, g * round_rows + (rank + 1) * batch_size)
        for g in range(full_rounds)
    ]
    if drop_last or remainder == 0:
        return slices
    if remainder >= world_size:
        first, tail_rows = full_rounds * round_rows, remainder
    elif full_rounds > 0:
        slices.pop()
        first, tail_rows = (full_rounds - 1) * round_rows, round_rows + remainder
    else:
        return slices  # fewer rows than ranks: nothing every rank can share; caller reports it
    base, extra = divmod(tail_rows, world_size)
    begin = first + rank * base + min(rank, extra)
    slices.append((begin, begin + base + (1 if rank < extra else 0)))
    return slices


def epoch_order(num_rows: int, *, shuffle: bool, seed_gen: torch.Generator | None) -> torch.Tensor:
    """Row order of one epoch: ``arange`` or a seeded permutation (identical on every rank)."""
    if not shuffle:
        return torch.arange(num_rows)
    return torch.randperm(num_rows, generator=seed_gen)
