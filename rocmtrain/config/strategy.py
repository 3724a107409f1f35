"""Strategy schema: TorchRec sharding and the process-group backend; and the Python arguments of
``TorchRecStrategy`` (:class:`StrategyArguments`), checked where they enter.

python -m rocmtrain strategy.sharding_type=row_wise
python -m rocmtrain +strategy.per_table_sharding.t_cat_0=data_parallel   # one table
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocmtrain.config import ConfigError, check_choice
from rocmtrain.config.convert import as_config
from rocmtrain.config.rccl import RcclConfig
from rocmtrain.config.watchdog import WatchdogConfig

if TYPE_CHECKING:
    from rocmtrain.config.schema import RunConfig
    from rocmtrain.platform import Placement

SHARDING_TYPES = (
    "auto",
    "table_wise",
    "row_wise",
    "column_wise",
    "table_row_wise",
    "table_column_wise",
    "data_parallel",
)
PIPELINES = ("auto", "sparse_dist", "semi_sync", "none")
BALANCE_MODES = ("off", "report", "auto")
BACKENDS = ("auto", "gloo", "nccl")
#: embedding kernels (``kernel=``): TorchRec's FBGEMM TBE, rocmtrain's Triton kernels, its torch
#: reference; the one list every other module reads
KERNELS = ("fbgemm", "triton", "torch")


def check_per_table_sharding(field: str, per_table: object) -> None:
    """``{table: sharding_type}`` overrides: a mapping whose values name a concrete sharding
    (``auto`` means "no override", so it is not one)."""
    from collections.abc import Mapping

    if per_table is None:
        return
    if not isinstance(per_table, Mapping):
        raise ConfigError(field, per_table, "pass a dict (e.g. {'t_cat_0': 'row_wise'}) or None")
    for table, kind in per_table.items():
        check_choice(f"{field}.{table}", kind, SHARDING_TYPES[1:])


@dataclass
class StrategyConfig:
    """How ``TorchRecStrategy`` shards the embedding tables and talks between ranks."""

    sharding_type: str = "auto"
    """Sharding of every table: ``auto`` (TorchRec's planner chooses), ``table_wise``,
    ``row_wise``, ``column_wise``, ``table_row_wise``, ``table_column_wise``, ``data_parallel``."""
    per_table_sharding: dict[str, str] = field(default_factory=dict)
    """Per-table overrides ``{table_name: sharding_type}``; tables are named ``t_cat_<i>``
    (command line: ``+strategy.per_table_sharding.t_cat_0=row_wise``)."""
    balance: str = "report"
    """Per-rank cost of the sharding plan (lookup bytes per sample from the pooling factors,
    and table memory): ``off``; ``report`` (printed in the dry run, logged on rank 0);
    ``auto`` (as report, and when a rank's lookup cost or memory is more than 10 % off the
    mean, the heaviest tables are split over all ranks, row-wise, or column-wise where the
    sharders offer no row-wise, and the rest placed table-wise by cost, until it is within)."""
    pipeline: str = "auto"
    """What overlaps the step: ``sparse_dist`` (batch i+1's copy and input all-to-all under
    batch i; exact), ``semi_sync`` (also the embedding work: batch i+1's lookup under batch i's
    dense backward and batch i's embedding backward under batch i+1's dense forward, on a side
    stream, so batch i+1 reads embeddings without batch i's update: TorchRec's semi-synchronous
    training), ``none`` (plain Lightning loop), ``auto`` (sparse_dist on GPU, none on CPU).
    A module that drives TorchRec's own pipeline classes gets them from
    ``TorchRecStrategy.make_train_pipeline`` (``TrainPipelineSparseDist``/``SemiSync``)."""
    semi_sync_start_batch: int = 0
    """With ``pipeline=semi_sync``: batches trained fully synchronously before the one-step
    stale lookups start (TorchRec's own default is 900; a few hundred can help early NE)."""
    backend: str = "auto"
    """Process-group backend: ``gloo`` (CPU), ``nccl`` (CUDA; RCCL on ROCm), ``auto``."""
    hbm_cap_gb: float | None = None
    """Per-device memory the planner may use (GiB); ``null`` = the device's (queried on GPU,
    TorchRec's default when planning without one, e.g. in a dry run)."""
    ddr_cap_gb: float | None = None
    """Per-rank host memory the planner may use for CPU ranks (GiB); ``null`` = TorchRec default."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` for an unusable value (field, value and fix named)."""
        check_choice("strategy.sharding_type", self.sharding_type, SHARDING_TYPES)
        check_per_table_sharding("strategy.per_table_sharding", self.per_table_sharding)
        check_choice("strategy.pipeline", self.pipeline, PIPELINES)
        check_choice("strategy.balance", self.balance, BALANCE_MODES)
        if self.semi_sync_start_batch < 0:
            raise ConfigError(
                "strategy.semi_sync_start_batch",
                self.semi_sync_start_batch,
                "use 0 (stale lookups from the first batch) or a positive batch count",
            )
        check_choice("strategy.backend", self.backend, BACKENDS)
        for name in ("hbm_cap_gb", "ddr_cap_gb"):
            check_memory_cap(f"strategy.{name}", getattr(self, name))


def check_memory_cap(field: str, value: object) -> None:
    """A planner memory cap: None, or a positive, finite number of GiB."""
    if value is None:
        return
    if not _is_number(value) or not 0 < value < float("inf"):  # type: ignore[operator]
        raise ConfigError(field, value, "use a positive size in GiB (e.g. 64) or None")


def _is_number(value: object) -> bool:
    import numbers

    return isinstance(value, numbers.Real) and not isinstance(value, bool)


#: process start methods under which TorchRec's sharded modules work: ``fork`` (and forkserver)
#: would pickle the trainer's module into the child, which a sharded TorchRec model cannot do
START_METHODS = ("popen", "spawn")


def check_strategy_arguments(
    *,
    sharding_type: object,
    kernel: object,
    pipeline: object,
    balance: object,
    per_table_sharding: object,
    planner_batch_size: object,
    semi_sync_start_batch: object,
    pooling_factors: object,
    hbm_cap_gb: object,
    ddr_cap_gb: object,
    fused_params: object,
    ddp_kwargs: object,
    run_dir: object,
    start_method: object,
) -> None:
    """Types and values of ``TorchRecStrategy``'s Python arguments, checked where they enter
    (the CLI's values are typed by the schema already): one :class:`ConfigError` each."""
    import numbers
    import os
    from collections.abc import Mapping

    check_choice("sharding_type", sharding_type, SHARDING_TYPES)
    check_choice("kernel", kernel, KERNELS)
    check_choice("pipeline", pipeline, PIPELINES)
    check_choice("balance", balance, BALANCE_MODES)
    check_per_table_sharding("per_table_sharding", per_table_sharding)
    for name, value in (
        ("pooling_factors", pooling_factors),
        ("fused_params", fused_params),
        ("ddp_kwargs", ddp_kwargs),
    ):
        if value is not None and not isinstance(value, Mapping):
            raise ConfigError(name, value, "pass a dict (e.g. {'t_cat_0': ...}) or None")
    for table, factor in (pooling_factors or {}).items():  # type: ignore[attr-defined]
        if not _is_number(factor) or factor <= 0:
            raise ConfigError(f"pooling_factors.{table}", factor, "use a positive number of ids")
    if planner_batch_size is not None and (
        not isinstance(planner_batch_size, numbers.Integral)
        or isinstance(planner_batch_size, bool)
        or planner_batch_size < 1
    ):
        raise ConfigError(
            "planner_batch_size", planner_batch_size, "use a positive int (per-rank batch) or None"
        )
    if (
        not isinstance(semi_sync_start_batch, int)
        or isinstance(semi_sync_start_batch, bool)
        or semi_sync_start_batch < 0
    ):
        raise ConfigError(
            "semi_sync_start_batch", semi_sync_start_batch, "use 0 or a positive batch count"
        )
    check_memory_cap("hbm_cap_gb", hbm_cap_gb)
    check_memory_cap("ddr_cap_gb", ddr_cap_gb)
    if run_dir == "" or (run_dir is not None and not isinstance(run_dir, (str, os.PathLike))):
        raise ConfigError("run_dir", run_dir, "pass a folder path (str or pathlib.Path) or None")
    check_choice("start_method", start_method, START_METHODS)


@dataclass
class StrategyArguments:
    """``TorchRecStrategy``'s own arguments (the rest are Lightning's ``DDPStrategy``'s).

    Checked and normalised at construction, so a bad value raises one :class:`ConfigError`
    naming the field before any rank starts; afterwards ``rccl`` and ``watchdog`` are configs,
    the mappings are dicts and ``run_dir`` is a ``Path`` (or None).
    """

    sharding_type: str = "auto"
    """Every table's sharding: ``auto`` (planner's choice), ``table_wise``, ``row_wise``,
    ``column_wise``, ``table_row_wise``, ``table_column_wise``, ``data_parallel``."""
    per_table_sharding: dict[str, str] | None = None
    """``{table_name: sharding_type}`` overrides."""
    kernel: str = "fbgemm"
    """Embedding kernels: ``fbgemm`` (TorchRec/FBGEMM TBE), ``triton`` or ``torch`` (rocmtrain's
    TBE, ``EmbeddingComputeKernel.CUSTOMIZED_KERNEL``)."""
    pipeline: str = "auto"
    """``auto`` | ``sparse_dist`` | ``semi_sync`` | ``none``: whether the next batch's copy and
    input all-to-all overlap compute (``auto`` = on GPU; :meth:`uses_pipeline`); ``semi_sync``
    also runs the embedding work on a side stream under the dense work (batch i+1 looked up
    before batch i's embedding update: one step stale; ``rocmtrain.strategies.input_pipeline``)."""
    semi_sync_start_batch: int = 0
    """With ``pipeline="semi_sync"``, synchronous batches first."""
    balance: str = "report"
    """``off`` | ``report`` | ``auto``: per-rank lookup cost and memory of the plan
    (``TorchRecStrategy.balance_report``); ``auto`` replaces a plan more than 10 % off the mean
    by a balanced one (:func:`rocmtrain.strategies.balance.balanced_plan`)."""
    rccl: Any = None
    """Collective environment and process-group timeouts: an ``RcclConfig``, a mapping of its
    fields, or a preset name of ``configs/rccl/`` (``None`` = defaults: no collective knob set,
    the environment still checked)."""
    watchdog: Any = field(default_factory=WatchdogConfig)
    """Hang watchdog, preemption and error hints: a ``WatchdogConfig``, a mapping of its fields,
    or ``None`` to switch the hang watchdog off (hints, preemption and the two-phase timeouts
    stay, as their own fields say)."""
    run_dir: Any = None
    """Where hang reports, flight-recorder dumps and error hints go; default the trainer's
    ``default_root_dir``."""
    planner_batch_size: int | None = None
    """Per-rank batch the planner costs; default the datamodule's ``batch_size`` (a warning
    names the fallback when there is none)."""
    pooling_factors: dict[str, float] | None = None
    """Expected ids per sample per table (multi-hot) for the planner."""
    hbm_cap_gb: float | None = None
    """Per-rank device memory the planner may use (GiB)."""
    ddr_cap_gb: float | None = None
    """Per-rank host memory the planner may use (GiB)."""
    plan: Any = None
    """A ready ``ShardingPlan`` (skips the planner)."""
    fused_params: dict[str, Any] | None = None
    """FBGEMM fused-optimizer parameters for the sharders."""
    ddp_kwargs: dict[str, Any] | None = None
    """For the dense part's DDP: ``bucket_cap_mb``, ``static_graph``, ``find_unused_parameters``
    and any ``DistributedDataParallel`` argument."""
    start_method: str = "popen"
    """How Lightning starts the local ranks: ``popen`` or ``spawn`` (:data:`START_METHODS`)."""

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> StrategyArguments:
        """The fields' values out of ``arguments`` (``TorchRecStrategy.__init__``'s ``locals()``:
        its keywords carry the fields' names, so the signature stays the one place they are
        listed for a caller)."""
        return cls(**{f.name: arguments[f.name] for f in fields(cls)})

    def __post_init__(self) -> None:
        checked = inspect.signature(check_strategy_arguments).parameters
        check_strategy_arguments(**{name: getattr(self, name) for name in checked})
        self.rccl = as_config(self.rccl, RcclConfig, field="rccl", group="rccl")
        self.watchdog = (
            WatchdogConfig(enabled=False)
            if self.watchdog is None
            else as_config(self.watchdog, WatchdogConfig, field="watchdog", group="watchdog")
        )
        self.per_table_sharding = dict(self.per_table_sharding or {})
        self.pooling_factors = dict(self.pooling_factors) if self.pooling_factors else None
        self.ddp_kwargs = dict(self.ddp_kwargs or {})
        self.run_dir = Path(self.run_dir) if self.run_dir is not None else None

    def uses_pipeline(self, accelerator: str | Placement) -> bool:
        """``pipeline`` resolved: ``sparse_dist`` / ``semi_sync`` (pipelined), ``none``, or
        ``auto`` = on a GPU run (a run's Placement has answered that already: no second ask)."""
        from rocmtrain import platform  # imports torch; the configs alone do not

        if self.pipeline == "auto":
            if isinstance(accelerator, platform.Placement):
                return accelerator.gpu
            return platform.is_gpu_run(accelerator)
        return self.pipeline in ("sparse_dist", "semi_sync")

    def pipeline_kind(self, accelerator: str | Placement) -> str | None:
        """The train pipeline on ``accelerator``: ``sparse_dist``, ``semi_sync`` or ``None``."""
        if not self.uses_pipeline(accelerator):
            return None
        return "semi_sync" if self.pipeline == "semi_sync" else "sparse_dist"


def strategy_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """``TorchRecStrategy``'s keyword arguments for a composed run config."""
    s = cfg.strategy
    return {
        "sharding_type": s.sharding_type,
        "per_table_sharding": dict(s.per_table_sharding),
        "kernel": cfg.kernel,
        "pipeline": s.pipeline,
        "semi_sync_start_batch": s.semi_sync_start_batch,
        "balance": s.balance,
        "rccl": cfg.rccl,
        "watchdog": cfg.watchdog,
        "run_dir": cfg.run_dir,
        "planner_batch_size": cfg.data.batch_size,
        "pooling_factors": cfg.model.pooling_factors(),
        "hbm_cap_gb": s.hbm_cap_gb,
        "ddr_cap_gb": s.ddr_cap_gb,
        "process_group_backend": None if s.backend == "auto" else s.backend,
    }
