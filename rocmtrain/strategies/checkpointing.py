"""The strategy's checkpoint hooks: Lightning's save/load calls mapped onto sharded state.

The embedding tables exist only as shards across ranks, and their optimizer state lives in the
fused optimizer inside the backward, not in Lightning's optimizers; a single-file ``torch.save``
of rank 0 would hold neither. So every rank writes its shards of the model and of the fused
optimizer with ``torch.distributed.checkpoint`` and its own small part (dense optimizer, loops,
data position, RNG) next to them, through :mod:`rocmtrain.checkpoint`, which owns the folder
layout, the atomic write and the integrity checks. This module only says what goes where; the
strategy's ``save_checkpoint``/``load_checkpoint`` hooks call its functions.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rocmtrain import checkpoint as ckpt
from rocmtrain import checkpoint_reshard as reshard
from rocmtrain.strategies.deprecated import mixin_getattr

if TYPE_CHECKING:  # torchrec is imported when a model is set up, not on `import rocmtrain`
    from collections.abc import Callable

    from torch import nn
    from torchrec.distributed import DistributedModelParallel


def save_sharded_checkpoint(
    dmp: DistributedModelParallel,
    checkpoint: dict[str, Any],
    path: Path,
    *,
    rank: int,
    world_size: int,
    barrier: Callable[..., None],
) -> None:
    """Collective: every rank writes its shards of the model and of the fused optimizer, and
    its own part of Lightning's ``checkpoint`` (which loses its ``state_dict`` to the shards)."""
    state = {
        "model": checkpoint.pop("state_dict"),
        "fused_optimizer": dmp.fused_optimizer.state_dict(),
    }
    checkpoint["rng"] = _rng_state()
    ckpt.write_sharded(
        path, sharded=state, per_rank=checkpoint, rank=rank, world_size=world_size, barrier=barrier
    )


def load_sharded_checkpoint(
    dmp: DistributedModelParallel,
    module: nn.Module,
    path: Path,
    *,
    trainer: Any,
    rank: int,
    world_size: int,
) -> dict[str, Any]:
    """Read the shards into ``module`` and the fused optimizer (they must exist: load after
    setup); returns this rank's part of Lightning's checkpoint (loops, dense optimizer ...),
    fitted to this run's world size and plan when they differ from the saved ones."""
    state = {
        "model": module.state_dict(),
        "fused_optimizer": dmp.fused_optimizer.state_dict(),
    }
    extras = ckpt.read_sharded(path, sharded=state, rank=rank)
    # another world size or plan: the sharded state resharded itself; fit the rest to it
    extras = reshard.adapt(extras, path, trainer=trainer, rank=rank, world_size=world_size)
    module.load_state_dict(state["model"])
    dmp.fused_optimizer.load_state_dict(state["fused_optimizer"])
    if extras.get("global_step") is not None:  # not in the fused state (Adam's bias corr.)
        _set_kernel_step(dmp.fused_optimizer, int(extras["global_step"]))
    if "rng" in extras:
        _set_rng_state(extras.pop("rng"))
    return extras


def remove_checkpoint(path: Path, *, rank: int) -> None:
    """Remove a checkpoint folder (rank 0 does; the folder is shared)."""
    if rank == 0:
        ckpt.remove(path)


def _rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _set_kernel_step(optimizer: Any, step: int) -> None:
    """``set_optimizer_step(step)`` on every rocmtrain-kernel fused optimizer (kernel=triton|torch)
    inside TorchRec's (nested) CombinedOptimizer; FBGEMM's are left as they are."""
    from rocmtrain.embedding.kernel import RocmEmbeddingFusedOptimizer

    if isinstance(optimizer, RocmEmbeddingFusedOptimizer):
        optimizer.set_optimizer_step(step)
    for _, inner in getattr(optimizer, "optimizers", ()):
        _set_kernel_step(inner, step)


__getattr__ = mixin_getattr(__name__, "ShardedCheckpointMixin")
