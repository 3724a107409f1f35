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
    A source that can resume on another world size (:func:`resumable`) adds ``world_size`` and
    ``samples`` (the global count of samples of epoch ``e`` consumed by all ranks) and what it
    needs besides; :meth:`load_state_dict` of another world size continues at that sample.
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

    def state_dict(self) -> dict[str, Any]:
        epoch, batch = self._position
        return position_state(self.dataset.source, epoch, batch)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._position = resume_position(self.dataset.source, state_dict)
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


# ---- resuming on another world size ----------------------------------------------------------
# A checkpoint's data position is a batch index *and* the global count of samples the epoch had
# consumed (every rank's batches before that index). The batch index alone only means something
# on the world size that wrote it; the count does not: on another world size the rest of the
# epoch, rows [samples, end) of its order, is split over the new ranks (see :class:`RowLayout`).


def _round_ends(num_rows: int, *, batch_size: int, world_size: int, drop_last: bool) -> list[int]:
    """End position (into the epoch order) of each round: the rows consumed once every rank has
    trained that many batches (the last rank's block ends each round)."""
    last = rank_row_slices(
        num_rows, batch_size=batch_size, rank=world_size - 1, world_size=world_size,
        drop_last=drop_last,
    )  # fmt: skip
    return [hi for _, hi in last]


def tail_slices(
    num_rows: int,
    start: int,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    drop_last: bool,
    max_batches: int,
) -> tuple[list[tuple[int, int]], list[int]]:
    """This rank's slices of rows ``[start, num_rows)`` of an epoch's order, and each round's end.

    Split as :func:`rank_row_slices` splits a whole epoch (so fewer rows than ranks are left
    out). When that takes more than ``max_batches`` batches (the rest of an epoch of more ranks,
    resumed on fewer, can be longer than a whole epoch here) the batches grow just enough to fit
    and keep every row: dropping them would lose samples the epoch began with.
    """
    remaining = max(0, num_rows - start)
    if max_batches <= 0 or remaining == 0:
        return [], []
    kw: dict[str, Any] = dict(batch_size=batch_size, world_size=world_size, drop_last=drop_last)
    mine = rank_row_slices(remaining, rank=rank, **kw)
    if len(mine) > max_batches:  # ceil: max_batches rounds hold every row
        grown = -(-remaining // (world_size * max_batches))
        kw = dict(batch_size=grown, world_size=world_size, drop_last=False)
        mine = rank_row_slices(remaining, rank=rank, **kw)
    ends = _round_ends(remaining, **kw)
    return [(lo + start, hi + start) for lo, hi in mine], [e + start for e in ends]


class RowLayout:
    """Which positions of an epoch's row order each batch of this rank reads.

    Normally :func:`rank_row_slices`. An epoch resumed at global sample ``samples`` from a
    checkpoint of another world size (:meth:`resume`) keeps its batch count: its first batches
    are the ones already trained (never read again), the rest split rows ``[samples, end)``.
    """

    def __init__(
        self, num_rows: int, *, batch_size: int, rank: int, world_size: int, drop_last: bool
    ) -> None:
        self.num_rows = num_rows
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        kw = dict(batch_size=batch_size, world_size=world_size, drop_last=drop_last)
        self.base = rank_row_slices(num_rows, rank=rank, **kw)
        self._ends = _round_ends(num_rows, **kw)
        self._resumed: tuple[int, int, list[tuple[int, int]], list[int]] | None = None

    def __len__(self) -> int:
        return len(self.base)

    def slices(self, epoch: int) -> list[tuple[int, int]]:
        """Per batch index of ``epoch``: ``(start, end)`` positions into its order."""
        if self._resumed is not None and self._resumed[0] == epoch:
            return self._resumed[2]
        return self.base

    def samples_before(self, epoch: int, batch: int) -> int:
        """Rows of ``epoch`` consumed once every rank has trained its batches ``[0, batch)``."""
        if self._resumed is not None and self._resumed[0] == epoch:
            _, start, slices, ends = self._resumed
            first = len(slices) - len(ends)
            return start if batch <= first else ends[min(batch, len(slices)) - first - 1]
        if batch <= 0 or not self._ends:
            return 0
        return self._ends[min(batch, len(self._ends)) - 1]

    def resume(self, epoch: int, samples: int, num_rows: int | None = None) -> int:
        """Lay ``epoch`` out from global sample ``samples`` on; return its first batch index.

        ``num_rows``: the epoch's rows when they differ from :attr:`num_rows` (synthetic data,
        whose epoch size is set per rank, keeps the size of the world that began the epoch).
        """
        total = self.num_rows if num_rows is None else num_rows
        tail, ends = tail_slices(
            total, samples, batch_size=self.batch_size, rank=self.rank,
            world_size=self.world_size, drop_last=self.drop_last, max_batches=len(self.base),
        )  # fmt: skip
        first = len(self.base) - len(tail)
        self._resumed = (epoch, samples, [(samples, samples)] * first + tail, ends)
        return first


class LaidOutSource:
    """The epoch bookkeeping of a batch source that reads rows by a :class:`RowLayout`
    (``self.layout``): its length and the resume protocol of :class:`PositionedLoader`. The
    row order of an epoch does not depend on the world size, so a resumed epoch is the rest of
    that order from the saved global sample count."""

    layout: RowLayout

    def __len__(self) -> int:
        return len(self.layout)

    def samples_before(self, epoch: int, batch: int) -> int:
        return self.layout.samples_before(epoch, batch)

    def resumed(self, epoch: int) -> dict[str, bool]:
        return {"resumed": self.layout.slices(epoch) is not self.layout.base}

    def resume(self, epoch: int, samples: int, state: dict) -> int:
        return self.layout.resume(epoch, samples)


def resumable(source: object) -> bool:
    """Whether ``source`` can continue an epoch begun on another world size."""
    return all(hasattr(source, a) for a in ("world_size", "samples_before", "resume", "resumed"))


def position_state(source: BatchSource, epoch: int, batch: int) -> dict[str, Any]:
    """The data position ``{"epoch", "batch"}``, with ``world_size``, ``batches`` (this rank's
    batches in an epoch), ``samples`` and the source's resume details when it is resumable."""
    state: dict[str, Any] = {"epoch": epoch, "batch": batch}
    if resumable(source):
        state.update(
            world_size=source.world_size,  # type: ignore[attr-defined]
            batches=len(source),
            samples=source.samples_before(epoch, batch),  # type: ignore[attr-defined]
            **source.resumed(epoch),  # type: ignore[attr-defined]
        )
    return state


def resume_position(source: BatchSource, state: dict[str, Any]) -> tuple[int, int]:
    """``(epoch, batch)`` at which ``source`` continues from a saved position ``state``.

    The saved batch index is kept when the world size is the same and the epoch was laid out
    the usual way. Otherwise the epoch continues at the saved global sample count, the rest of
    it split over this world size (:meth:`RowLayout.resume`); a finished epoch continues with
    the next one. Positions saved without a sample count keep their batch index.
    """
    epoch, batch = int(state["epoch"]), int(state["batch"])
    if not resumable(source) or "samples" not in state:
        return epoch, batch
    same = int(state["world_size"]) == source.world_size  # type: ignore[attr-defined]
    if same and not state.get("resumed", False):
        return epoch, batch
    if batch >= int(state["batches"]):  # the epoch was over: the next begins at batch 0
        return epoch, len(source)
    first = source.resume(epoch, int(state["samples"]), state)  # type: ignore[attr-defined]
    return epoch, first
