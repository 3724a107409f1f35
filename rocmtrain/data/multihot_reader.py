"""``criteo_multihot`` batches read by threads of the training process (``data.read_threads``).

The batch-building path (:meth:`MultiHotSource.batch_built`) makes an int64 values buffer in a
loader process; on a GPU run it then travels worker -> shared memory -> pinned memory (the
DataLoader's pin thread) -> device, three host copies of ``B x sum(L)`` int64 ids per batch,
which one pin thread cannot sustain at MLPerf sizes. This path instead:

* reads each batch's rows straight from the memory maps into one set of host buffers (pinned on
  a GPU run) with a pool of threads: the batch is cut into row chunks, one task per chunk, and
  the next batches are submitted while the current one is finished (``numpy.take`` of each row's
  bytes releases the GIL and, unlike torch ops called from extra threads, starts no OpenMP team
  per thread; ``_take_into`` in ``criteo_multihot.py`` says why bytes);
* keeps the files' int32 ids (half the bytes of int64) through the host and the host-to-device
  copy: :class:`HostBatch` ``.to(device)`` copies them, then widens to int64 and takes
  ``% rows[f]`` on that device (the input pipeline calls it on its copy stream).

Pinned buffers come from PyTorch's caching host allocator: a block freed after a non-blocking
copy is reused only once that copy has completed (the allocator records an event on it), so the
reuse of buffers is safe however many batches the consumer holds, and after the first batches
no new memory is pinned.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from torchrec.datasets.utils import Batch

from rocmtrain.config.data import DataConfig, auto_num_workers
from rocmtrain.data.batch import make_batch_from_values

MIN_CHUNK_ROWS = 1024
"""Smallest row chunk one task reads (a task costs ~2 numpy calls per feature whatever its rows)."""
AUTO_READ_THREADS_MAX = 4
"""Most reader threads ``data.read_threads=null`` picks. A thread gathers a 65,536-sample MLPerf
batch in a few tens of ms, so a few keep a ~20 ms GPU step fed; more only compete with the
training thread, whose host work (Python, launches) the step waits for, for cores and the GIL."""
READER_NICE = 5
"""Scheduling niceness added to each reader thread (Linux: per thread): when the host is busy,
the training thread's launches go first and the reading, which runs batches ahead, waits."""
READ_AHEAD = 2
"""Batches submitted to the threads beyond the one asked for (the threads never run dry while
the consumer hands a batch on)."""
_INT32_MAX = 2**31 - 1


@dataclass
class HostBatch(Batch):
    """A batch as read from the files: the KJT's values are the files' int32 ids, not yet taken
    ``% rows[f]``. ``.to(device)`` gives the training batch (int64 ids ``% table_rows``), made on
    ``device``; a consumer that reads the ids must call it first (Lightning and rocmtrain's input
    pipeline do, for every device)."""

    table_rows: tuple[int, ...] = ()
    hot_sizes: tuple[int, ...] = ()

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        device = torch.device(device)
        values = self.sparse_features.values().to(device, non_blocking=non_blocking)
        wide = values.to(torch.int64)  # on the device, after the int32 copy
        batch_size = self.dense_features.shape[0]
        start = 0
        for rows, hot in zip(self.table_rows, self.hot_sizes, strict=True):
            end = start + batch_size * hot
            if rows < _INT32_MAX:  # an int32 id can reach the table's size: take it % rows
                part = wide[start:end]
                torch.remainder(part, rows, out=part)
            start = end
        return make_batch_from_values(
            self.dense_features.to(device, non_blocking=non_blocking),
            wide,
            self.hot_sizes,
            self.labels.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> HostBatch:
        if self.dense_features.is_pinned():
            return self
        pinned = Batch.pin_memory(self)
        return HostBatch(
            pinned.dense_features, pinned.sparse_features, pinned.labels,
            self.table_rows, self.hot_sizes,
        )  # fmt: skip


class _Pending:
    """One batch in flight: its buffers and the futures of its row chunks."""

    def __init__(self, batch: HostBatch, futures: list[Future]) -> None:
        self.batch = batch
        self.futures = futures

    def result(self) -> HostBatch:
        for future in self.futures:
            future.result()  # the first chunk's error (a negative id ...) is raised here
        return self.batch


class ThreadedReader:
    """Reads a :class:`~rocmtrain.data.criteo_multihot.MultiHotSource`'s batches with
    ``threads`` threads into (``pin``: pinned) host buffers, :data:`READ_AHEAD` batches ahead.

    ``batch(epoch, index)`` is a pure function of its arguments as before: batches read ahead
    for another position (a resumed or restarted iteration) are dropped, not handed out.
    """

    def __init__(self, source, *, threads: int, pin: bool) -> None:
        self.source = source
        self.threads = threads
        self.pin = pin
        self._pool: ThreadPoolExecutor | None = None
        self._pending: OrderedDict[tuple[int, int], _Pending] = OrderedDict()

    def __getstate__(self) -> dict:
        # threads and batches in flight stay in this process (a copy starts its own)
        return {**self.__dict__, "_pool": None, "_pending": OrderedDict()}

    def _next(self, epoch: int, index: int) -> tuple[int, int]:
        return (epoch, index + 1) if index + 1 < len(self.source) else (epoch + 1, 0)

    def batch(self, epoch: int, index: int) -> HostBatch:
        key = (epoch, index)
        if key not in self._pending:
            self._pending.clear()  # read ahead for another position: not this iteration's
            self._submit(key)
        ahead = key
        for _ in range(READ_AHEAD):
            ahead = self._next(*ahead)
            if ahead not in self._pending:
                self._submit(ahead)
        return self._pending.pop(key).result()

    def _submit(self, key: tuple[int, int]) -> None:
        pool = self.executor()
        src = self.source
        rows = src.positions(*key)
        size = len(rows)
        sizes = src.hot_sizes
        values = _empty(size * sum(sizes), torch.int32, self.pin)
        dense = _empty((size, src.num_dense), torch.float32, self.pin)
        labels = _empty(size, torch.float32, self.pin)
        views = [
            v.view(size, hot)
            for v, hot in zip(values.split([size * h for h in sizes]), sizes, strict=True)
        ]
        src.rows.arrays()  # map the files here, once, not racing in the threads
        chunks = max(1, min(self.threads, math.ceil(size / MIN_CHUNK_ROWS)))
        bounds = np.linspace(0, size, chunks + 1).astype(np.int64).tolist()
        futures = [
            pool.submit(
                src.rows.read_raw,
                rows[lo:hi],
                dense=dense[lo:hi].numpy(),
                labels=labels[lo:hi].numpy(),
                values=[v[lo:hi].numpy() for v in views],
            )
            for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
            if hi > lo
        ]
        kjt = make_batch_from_values(dense, values, sizes, labels, widen=False).sparse_features
        batch = HostBatch(dense, kjt, labels, tuple(src.table_rows), tuple(sizes))
        self._pending[key] = _Pending(batch, futures)

    def executor(self) -> ThreadPoolExecutor:
        """The reader threads (started on first use, each at a lower priority)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.threads, thread_name_prefix="rocmtrain-read", initializer=_lower_priority
            )
        return self._pool

    def close(self) -> None:
        """Stop the threads (batches in flight are dropped)."""
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _lower_priority() -> None:
    """Make the calling thread :data:`READER_NICE` nicer than the process (Linux schedules
    threads as tasks, so ``setpriority`` on the thread id applies to this thread alone)."""
    if not hasattr(os, "setpriority") or not sys.platform.startswith("linux"):
        return  # other systems: the threads keep the process's priority
    tid = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + READER_NICE)


def _empty(shape, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, pin_memory=pin)


def read_threads(
    cfg: DataConfig, train_device: torch.device, world_size: int, cpu_count: int | None = None
) -> int:
    """Reader threads of a rank (``data.read_threads``; auto: a GPU run without loader
    processes reads with the cores :func:`auto_num_workers` would give those processes, at most
    :data:`AUTO_READ_THREADS_MAX`)."""
    if cfg.read_threads is not None:
        return cfg.read_threads
    if train_device.type == "cpu" or cfg.num_workers:
        return 0
    return min(AUTO_READ_THREADS_MAX, auto_num_workers(ranks_on_node(world_size), cpu_count))


def ranks_on_node(world_size: int) -> int:
    """The ranks sharing this host: one per visible GPU, at most the world size."""
    return max(1, min(world_size, torch.cuda.device_count() or 1))
