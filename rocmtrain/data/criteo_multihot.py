"""``data.kind=criteo_multihot``: MLPerf's materialized multi-hot Criteo, memory-mapped.

The files (one set per day, :mod:`rocmtrain.data.multihot_files`)::

    day_N_dense.npy   day_N_labels.npy   day_N_sparse_multi_hot.npz = {0.npy .. 25.npy}

Splits: training reads ``data.days`` of ``data.path`` (all days found when unset). Validation
reads every day of ``data.val_path``, or, without it, the last of ``data.days`` is split as the
MLPerf reference does: its first half (``ceil(rows/2)``) validates, its second half is MLPerf's
test set and is not read; training then reads the other days.

Ids: each feature's ids are taken ``% rows[f]`` of its table (the reference's ``hashes``); a
negative id is an error naming the file, row and feature. Hot sizes ``L[f]`` come from the files
and must equal ``model.multi_hot_sizes`` when that is set.

Order and sharding: an epoch's row order is a seeded permutation made of windows of
``data.shuffle_window_rows`` rows: the windows come in a shuffled order and the rows of each
window in a shuffled order, so a rank's reads stay inside one window (page-cache friendly) and no
permutation of the whole split is ever held. The order is cut into rounds of ``W*B`` rows and
rank ``r`` takes the ``r``-th ``B`` of each (:func:`~rocmtrain.data.loader.rank_row_slices`),
as for ``criteo_npy``: every row once per epoch, every rank the same number of batches. Batch
``k`` of epoch ``e`` is a pure function of ``(seed, e, k)``, so a resumed run continues at the
exact next sample (:class:`~rocmtrain.data.loader.PositionedLoader`).

Batch building: one int64 values buffer is filled feature by feature straight from the maps (a
row gather, the ``%``, the cast, in one call per feature and day); lengths are the constant hot
sizes, so the KeyedJaggedTensor is built without reading anything back. A GPU run without loader
processes reads with threads instead (``data.read_threads``,
:mod:`rocmtrain.data.multihot_reader`): the files' int32 ids go into pinned buffers and are
widened and taken ``%`` on the GPU, after a copy of half the bytes.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from torchrec.datasets.utils import Batch

from rocmtrain.config.data import DataConfig, DataConfigError
from rocmtrain.data.batch import generator, make_batch_from_values
from rocmtrain.data.loader import LaidOutSource, RowLayout
from rocmtrain.data.multihot_files import (
    MultiHotDay,
    check_features,
    multihot_days,
    open_day,
)
from rocmtrain.data.multihot_reader import ThreadedReader, read_threads


class MultiHotRows:
    """The rows of one or more days, addressed by global row number (days in order)."""

    def __init__(self, days: list[MultiHotDay], *, mmap: bool) -> None:
        self.days = days
        self.mmap = mmap
        self.starts = np.cumsum([0] + [d.rows for d in days])
        self._arrays: list[tuple[np.ndarray, np.ndarray, list[np.ndarray]]] | None = None

    def __getstate__(self) -> dict:
        # a DataLoader worker started by spawn maps the files itself instead of receiving copies
        return {**self.__dict__, "_arrays": None if self.mmap else self._arrays}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def arrays(self) -> list[tuple[torch.Tensor, np.ndarray, list[torch.Tensor]]]:
        """Per day ``(dense, labels, [sparse per feature])``, mapped on first use."""
        if self._arrays is None:
            with warnings.catch_warnings():
                # read-only maps (a shared mapping costs no memory commitment, unlike a
                # copy-on-write one): torch warns that it could write to them; it never does
                warnings.filterwarnings("ignore", message=".*NumPy array is not writable.*")
                self._arrays = [
                    (
                        torch.from_numpy(d.dense.open(mmap=self.mmap)),
                        d.labels.open(mmap=self.mmap),
                        [torch.from_numpy(m.open(mmap=self.mmap)) for m in d.sparse],
                    )
                    for d in self.days
                ]
        return self._arrays

    def segments(self, rows: np.ndarray) -> list[tuple[int, int, int, slice | torch.Tensor]]:
        """``(day index, out_lo, out_hi, local rows)`` runs of sorted global ``rows``; a run of
        consecutive rows is a slice (read without a gather)."""
        cuts = np.searchsorted(rows, self.starts[1:-1], side="left")
        bounds = [0, *cuts.tolist(), len(rows)]
        runs = []
        for part, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            if hi <= lo:
                continue
            local = rows[lo:hi] - self.starts[part]
            if int(local[-1]) - int(local[0]) == hi - lo - 1:
                runs.append((part, lo, hi, slice(int(local[0]), int(local[-1]) + 1)))
            else:
                runs.append((part, lo, hi, torch.from_numpy(local)))
        return runs

    def read(
        self,
        rows: np.ndarray,
        *,
        table_rows: list[int],
        dense: torch.Tensor,
        labels: torch.Tensor,
        values: list[torch.Tensor],
    ) -> None:
        """Fill ``dense [B, D]``, ``labels [B]`` and each feature's ``values[f] [B, L[f]]``
        (int64, ids ``% table_rows[f]``) with the sorted global ``rows``."""
        for part, lo, hi, local in self.segments(rows):
            day_dense, day_labels, day_sparse = self.arrays()[part]
            dense[lo:hi] = _take(day_dense, local)
            index = local if isinstance(local, slice) else local.numpy()
            labels[lo:hi] = torch.from_numpy(np.asarray(day_labels[index]).reshape(-1))
            for f, (member, out) in enumerate(zip(day_sparse, values, strict=True)):
                ids = _take(member, local)
                low, high = torch.aminmax(ids) if ids.numel() else (0, 0)
                if low < 0:
                    self._negative(part, f, ids, local)
                if high < table_rows[f]:  # already table rows: a plain widening copy
                    out[lo:hi] = ids
                else:  # the int32 remainder, written straight into the int64 buffer
                    torch.remainder(ids, table_rows[f], out=out[lo:hi])

    def read_raw(
        self,
        rows: np.ndarray,
        *,
        dense: np.ndarray,
        labels: np.ndarray,
        values: list[np.ndarray],
    ) -> None:
        """Like :meth:`read`, into numpy views of host buffers, keeping the files' int32 ids
        (no ``%``: :class:`~rocmtrain.data.multihot_reader.HostBatch` takes it on the device).
        numpy only: it releases the GIL and runs single-threaded (the reader threads' own)."""
        for part, lo, hi, local in self.segments(rows):
            day_dense, day_labels, day_sparse = self.arrays()[part]
            index = local if isinstance(local, slice) else local.numpy()
            _take_into(day_dense.numpy(), index, dense[lo:hi])
            labels[lo:hi] = np.asarray(day_labels[index]).reshape(-1)
            for f, (member, out) in enumerate(zip(day_sparse, values, strict=True)):
                ids = out[lo:hi]
                _take_into(member.numpy(), index, ids)
                if ids.size and ids.min() < 0:
                    self._negative(part, f, torch.from_numpy(ids), local)

    def _negative(self, part: int, feature: int, ids: torch.Tensor, local) -> None:
        sample, col = (int(i) for i in torch.nonzero(ids < 0)[0])
        row = (local.start + sample) if isinstance(local, slice) else int(local[sample])
        ref = self.days[part].sparse[feature]
        raise DataConfigError(
            f"data: {ref.file} {ref.label} row {row} holds id {int(ids[sample, col])}; ids are "
            "never negative (an int32 overflow?): write the file again with ids in [0, 2**31)"
        )


def _take(array: torch.Tensor, local: slice | torch.Tensor) -> torch.Tensor:
    """Rows ``local`` of ``array``: a view for a slice, else a gather."""
    return array[local] if isinstance(local, slice) else torch.index_select(array, 0, local)


def _take_into(array: np.ndarray, index: slice | np.ndarray, out: np.ndarray) -> None:
    """``out[:] = array[index]`` without a temporary. Rows are gathered as raw bytes: an
    ``.npz`` member's data start at any byte offset, and ``numpy.take`` first copies a whole
    unaligned array to aligned memory (the entire member, per call); bytes have no alignment.
    ``mode="clip"``: ``"raise"`` would gather into a copy first (rows are in range anyway)."""
    if isinstance(index, slice):
        out[...] = array[index]
    elif array.flags.c_contiguous and out.flags.c_contiguous and array.ndim == 2:
        np.take(array.view(np.uint8), index, axis=0, out=out.view(np.uint8), mode="clip")
    else:
        np.take(array, index, axis=0, out=out, mode="clip")


class WindowedOrder:
    """A seeded permutation of ``range(num_rows)`` built from windows of ``window_rows`` rows.

    Epoch ``e``: the windows in a permuted order, each window's rows permuted; the permutations
    come from ``generator(*seed_parts, e[, w])``, identical on every rank. Only the windows a
    batch touches are materialised (two kept per process).
    """

    def __init__(self, num_rows: int, *, window_rows: int, seed_parts: tuple[int, ...]) -> None:
        self.num_rows = num_rows
        self.window_rows = max(1, min(window_rows, num_rows))
        self.num_windows = math.ceil(num_rows / self.window_rows)
        self.seed_parts = seed_parts
        self._epoch: tuple[int, np.ndarray, np.ndarray] | None = None
        self._windows: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    def _window_size(self, w: np.ndarray | int):
        last = self.num_rows - (self.num_windows - 1) * self.window_rows
        return np.where(np.asarray(w) == self.num_windows - 1, last, self.window_rows)

    def _layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(window order, end position of each window in that order)`` of ``epoch``."""
        if self._epoch is None or self._epoch[0] != epoch:
            gen = generator(*self.seed_parts, epoch)
            order = torch.randperm(self.num_windows, generator=gen).numpy()
            self._epoch = (epoch, order, np.cumsum(self._window_size(order)))
        return self._epoch[1], self._epoch[2]

    def _window(self, epoch: int, w: int) -> np.ndarray:
        key = (epoch, w)
        if key not in self._windows:
            gen = generator(*self.seed_parts, epoch, w)
            size = int(self._window_size(w))
            self._windows[key] = torch.randperm(size, generator=gen).numpy() + w * self.window_rows
            while len(self._windows) > 2:
                self._windows.popitem(last=False)
        return self._windows[key]

    def rows(self, epoch: int, lo: int, hi: int) -> np.ndarray:
        """Rows at positions ``[lo, hi)`` of ``epoch``'s order."""
        order, ends = self._layout(epoch)
        parts = []
        k = int(np.searchsorted(ends, lo, side="right"))
        while lo < hi:
            start = int(ends[k - 1]) if k else 0
            end = min(hi, int(ends[k]))
            parts.append(self._window(epoch, int(order[k]))[lo - start : end - start])
            lo, k = end, k + 1
        return np.concatenate(parts) if len(parts) != 1 else parts[0]


class MultiHotSource(LaidOutSource):
    """This rank's batches of a row range of :class:`MultiHotRows` (a ``BatchSource``)."""

    def __init__(
        self,
        rows: MultiHotRows,
        *,
        row_range: tuple[int, int],
        table_rows: list[int],
        hot_sizes: list[int],
        batch_size: int,
        rank: int,
        world_size: int,
        shuffle: bool,
        window_rows: int,
        drop_last: bool,
        seed: int,
        split: str,
        read_threads: int = 0,
        pin: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        self.rows = rows
        self.start, end = row_range
        self.num_rows = end - self.start
        self.table_rows = list(table_rows)
        self.hot_sizes = list(hot_sizes)
        self.num_dense = rows.days[0].dense.shape[1]
        self.world_size = world_size
        self.layout = RowLayout(
            self.num_rows, batch_size=batch_size, rank=rank, world_size=world_size,
            drop_last=drop_last,
        )  # fmt: skip
        if not self.layout.base:
            fix = "lower data.batch_size or give more rows" + (
                ", or set data.drop_last=false" if drop_last else ""
            )
            raise DataConfigError(
                f"data.path: the {split} split has {self.num_rows} rows, too few for one batch "
                f"of data.batch_size={batch_size} on each of {world_size} ranks; {fix}"
            )
        split_code = 1 if split == "train" else 2
        self.order = (
            WindowedOrder(self.num_rows, window_rows=window_rows, seed_parts=(seed, split_code))
            if shuffle
            else None
        )

        self.device = torch.device(device)
        """Where batches are finished (int64 ids ``% rows``): the training device when reader
        threads hand out :class:`~rocmtrain.data.multihot_reader.HostBatch` es, else the host."""
        self.reader = (
            ThreadedReader(self, threads=read_threads, pin=pin) if read_threads > 0 else None
        )

    def positions(self, epoch: int, index: int) -> np.ndarray:
        """Global row numbers of batch ``index`` of ``epoch`` on this rank, sorted (the order
        inside a batch does not matter to training; sorted reads stay in file order)."""
        lo, hi = self.layout.slices(epoch)[index]
        if self.order is None:
            return np.arange(lo, hi, dtype=np.int64) + self.start
        return np.sort(self.order.rows(epoch, lo, hi)) + self.start

    def batch(self, epoch: int, index: int) -> Batch:
        if self.reader is None:
            return self.batch_built(epoch, index)
        host = self.reader.batch(epoch, index)
        # a GPU run's batch is finished on the GPU by .to(); a CPU run's here
        return host if self.device.type != "cpu" else host.to(self.device)

    def batch_built(self, epoch: int, index: int) -> Batch:
        """Batch ``index`` of ``epoch`` built in this process (or a loader process): int64 ids,
        taken ``% rows``, in freshly allocated host memory."""
        rows = self.positions(epoch, index)
        size = len(rows)
        dense = torch.empty(size, self.num_dense, dtype=torch.float32)
        labels = torch.empty(size, dtype=torch.float32)
        values = torch.empty(size * sum(self.hot_sizes), dtype=torch.int64)
        views = [
            v.view(size, hot)
            for v, hot in zip(
                values.split([size * h for h in self.hot_sizes]), self.hot_sizes, strict=True
            )
        ]
        self.rows.read(rows, table_rows=self.table_rows, dense=dense, labels=labels, values=views)
        return make_batch_from_values(dense, values, self.hot_sizes, labels)


def _open_days(cfg: DataConfig, field: str, days: list[int] | None, num_dense: int):
    path = Path(getattr(cfg, field)).expanduser()
    chosen = multihot_days(path, days, field=field)
    return [open_day(path, d, field=field, num_dense=num_dense) for d in chosen]


def multihot_factory(
    cfg: DataConfig, *, rows: list[int], multi_hot: list[int] | None, num_dense: int, seed: int
):
    """``factory(split, rank, world_size, device)`` for
    :class:`~rocmtrain.data.datamodule.RecDataModule`.

    ``multi_hot``: ``model.multi_hot_sizes`` (``None``: take the files' hot sizes)."""
    days = _open_days(cfg, "path", cfg.days, num_dense)
    if cfg.val_path is not None:
        train_days, val_days = days, _open_days(cfg, "val_path", None, num_dense)
        val_rows = sum(d.rows for d in val_days)
    elif len(days) < 2:
        raise DataConfigError(
            f"data.days={[d.day for d in days]} is invalid: without data.val_path the last day is "
            "split into validation and test (MLPerf), so training needs at least one more day; "
            "give two or more days or set data.val_path"
        )
    else:
        train_days, val_days = days[:-1], days[-1:]
        val_rows = math.ceil(val_days[0].rows / 2)  # MLPerf: first half validation
    hot = check_features(train_days + val_days, table_rows=rows, hot_sizes=multi_hot, field="path")
    train = MultiHotRows(train_days, mmap=cfg.mmap)
    val = MultiHotRows(val_days, mmap=cfg.mmap)
    train_end = len(train) if cfg.max_rows is None else min(len(train), cfg.max_rows)

    def factory(
        split: str, rank: int, world_size: int, device: torch.device | None = None
    ) -> MultiHotSource | None:
        is_train = split == "train"
        if not is_train and val_rows == 0:
            return None
        train_device = torch.device(device if device is not None else "cpu")
        threads = read_threads(cfg, train_device, world_size)
        return MultiHotSource(
            train if is_train else val,
            row_range=(0, train_end if is_train else val_rows),
            table_rows=rows,
            hot_sizes=hot,
            batch_size=cfg.batch_size,
            rank=rank,
            world_size=world_size,
            shuffle=cfg.shuffle and is_train,
            window_rows=cfg.shuffle_window_rows,
            drop_last=cfg.drop_last and is_train,
            seed=seed,
            split=split,
            read_threads=threads,
            pin=bool(threads)
            and train_device.type == "cuda"
            and torch.cuda.is_available()
            and cfg.pin_memory is not False,
            device=train_device if threads else "cpu",
        )

    return factory
