"""Resuming a checkpoint on another world size or sharding plan.

A checkpoint written by N ranks loads on M ranks, and with another sharding plan (table-wise
<-> row-wise, ...), in :meth:`ShardedCheckpointMixin.load_checkpoint`:

- **Tables and fused optimizer state**: torch.distributed.checkpoint stores every tensor with
  its global offsets and reads back whatever slices the new plan's shards cover, so the sharded
  state reshards itself; the same files load on CUDA, ROCm and CPU builds (tensors are loaded
  into the new shards, wherever they live).
- **Per-rank state** (``rank_<r>.pt``: dense optimizer, Lightning's loops, data position, RNG):
  a rank that has no file of its own (more ranks than were saved) reads ``rank_0.pt``
  (:func:`rocmtrain.checkpoint.read_sharded`). The dense part is replicated by DDP, so rank 0's
  dense optimizer state is every rank's.
- **Data position**: saved as the global count of samples of the epoch consumed by all ranks
  (:mod:`rocmtrain.data.loader`); on another world size the rest of the epoch is split over the
  new ranks, so no sample of the epoch is skipped or trained twice. Lightning's batch counters
  move to the batch the loader continues at, so the epoch still ends after its last batch.
- **RNG rule**: a rank that was saved gets its own RNG state back (python, numpy, torch, CUDA).
  A rank that was not (rank ``r >= N``) seeds python, numpy and torch from a hash of rank 0's
  saved torch RNG state and ``r``: deterministic for a given checkpoint, distinct per rank (its
  CUDA/ROCm generator keeps the run's seed).
  An unchanged world size resumes exactly as before (bit-identical to an uninterrupted run);
  after a change the run is reproducible, but not bit-identical to any run on the old size.

Limits: a table cannot move between sharded and data-parallel (its optimizer state would have
to move between the fused and the dense optimizer, which need not even be of one kind):
:func:`data_parallel_change` stops such a resume with one line naming the table and the setting
that resumes it. A checkpoint written before the sample count was recorded resumes at its batch
index. With ``data.cache_batches`` (synthetic throughput runs) the position is approximate. When
the rest of an epoch begun on more ranks is longer than a whole epoch on the fewer new ones, its
batches grow to fit (:func:`rocmtrain.data.loader.tail_slices`).
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rocmtrain import checkpoint as ckpt

log = logging.getLogger(__name__)


def saved_world_size(path: Path) -> int | None:
    """The number of ranks that wrote checkpoint ``path`` (from its completion marker)."""
    marker = ckpt.read_marker(path) or {}
    size = marker.get("world_size")
    return size if isinstance(size, int) else None


def adapt(extras: dict[str, Any], path: Path, *, trainer: Any, rank: int, world_size: int) -> dict:
    """Fit the per-rank ``extras`` read from checkpoint ``path`` to this run's world size.

    Gives a rank that was not saved its own RNG seed, and moves Lightning's batch counters to
    the batch the data loader continues at. Unchanged world sizes pass through untouched.
    """
    problem = data_parallel_change(path, getattr(trainer, "strategy", None))
    if problem is not None:
        raise ckpt.ResumeError(problem)
    saved = saved_world_size(path)
    if saved is not None and rank >= saved and "rng" in extras:
        extras["rng"] = derived_rng(extras["rng"], rank)
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None and hasattr(datamodule, "resume_batch"):
        position = extras.get(type(datamodule).__qualname__)
        if isinstance(position, dict) and "epoch" in position:
            epoch, batch = datamodule.resume_batch(position)
            if (epoch, batch) != (int(position["epoch"]), int(position["batch"])):
                _move_batch_counters(extras, int(position["batch"]), batch)
                log.info(
                    "checkpoint %s of %s ranks resumes on %d: epoch %d continues at global "
                    "sample %s (batch %d here)",
                    path, saved, world_size, epoch, position.get("samples"), batch,
                )  # fmt: skip
    return extras


_TABLE = re.compile(r"embedding_bags\.([^.]+)\.weight")


def _tables(keys: Any) -> set[str]:
    return {m.group(1) for k in keys if (m := _TABLE.search(k))}


def data_parallel_change(path: Path, strategy: Any) -> str | None:
    """One line when a table moves between data-parallel and sharded, else None.

    A sharded table's optimizer state is in the fused embedding optimizer, a data-parallel
    one's in the dense optimizer (TorchRec trains it with DDP): one has no state for the other,
    so such a resume stops here, before Lightning fails to load the dense optimizer.
    """
    import torch.distributed.checkpoint as dcp

    plan = getattr(strategy, "sharding_plan", None)
    if plan is None:
        return None
    now_dp = {
        t
        for mp in plan.plan.values()
        for t, ps in mp.items()
        if ps.sharding_type == "data_parallel"
    }
    keys = list(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    every = _tables(k for k in keys if k.startswith("model."))
    was_dp = every - _tables(k for k in keys if k.startswith("fused_optimizer."))
    moved = sorted((now_dp ^ was_dp) & every)
    if not moved:
        return None
    where = ", ".join(
        f"{t} {'data_parallel' if t in was_dp else 'sharded'} there, "
        f"{'data_parallel' if t in now_dp else 'sharded'} here"
        for t in moved[:3]
    )
    pin = " ".join(
        f"+strategy.per_table_sharding.{t}={'data_parallel' if t in was_dp else 'table_wise'}"
        for t in moved[:3]
    )
    more = f" (and {len(moved) - 3} more tables)" if len(moved) > 3 else ""
    return (
        f"checkpoint {path} cannot resume with this sharding plan: {where}{more}, and the "
        "optimizer state of a sharded table is in the fused embedding optimizer, of a "
        f"data-parallel one in the dense optimizer; pin the saved kind ({pin}; any sharded kind "
        "loads a sharded table), or start over (checkpoint.resume=never, or a new run_dir)"
    )


def derived_rng(saved: dict[str, Any], rank: int) -> dict[str, Any]:
    """RNG states for a rank the checkpoint has none for: seeded from a hash of rank 0's saved
    torch RNG state and ``rank`` (so every new rank differs, and reruns agree)."""
    torch_state = saved["torch"]
    data = torch_state.numpy().tobytes() if isinstance(torch_state, torch.Tensor) else b""
    digest = hashlib.sha256(data + rank.to_bytes(8, "little")).digest()
    seed = int.from_bytes(digest[:8], "little") >> 1
    return {
        "python": random.Random(seed).getstate(),
        "numpy": np.random.RandomState(seed % 2**32).get_state(),
        "torch": torch.Generator().manual_seed(seed).get_state(),
    }


def _move_batch_counters(extras: dict[str, Any], saved_batch: int, batch: int) -> None:
    """Set Lightning's batch progress of the epoch in progress to ``batch`` (the loader's index
    on this world size), so it ends the epoch after the loader's last batch, not before."""
    fit = extras.get("loops", {}).get("fit_loop", {})
    progress = fit.get("epoch_loop.batch_progress")
    if not isinstance(progress, dict):
        return
    # shifted, not set: a checkpoint written in on_train_batch_end counts that batch ready but
    # not yet completed, and Lightning completes it on restart
    for part in ("current", "total"):
        counters = progress.get(part, {})
        for key in ("ready", "started", "processed", "completed"):
            if key in counters:
                counters[key] += batch - saved_batch
