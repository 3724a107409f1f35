"""The strategy's checkpoint hooks: Lightning's save/load calls mapped onto sharded state.

The embedding tables exist only as shards across ranks, and their optimizer state lives in the
fused optimizer inside the backward, not in Lightning's optimizers; a single-file ``torch.save``
of rank 0 would hold neither. So every rank writes its shards of the model and of the fused
optimizer with ``torch.distributed.checkpoint`` and its own small part (dense optimizer, loops,
data position, RNG) next to them, through :mod:`rocmtrain.checkpoint`, which owns the folder
layout, the atomic write and the integrity checks. This module only says what goes where.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pytorch_lightning.strategies import ParallelStrategy
from typing_extensions import override

from rocmtrain import checkpoint as ckpt
from rocmtrain import checkpoint_reshard as reshard

if TYPE_CHECKING:  # torchrec is imported when a model is set up, not on `import rocmtrain`
    from torchrec.distributed import DistributedModelParallel


class ShardedCheckpointMixin(ParallelStrategy):
    """Lightning's checkpoint hooks for a strategy whose model is a ``DistributedModelParallel``
    (:attr:`dmp`). A ``ParallelStrategy`` subclass only so that the hooks it overrides are
    checked against Lightning's; the strategy that mixes it in provides :attr:`dmp`.
    """

    if TYPE_CHECKING:

        @property
        def dmp(self) -> DistributedModelParallel: ...

    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # shards must exist before loading into them

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        assert self.lightning_module is not None
        return self.lightning_module.state_dict()

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        """Collective: every rank calls it (Lightning's ``trainer.save_checkpoint`` does)."""
        state = {
            "model": checkpoint.pop("state_dict"),
            "fused_optimizer": self.dmp.fused_optimizer.state_dict(),
        }
        checkpoint["rng"] = _rng_state()
        ckpt.write_sharded(
            Path(filepath),
            sharded=state,
            per_rank=checkpoint,
            rank=self.global_rank,
            world_size=self.world_size,
            barrier=self.barrier,
        )

    @override
    def load_checkpoint(
        self, checkpoint_path: Any, weights_only: bool | None = None
    ) -> dict[str, Any]:
        assert self.lightning_module is not None
        state = {
            "model": self.lightning_module.state_dict(),
            "fused_optimizer": self.dmp.fused_optimizer.state_dict(),
        }
        extras = ckpt.read_sharded(Path(checkpoint_path), sharded=state, rank=self.global_rank)
        # another world size or plan: the sharded state resharded itself; fit the rest to it
        extras = reshard.adapt(
            extras,
            Path(checkpoint_path),
            trainer=self.lightning_module.trainer,
            rank=self.global_rank,
            world_size=self.world_size,
        )
        self.lightning_module.load_state_dict(state["model"])
        self.dmp.fused_optimizer.load_state_dict(state["fused_optimizer"])
        if extras.get("global_step") is not None:  # not in the fused state (Adam's bias corr.)
            _set_kernel_step(self.dmp.fused_optimizer, int(extras["global_step"]))
        if "rng" in extras:
            _set_rng_state(extras.pop("rng"))
        return extras

    @override
    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        pass  # loaded into the shards in load_checkpoint

    @override
    def remove_checkpoint(self, filepath: Any) -> None:
        if self.global_rank == 0:
            ckpt.remove(Path(filepath))


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
