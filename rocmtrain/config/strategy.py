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


@dataclass
class StrategyConfig:
    """How ``TorchRecStrategy`` shards the embedding tables and talks between ranks."""

    name: str = "torchrec"
    """Registered strategy name (see ``rocmtrain.strategies``); only ``torchrec`` is built in."""
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
    """Input-dist/compute overlap: ``sparse_dist`` (TorchRec TrainPipelineSparseDist, GPU),
    ``semi_sync`` (TorchRec TrainPipelineSemiSync: the embedding lookup of batch i+1 overlaps
    batch i's dense backward, so batch i+1 reads embeddings without batch i's update),
    ``none`` (plain Lightning loop), ``auto`` (sparse_dist on GPU, none on CPU)."""
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

    def validate(self) -> None:
        """Raise :class:`ConfigError` for an unusable value (field, value and fix named)."""
        check_choice("strategy.name", self.name, ("torchrec",))
        check_choice("strategy.sharding_type", self.sharding_type, SHARDING_TYPES)
        for table, kind in self.per_table_sharding.items():
            check_choice(f"strategy.per_table_sharding.{table}", kind, SHARDING_TYPES[1:])
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
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"strategy.{name}", value, "use a positive size in GiB or null")
