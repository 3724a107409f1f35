"""``TorchRecStrategy``: Lightning DDP-shaped strategy that shards embeddings with TorchRec DMP.

Use it from any Lightning script (``import rocmtrain`` registers the names)::

    import rocmtrain, pytorch_lightning as pl
    trainer = pl.Trainer(strategy="torchrec", accelerator="cpu", devices=2)     # gloo
    trainer = pl.Trainer(strategy="torchrec_row_wise", accelerator="gpu", devices=8)  # nccl/RCCL
    trainer = pl.Trainer(strategy=TorchRecStrategy(sharding_type="table_wise"), ...)

Registered names: ``torchrec`` (planner's choice), ``torchrec_table_wise``,
``torchrec_row_wise``, ``torchrec_data_parallel``; ``*_spawn`` variants start ranks with
``torch.multiprocessing`` spawn instead of re-running the script.

What it does, in Lightning's hook order:

1. ``setup_environment``: device/NUMA binding (``rocmtrain.launch.binding``), the RCCL/NCCL env
   (``rocmtrain.comms.rccl.apply_rccl_config``), both BEFORE ``init_process_group`` (gloo on CPU,
   nccl on CUDA/ROCm) with ``timeout = rccl.init_timeout_seconds``.
2. ``setup`` → ``_setup_model``: the LightningModule (its EmbeddingBagCollections on the meta
   device) is wrapped in ``DistributedModelParallel``: TorchRec's planner (or the given plan)
   shards every table (table-wise / row-wise / data-parallel ...), materialises the shards on
   this rank, fuses the embedding optimizer into the backward (``apply_optimizer_in_backward``
   in the module, or ``fused_params``), and wraps the dense rest in DDP. Optimizers are created
   after that, so ``configure_optimizers`` sees only dense parameters through
   ``in_backward_optimizer_filter``.
3. Checkpoints: ``save_checkpoint``/``load_checkpoint`` write/read sharded state with
   ``torch.distributed.checkpoint`` into an atomic folder (``rocmtrain.checkpoint``); the fused
   embedding optimizer state, dense optimizer, loops, data position and RNG are included.

Input-dist/compute overlap: TorchRec's ``TrainPipelineSparseDist`` must own the data iterator,
so it lives in the LightningModule (``rocmtrain.models.module.PipelinedDLRMModule``: manual
optimization, ``training_step(dataloader_iter)``), built over :attr:`dmp`; any module can do the
same with :meth:`make_train_pipeline`. ``train(cfg)`` uses it on GPU (``strategy.pipeline=auto``)
and the plain loop on CPU (``strategy.pipeline=sparse_dist`` forces it; the CPU test checks that
it gives the plain loop's losses).
"""

from __future__ import annotations

import logging
import os
import random
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.distributed as dist
from lightning_fabric.utilities.optimizer import _optimizers_to_device
from pytorch_lightning.strategies import DDPStrategy
from pytorch_lightning.trainer.states import TrainerFn
from torch import nn
from typing_extensions import override

from rocmtrain import checkpoint as ckpt

if TYPE_CHECKING:  # torchrec is imported when a model is set up, not on `import rocmtrain`
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingPlan

log = logging.getLogger(__name__)

#: registered name -> (sharding_type, start_method)
REGISTERED: dict[str, tuple[str, str]] = {
    "torchrec": ("auto", "popen"),
    "torchrec_table_wise": ("table_wise", "popen"),
    "torchrec_row_wise": ("row_wise", "popen"),
    "torchrec_data_parallel": ("data_parallel", "popen"),
    "torchrec_spawn": ("auto", "spawn"),
    "torchrec_table_wise_spawn": ("table_wise", "spawn"),
}


class TorchRecStrategy(DDPStrategy):
    """Multi-process training with TorchRec-sharded embeddings and DDP for the dense part."""

    strategy_name = "torchrec"

    def __init__(
        self,
        *,
        sharding_type: str = "auto",
        per_table_sharding: dict[str, str] | None = None,
        kernel: str = "fbgemm",
        fused_params: dict[str, Any] | None = None,
        plan: ShardingPlan | None = None,
        pooling_factors: dict[str, float] | None = None,
        planner_batch_size: int | None = None,
        hbm_cap_gb: float | None = None,
        ddr_cap_gb: float | None = None,
        rccl: Any | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        timeout: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        if timeout is None:
            seconds = getattr(rccl, "init_timeout_seconds", None)
            timeout = timedelta(seconds=seconds) if seconds else timedelta(minutes=30)
        super().__init__(timeout=timeout, **kwargs)
        self._sharding_type = sharding_type
        self._per_table_sharding = dict(per_table_sharding or {})
        self._kernel = kernel
        self._fused_params = fused_params
        self._plan = plan
        self._pooling_factors = pooling_factors
        self._planner_batch_size = planner_batch_size
        self._hbm_cap_gb = hbm_cap_gb
        self._ddr_cap_gb = ddr_cap_gb
        self._rccl = rccl
        self._run_dir = run_dir
        self._dmp: DistributedModelParallel | None = None

    # -- environment -----------------------------------------------------------------------------
    @override
    def setup_environment(self) -> None:
        # Order matters: bind the device and set the collective env BEFORE the process group
        # (RCCL/NCCL read their env once, when the first communicator is created).
        self._bind_local_rank()
        self._apply_rccl_env()
        super().setup_environment()

    def _bind_local_rank(self) -> None:
        """Integration point: ``rocmtrain.launch.binding.bind_local_rank`` (Slurm area)."""
        from rocmtrain.launch.binding import bind_local_rank

        bind_local_rank(
            self.local_rank, accelerator="cpu" if self.root_device.type == "cpu" else "gpu"
        )

    def _apply_rccl_env(self) -> None:
        """Integration point: ``rocmtrain.comms.rccl.apply_rccl_config`` (RCCL area)."""
        if self._rccl is None:
            return
        from rocmtrain.comms.rccl import apply_rccl_config

        apply_rccl_config(self._rccl, run_dir=self._run_dir)

    # -- model -----------------------------------------------------------------------------------
    @override
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        self.accelerator.setup(trainer)
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        # Shard for every stage (not only fitting): the tables exist only as shards.
        self.model = self._setup_model(self.model)
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if fitting:
            _optimizers_to_device(self.optimizers, self.root_device)

    @override
    def model_to_device(self) -> None:
        # The tables are still on the meta device; only move materialised tensors.
        assert self.model is not None
        device = self.root_device
        self.model._apply(lambda t: t if t.is_meta else t.to(device))

    @override
    def _setup_model(self, model: nn.Module) -> DistributedModelParallel:
        from torchrec.distributed import DistributedModelParallel
        from torchrec.distributed.types import ShardingEnv

        from rocmtrain.strategies.planning import (
            build_sharders,
            describe_plan,
            make_plan,
            sharding_constraints,
        )

        sharders = build_sharders(self._kernel, fused_params=self._fused_params)
        pg = dist.group.WORLD
        assert pg is not None, "process group not initialised: setup_environment must run first"
        plan = self._plan or make_plan(
            model,
            sharders=sharders,
            world_size=self.world_size,
            local_world_size=self.num_processes,
            compute_device=self.root_device.type,
            constraints=sharding_constraints(
                model,
                self._sharding_type,
                per_table=self._per_table_sharding,
                pooling_factors=self._pooling_factors,
            ),
            batch_size=self._planner_batch_size or 512,
            hbm_cap_gb=self._hbm_cap_gb,
            ddr_cap_gb=self._ddr_cap_gb,
            pg=pg,
        )
        if self.global_rank == 0:
            log.info("sharding plan:\n%s", "\n".join(map(str, describe_plan(plan))))
        self._plan = plan
        self._dmp = DistributedModelParallel(
            model,
            env=ShardingEnv.from_process_group(pg),
            device=self.root_device,
            plan=plan,
            sharders=sharders,
        )
        return self._dmp

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        module = self.lightning_module
        if getattr(module, "calls_model_itself", False):  # e.g. a TrainPipelineSparseDist step
            assert module is not None
            with self.precision_plugin.train_step_context():
                return module.training_step(*args, **kwargs)
        return super().training_step(*args, **kwargs)

    @override
    def configure_ddp(self) -> None:  # DMP wraps the dense part in DDP itself
        assert self.model is not None
        self.model = self._setup_model(self.model)

    @property
    def dmp(self) -> DistributedModelParallel:
        """The ``DistributedModelParallel`` wrapper (after ``setup``; kept after teardown)."""
        if self._dmp is None:
            raise RuntimeError("TorchRecStrategy.dmp: the strategy has not set up a model yet")
        return self._dmp

    @property
    def sharding_plan(self) -> ShardingPlan | None:
        """The plan in use (after ``setup``)."""
        return self._plan

    def make_train_pipeline(self, optimizer: torch.optim.Optimizer) -> Any:
        """TorchRec ``TrainPipelineSparseDist`` over the sharded model (input-dist overlap).

        For a LightningModule with ``automatic_optimization = False`` whose
        ``training_step(self, dataloader_iter)`` calls ``pipeline.progress(dataloader_iter)``;
        the module's ``forward(batch)`` must return ``(loss, outputs)``.
        """
        from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

        return TrainPipelineSparseDist(self.dmp, optimizer, self.root_device)

    @override
    def teardown(self) -> None:
        module = self.lightning_module
        if self.model is not module and module is not None:
            self.model = module
        if module is not None and any(p.is_meta for p in module.parameters()):
            # sharding failed half-way (the error is being raised): nothing to move back to the
            # CPU, and ``module.cpu()`` on meta tensors would hide the real error
            self.precision_plugin.teardown()
            assert self.accelerator is not None
            self.accelerator.teardown()
            self.checkpoint_io.teardown()
            return
        super().teardown()

    # -- checkpoints -----------------------------------------------------------------------------
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

    # -- registry --------------------------------------------------------------------------------
    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        for name, (sharding_type, start_method) in REGISTERED.items():
            strategy_registry.register(
                name,
                cls,
                description=f"TorchRec DMP, sharding_type={sharding_type}, start={start_method}",
                sharding_type=sharding_type,
                start_method=start_method,
                override=True,
            )


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
