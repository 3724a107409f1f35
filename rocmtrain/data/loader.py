"""Rank-sharded, resumable batch iteration shared by every data kind.

A *source* knows how many batches this rank has per epoch and builds batch ``k`` of epoch ``e``
deterministically (:class:`BatchSource`). :class:`PositionedLoader` iterates it epoch by epoch
and keeps the data position ``(epoch, batch)`` so a resumed run continues with exactly the
batches an uninterrupted run would have seen::

    loader = PositionedLoader(EpochBatches(source))
    it = iter(loader); next(it); next(it)        # two batches handed out (and consumed)
    state = loader.state_dict()                  # {"epoch": 0, "batch": 2}
    fresh = PositionedLoader(EpochBatches(source)); fresh.load_state_dict(state)
    next(iter(fresh))                            # == batch 2 of epoch 0

File rows are split into global rounds of ``world_size * batch_size`` rows; rank ``r`` takes the
``r``-th block of each round (:func:`rank_row_slices`), so shards are disjoint and, with
``drop_last=False``, complete.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchrec.datasets.utils import Batch


class BatchSource(Protocol):
    """Deterministic batches of one rank."""

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        ...

    def batch(self, epoch: int, index: int) -> Batch:
        """Batch ``index`` (0-based) of ``epoch`` on this rank."""
        ...


class EpochBatches(IterableDataset):
    """One epoch of a :class:`BatchSource`, from batch ``start`` (set ``epoch``/``start`` first).

    With DataLoader workers, worker ``w`` of ``n`` builds batches ``start+w, start+w+n, ...``;
    the DataLoader returns them in order.
    """

    def __init__(self, source: BatchSource) -> None:
        self.source = source
        self.epoch = 0
        self.start = 0

    def __len__(self) -> int:
        return len(self.source)

    def __iter__(self) -> Iterator[Batch]:
        worker = get_worker_info()
        step, offset = (1, 0) if worker is None else (worker.num_workers, worker.id)
        for index in range(self.start + offset, len(self.source), step):
            yield self.source.batch(self.epoch, index)


class PositionedLoader(DataLoader):
    """DataLoader over :class:`EpochBatches` that knows its data position.

    ``iter()`` continues at the position: the rest of an unfinished epoch, else the next epoch
    from batch 0. The position counts batches *consumed*: each batch handed out is queued, and
    :meth:`mark_consumed` (called by the DataModule's ``on_before_batch_transfer``, i.e. right
    before a training step) pops it, so batches a prefetcher fetched ahead do not count. Without
    such calls every batch handed out counts as consumed.

    ``state_dict()`` = ``{"epoch": e, "batch": b}`` (batch ``b`` of epoch ``e`` comes next);
    Lightning saves and restores it with its fit loop (the loader is "stateful" to Lightning).
    """

    def __init__(self, dataset: EpochBatches, **kwargs: Any) -> None:
        super().__init__(dataset, batch_size=None, **kwargs)
        self._position = (0, 0)
        self._handed_out: deque[tuple[int, int]] = deque(maxlen=1024)
        self._tracked = False

    def mark_consumed(self) -> None:
        """The oldest batch handed out is now being trained on."""
        if self._handed_out:
            self._tracked = True
            epoch, index = self._handed_out.popleft()
            self._position = (epoch, index + 1)

    def state_dict(self) -> dict[str, int]:
        epoch, batch = self._position
        return {"epoch": epoch, "batch": batch}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self._position = (int(state_dict["epoch"]), int(state_dict["batch"]))
        self._handed_out.clear()

    def __iter__(self) -> Iterator[Batch]:
        epoch, start = self._position
        if start >= len(self.dataset):  # that epoch is done: the next one, from its start
            epoch, start = epoch + 1, 0
        self._position = (epoch, start)
        self._handed_out.clear()
        self.dataset.epoch, self.dataset.start = epoch, start
        return self._generate(epoch, start)

    def _generate(self, epoch: int, start: int) -> Iterator[Batch]:
        for index, batch in enumerate(super().__iter__(), start=start):
            self._handed_out.append((epoch, index))
            if not self._tracked:
                self._position = (epoch, index + 1)
            yield batch


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
