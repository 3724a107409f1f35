"""``TorchRecStrategy``: the product. Swap it into any Lightning Trainer and get TorchRec sharding
plus everything rocmtrain adds on every rank, with nothing else to remember::

    import rocmtrain, pytorch_lightning as pl
    trainer = pl.Trainer(strategy="torchrec", accelerator="gpu", devices=8)        # defaults on
    trainer = pl.Trainer(
        strategy=rocmtrain.TorchRecStrategy(
            sharding_type="table_wise",
            rccl="mi300x_8gpu",                          # preset name, RcclConfig or mapping
            watchdog={"hang_timeout_seconds": 120},      # WatchdogConfig, mapping, or None = off
        ),
        accelerator="gpu", devices=8,
    )

Registered names: ``torchrec`` (planner's choice), ``torchrec_table_wise``, ``torchrec_row_wise``,
``torchrec_data_parallel``; ``*_spawn`` variants start ranks with ``torch.multiprocessing`` spawn.
``python -m rocmtrain`` builds exactly this strategy from its config (:meth:`from_config`).

What it does in each of Lightning's hooks: ``STRATEGY.md`` beside this module.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from lightning_fabric.utilities.optimizer import _optimizers_to_device
from pytorch_lightning.strategies import DDPStrategy
from pytorch_lightning.trainer.states import TrainerFn
from torch import nn
from typing_extensions import override

from rocmtrain.comms.rccl import CollectiveEnv
from rocmtrain.config import check_choice
from rocmtrain.config.rccl import RcclConfig
from rocmtrain.config.strategy import KERNELS, StrategyArguments, strategy_kwargs
from rocmtrain.config.watchdog import WatchdogConfig
from rocmtrain.faults.guard import FaultGuard
from rocmtrain.strategies import checkpointing, lifecycle, sharding

if TYPE_CHECKING:  # torchrec is imported when a model is set up, not on `import rocmtrain`
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingPlan

    from rocmtrain.config.schema import RunConfig
    from rocmtrain.platform import Placement
    from rocmtrain.strategies.balance import BalanceReport

log = logging.getLogger(__name__)

__all__ = ["KERNELS", "REGISTERED", "TorchRecStrategy"]  # KERNELS: declared in config.strategy

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
    """Multi-process training with TorchRec-sharded embeddings, DDP for the dense part, and
    rocmtrain's collective environment, hang watchdog, timeouts, preemption and error hints.

    Its own arguments are the fields of :class:`rocmtrain.config.strategy.StrategyArguments`,
    each described there and checked there: a bad value raises
    :class:`~rocmtrain.config.ConfigError` naming the field before any rank starts. The others
    (``accelerator`` ... ``process_group_backend``) go to Lightning's ``DDPStrategy``.
    """

    strategy_name = "torchrec"

    def __init__(
        self,
        *,
        sharding_type: str = "auto",
        per_table_sharding: Mapping[str, str] | None = None,
        kernel: str = "fbgemm",
        pipeline: str = "auto",
        semi_sync_start_batch: int = 0,
        balance: str = "report",
        rccl: RcclConfig | Mapping[str, Any] | str | None = None,
        watchdog: WatchdogConfig | Mapping[str, Any] | None = WatchdogConfig(),  # noqa: B008
        run_dir: str | os.PathLike[str] | None = None,
        planner_batch_size: int | None = None,
        pooling_factors: Mapping[str, float] | None = None,
        hbm_cap_gb: float | None = None,
        ddr_cap_gb: float | None = None,
        plan: ShardingPlan | None = None,
        fused_params: dict[str, Any] | None = None,
        ddp_kwargs: Mapping[str, Any] | None = None,
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Any = None,
        process_group_backend: str | None = None,
        start_method: str = "popen",
    ) -> None:
        self._args = StrategyArguments.of(locals())  # checked and normalised there
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timedelta(seconds=self._args.rccl.init_timeout_seconds),
            start_method=start_method,
        )
        self._settings = sharding.plan_settings(self._args)
        self._plan: ShardingPlan | None = self._args.plan
        self._balance_report: BalanceReport | None = None
        self._sharder_list: list[Any] | None = None
        self._dmp: DistributedModelParallel | None = None
        self._input_pipeline: Any = None
        self._env = CollectiveEnv(self._args.rccl)
        self._guard: FaultGuard | None = None

    @classmethod
    def from_config(cls, cfg: RunConfig, **kwargs: Any) -> TorchRecStrategy:
        """The strategy of a composed run config (what ``python -m rocmtrain`` uses)."""
        return cls(**strategy_kwargs(cfg), **kwargs)

    # -- what it was asked for -------------------------------------------------------------------
    @property
    def rccl_config(self) -> RcclConfig:
        return self._args.rccl

    @property
    def watchdog_config(self) -> WatchdogConfig:
        return self._args.watchdog

    @property
    def kernel(self) -> str:
        return self._settings.kernel

    @property
    def pipeline(self) -> str:
        """The ``pipeline`` argument as given (``auto`` unresolved; see :meth:`uses_pipeline`)."""
        return self._args.pipeline

    def uses_pipeline(self, accelerator: str | Placement) -> bool:
        """``pipeline`` resolved (``auto`` = on a GPU run; a run's Placement has answered that)."""
        return self._args.uses_pipeline(accelerator)

    def pipeline_kind(self, accelerator: str | Placement) -> str | None:
        """``sparse_dist``, ``semi_sync``, or ``None`` (plain Lightning loop)."""
        return self._args.pipeline_kind(accelerator)

    @property
    def run_dir(self) -> Path:
        """Where this run's reports go: ``run_dir``, else the trainer's ``default_root_dir``."""
        if self._args.run_dir is not None:
            return self._args.run_dir
        trainer = self._trainer()
        return Path(trainer.default_root_dir) if trainer is not None else Path.cwd()

    @property
    def fault_guard(self) -> FaultGuard | None:
        """The run-time protection of the current (or last) fit; ``None`` before the first."""
        return self._guard

    # -- the plan (:mod:`rocmtrain.strategies.sharding`) -----------------------------------------
    def plan_for(
        self,
        model: nn.Module,
        *,
        world_size: int,
        local_world_size: int,
        compute_device: str,
        batch_size: int | None = None,
        pg: dist.ProcessGroup | None = None,
    ) -> ShardingPlan:
        """The sharding plan of ``model`` (the dry run prints this same plan); its per-rank
        cost is then :attr:`balance_report` (see :func:`rocmtrain.strategies.sharding.plan_for`)."""
        plan, self._balance_report = sharding.plan_for(
            self._settings,
            model,
            self._sharders(),
            world_size=world_size,
            local_world_size=local_world_size,
            compute_device=compute_device,
            batch_size=batch_size,
            pg=pg,
            plan=self._plan,
        )
        return plan

    def check_supported(self, compute_device: str) -> None:
        """Raise :class:`~rocmtrain.strategies.planning.PlanError` before anything starts when
        the sharders cannot shard the tables as configured on ``compute_device``."""
        sharding.check_supported(self._settings, self._sharders(), compute_device)

    @property
    def balance_report(self) -> BalanceReport | None:
        """Per-rank lookup cost and memory of the last :meth:`plan_for` (``None`` with
        ``balance="off"``)."""
        return self._balance_report

    @property
    def sharding_plan(self) -> ShardingPlan | None:
        """The plan in use (after ``setup``)."""
        return self._plan

    def _sharders(self) -> list[Any]:
        if self._sharder_list is None:
            self._sharder_list = sharding.build_sharders(self._settings)
        return self._sharder_list

    # -- before the process group (:mod:`rocmtrain.strategies.lifecycle`) ------------------------
    @override
    def setup_environment(self) -> None:
        # Order matters: check the rendezvous, bind the device and set the collective env BEFORE
        # the process group (RCCL/NCCL read their env once, when the first communicator is made).
        env, timeout_s = self.cluster_environment, self._args.rccl.init_timeout_seconds
        assert env is not None
        lifecycle.prepare_rank(
            env,
            global_rank=self.global_rank,
            local_rank=self.local_rank,
            device_type=self.root_device.type,
            first_group=not dist.is_initialized(),
            port_wait_s=timeout_s,
        )
        self._env.apply(self.run_dir)
        world_size = self.num_nodes * self.num_processes
        start = super().setup_environment
        lifecycle.start_process_group(env, world_size=world_size, timeout_s=timeout_s, start=start)
        self._guard = FaultGuard(self._args.watchdog, self._args.rccl, self.run_dir)
        if self._args.watchdog.enabled:
            lifecycle.stop_child_observer()

    # -- model -----------------------------------------------------------------------------------
    @override
    def setup(self, trainer: pl.Trainer) -> None:
        assert self.accelerator is not None and self.model is not None
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting and self._guard is not None:  # sharding is collective: watched too
            self._guard.start(self.global_rank, self.world_size)
        drives_pipeline = getattr(self.lightning_module, "calls_model_itself", False)
        kind = self.pipeline_kind("gpu" if self.root_device.type == "cuda" else "cpu")
        from rocmtrain.strategies import recat_cache

        recat_cache.install()  # the input dist's all-to-all permutation: no host sync per batch
        self.accelerator.setup(trainer)
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        # Shard for every stage (not only fitting): the tables exist only as shards.
        self.model = self._setup_model(self.model)
        if fitting and kind is not None and not drives_pipeline:
            from rocmtrain.strategies.input_pipeline import InputPipeline

            stale_after = self._args.semi_sync_start_batch if kind == "semi_sync" else None
            self._input_pipeline = InputPipeline(
                self._dmp, self.root_device, stale_after=stale_after
            )
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
        pg = dist.group.WORLD
        assert pg is not None, "process group not initialised: setup_environment must run first"
        batch = sharding.planner_batch(self._settings, self._trainer(), self.lightning_module)
        self._plan = self.plan_for(
            model,
            world_size=self.world_size,
            local_world_size=self.num_processes,
            compute_device=self.root_device.type,
            batch_size=batch,
            pg=pg,
        )
        if self.global_rank == 0:
            sharding.log_plan(log, self._plan, self._balance_report)
        self._dmp = sharding.shard_model(
            model,
            self._plan,
            self._sharders(),
            device=self.root_device,
            pg=pg,
            ddp_kwargs=self._args.ddp_kwargs,
        )
        return self._dmp

    @property
    def dmp(self) -> DistributedModelParallel:
        """The ``DistributedModelParallel`` wrapper (after ``setup``; kept after teardown)."""
        if self._dmp is None:
            raise RuntimeError("TorchRecStrategy.dmp: the strategy has not set up a model yet")
        return self._dmp

    @property
    def input_pipeline(self) -> Any:
        """The :class:`~rocmtrain.strategies.input_pipeline.InputPipeline` of the last ``fit``
        (detached but kept after teardown, for its counters), or ``None`` (``pipeline`` off, or a
        module that drives TorchRec's pipeline itself)."""
        return self._input_pipeline

    def make_train_pipeline(
        self, optimizer: torch.optim.Optimizer, *, kind: str | None = None, **kwargs: Any
    ) -> Any:
        """TorchRec's train pipeline over the sharded model for a module that drives it
        (``training_step(self, dataloader_iter)`` calling ``pipeline.progress``; without
        ``custom_model_fwd`` in ``kwargs`` its ``forward(batch)`` returns ``(loss, outputs)``).
        ``kind``: ``sparse_dist`` or ``semi_sync``, default this strategy's ``pipeline``."""
        from rocmtrain.strategies.pipelines import train_pipeline

        kind = kind or ("semi_sync" if self._args.pipeline == "semi_sync" else "sparse_dist")
        check_choice("kind", kind, ("sparse_dist", "semi_sync"))
        if kind == "semi_sync":
            kwargs.setdefault("start_batch", self._args.semi_sync_start_batch)
        return train_pipeline(self.dmp, optimizer, self.root_device, kind=kind, **kwargs)

    # -- training: the input pipeline and the fault guard's heartbeats ---------------------------
    @override
    def process_dataloader(self, dataloader: object) -> object:
        trainer = self._trainer()
        if trainer is None or not trainer.training:
            return dataloader
        if self._input_pipeline is not None:
            dataloader = self._input_pipeline.wrap(dataloader)
        module = self.lightning_module
        if self._guard is not None and not getattr(module, "calls_model_itself", False):
            dataloader = self._guard.watch(dataloader, trainer)  # type: ignore[arg-type]
        return dataloader

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        trainer = self._trainer()
        if trainer is not None and self._input_pipeline is not None:
            self._input_pipeline.start_at(trainer.global_step)  # a resumed run counts on
        if self._guard is not None and trainer is not None:
            self._guard.on_train_start(trainer.global_step)

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        trainer = self._trainer()
        self._beat("train_batch", trainer.global_step if trainer is not None else None)

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        module = self.lightning_module
        if getattr(module, "calls_model_itself", False):  # e.g. a TrainPipelineSemiSync step
            assert module is not None
            with self.precision_plugin.train_step_context():
                out = module.training_step(*args, **kwargs)
            self._step_boundary()  # the module fetched and stepped itself: the step is done
            return out
        pipe = self._input_pipeline
        if pipe is None:
            return super().training_step(*args, **kwargs)
        pipe.before_step()
        try:
            return super().training_step(*args, **kwargs)
        finally:
            pipe.after_step()

    @override
    def backward(self, closure_loss: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self._input_pipeline is not None:
            self._input_pipeline.before_backward()  # the next batch's all-to-all under this one
        self._beat("backward")
        out = super().backward(closure_loss, *args, **kwargs)
        if self._input_pipeline is not None:
            self._input_pipeline.after_backward()  # semi_sync: the embedding backward, overlapped
        self._beat("after_backward")
        return out

    @override
    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        # the closure runs training_step and backward first; their beats name those phases
        def closure_then_beat() -> Any:
            out = closure()
            self._beat("optimizer_step")
            return out

        return super().optimizer_step(optimizer, closure_then_beat, model, **kwargs)

    @override
    def on_train_end(self) -> None:
        self._step_boundary()  # the last step: no next batch closes it
        if self._input_pipeline is not None:
            self._input_pipeline.settle()
        super().on_train_end()

    @override
    def on_validation_start(self) -> None:
        super().on_validation_start()
        self._beat("validation_start")

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        self._beat("validation")
        return super().validation_step(*args, **kwargs)

    @override
    def on_validation_end(self) -> None:
        super().on_validation_end()
        self._beat("validation_end")

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._beat("barrier")  # a hang report names the collective a rank waits in
        super().barrier(*args, **kwargs)

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        self._beat("broadcast")
        return super().broadcast(obj, src)

    def _beat(self, phase: str, step: int | None = None) -> None:
        if self._guard is not None:
            self._guard.beat(phase, step)

    def _step_boundary(self) -> None:
        trainer = self._trainer()
        if self._guard is not None and trainer is not None:
            self._guard.step_boundary(trainer)

    def _trainer(self) -> pl.Trainer | None:
        module = self.lightning_module
        return getattr(module, "_trainer", None) if module is not None else None

    # -- checkpoints: sharded state (:mod:`rocmtrain.strategies.checkpointing`) -----------------
    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        return True  # shards must exist before loading into them

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        assert self.lightning_module is not None
        if self._input_pipeline is not None:
            self._input_pipeline.settle()  # the tables' last update may still be in flight
        return self.lightning_module.state_dict()

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        """Collective: every rank calls it (Lightning's ``trainer.save_checkpoint`` does)."""
        self._beat("checkpoint")  # the watchdog allows checkpoint_timeout_seconds for it
        checkpointing.save_sharded_checkpoint(
            self.dmp,
            checkpoint,
            Path(filepath),
            rank=self.global_rank,
            world_size=self.world_size,
            barrier=self.barrier,
        )

    @override
    def load_checkpoint(
        self, checkpoint_path: Any, weights_only: bool | None = None
    ) -> dict[str, Any]:
        assert self.lightning_module is not None
        return checkpointing.load_sharded_checkpoint(
            self.dmp,
            self.lightning_module,
            Path(checkpoint_path),
            trainer=self.lightning_module.trainer,
            rank=self.global_rank,
            world_size=self.world_size,
        )

    @override
    def load_model_state_dict(self, checkpoint: Any, strict: bool = True) -> None:
        pass  # loaded into the shards in load_checkpoint

    @override
    def remove_checkpoint(self, filepath: Any) -> None:
        checkpointing.remove_checkpoint(Path(filepath), rank=self.global_rank)

    # -- the end ---------------------------------------------------------------------------------
    @override
    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)
        if self._guard is not None:
            self._guard.on_exception(exception, self.global_rank)
        if isinstance(exception, Exception):
            lifecycle.end_launched_ranks(self.launcher)

    @override
    def teardown(self) -> None:
        """Finish the guard, restore the environment and release the plugins; the module stays
        where it is (:func:`rocmtrain.strategies.lifecycle.release_in_place` says why)."""
        if self._guard is not None:
            self._guard.finish()
        if self._input_pipeline is not None:
            self._input_pipeline.detach()  # the modules get their own forward back
        self._env.restore()
        lifecycle.release_in_place(self)

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
