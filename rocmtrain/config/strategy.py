"""Strategy schema: TorchRec sharding and the process-group backend.

python -m rocmtrain strategy.sharding_type=row_wise
python -m rocmtrain +strategy.per_table_sharding.t_cat_0=data_parallel   # one table
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rocmtrain.config import ConfigError, check_choice

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
