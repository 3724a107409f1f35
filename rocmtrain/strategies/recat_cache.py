"""TorchRec's all-to-all permutation built once per shape, not once per batch: no host sync per step.

Every ``KJTAllToAllTensorsAwaitable`` (the sparse input dist of each batch) calls TorchRec's
``_get_recat`` (``torchrec/distributed/dist_data.py``, torchrec 1.6-1.8), which builds the
permutation that reorders the all-to-all's output with ``torch.tensor(list, device=...)``: a
copy from pageable host memory, which blocks the host until the current stream (the input
pipeline's dist stream, behind the batch's copy and, across ranks, its splits all-to-all) has
run. In the DLRM-DCNv2 recipe that was the only torch-level host sync of a training step (the
e2e bench's sync report counts it; ``scripts/bench/BENCHMARKS.md`` has the numbers); with several
ranks the host no longer waits on the input dist at all. The permutation depends on its arguments only, so :func:`install` wraps the
function with a cache keyed on them: the first call per (local split, number of splits,
stagger, device, batch size per rank) builds the tensor as TorchRec does, later calls return
that same tensor. Its consumers only read it (fbgemm's permute ops, ``record_stream``), so
sharing it is safe.

Usage (the strategy does this in ``setup``)::

    from rocmtrain.strategies import recat_cache
    recat_cache.install()        # idempotent; False (and a log line) on a TorchRec without it
"""

from __future__ import annotations

import inspect
import logging
from collections import OrderedDict
from typing import Any

import torch

log = logging.getLogger(__name__)

#: ``_get_recat``'s parameters in the TorchRec versions this wraps (1.6 - 1.8)
_PARAMS = ("local_split", "num_splits", "stagger", "device", "batch_size_per_rank")
#: distinct argument sets kept (a fixed batch size needs one per sharding; variable batch sizes
#: per rank add one per size vector, so the oldest are dropped)
MAX_ENTRIES = 64

_cache: OrderedDict[tuple, torch.Tensor | None] = OrderedDict()
_original: Any = None
stats = {"built": 0, "reused": 0}


def _key(local_split, num_splits, stagger, device, batch_size_per_rank) -> tuple:
    dev = None
    if device is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:  # "cuda" means the current device
            dev = torch.device("cuda", torch.cuda.current_device())
        dev = str(dev)
    sizes = tuple(int(b) for b in batch_size_per_rank) if batch_size_per_rank is not None else None
    return int(local_split), int(num_splits), int(stagger), dev, sizes


def cached_recat(
    local_split: int,
    num_splits: int,
    stagger: int = 1,
    device: torch.device | str | None = None,
    batch_size_per_rank: list[int] | None = None,
) -> torch.Tensor | None:
    """``_get_recat`` with its result cached per argument set (TorchRec's own function on a
    miss, and always while ``torch.compile`` traces: a cached tensor is no graph input)."""
    if torch.compiler.is_compiling():
        return _original(local_split, num_splits, stagger, device, batch_size_per_rank)
    key = _key(local_split, num_splits, stagger, device, batch_size_per_rank)
    if key in _cache:
        _cache.move_to_end(key)
        stats["reused"] += 1
        return _cache[key]
    recat = _original(local_split, num_splits, stagger, device, batch_size_per_rank)
    _cache[key] = recat
    stats["built"] += 1
    while len(_cache) > MAX_ENTRIES:
        _cache.popitem(last=False)
    return recat


def install() -> bool:
    """Route TorchRec's ``_get_recat`` through :func:`cached_recat` (once per process). Returns
    whether the cache is in place; a TorchRec whose ``_get_recat`` has other parameters keeps
    its own (logged), since the cache key would not describe its result."""
    global _original
    from torchrec.distributed import dist_data

    current = getattr(dist_data, "_get_recat", None)
    if current is cached_recat:
        return True
    params = tuple(inspect.signature(current).parameters) if current is not None else ()
    if params != _PARAMS:
        log.info(
            "torchrec's dist_data._get_recat has parameters %s, not %s: its all-to-all "
            "permutation is rebuilt (with a host sync) every batch",
            params,
            _PARAMS,
        )
        return False
    _original = current
    dist_data._get_recat = cached_recat
    return True


def uninstall() -> None:
    """TorchRec's own ``_get_recat`` back, the cache emptied (tests)."""
    from torchrec.distributed import dist_data

    if _original is not None and dist_data._get_recat is cached_recat:
        dist_data._get_recat = _original
    _cache.clear()
    stats.update(built=0, reused=0)
