"""Root run configuration ``RunConfig`` and its registration in Hydra's ConfigStore.

The primary config ``configs/rocmtrain.yaml`` starts from the structured :class:`RunConfig`
(stored as ``rocmtrain_schema``), so every value merged from ``configs/<group>/*.yaml``, ``recipes/*.yaml`` or the command line is type-checked
against the dataclasses at compose time: ``model.embeding_dim=8`` or ``trainer.devices=two``
fails naming the field. Recipes are stored as group ``recipe`` with package ``_global_``, so a
recipe is an overlay that picks group options and overrides values::

    python -m rocmtrain recipe=dlrm_mi300 dry_run=true
    python -m rocmtrain --cfg job                      # print the composed config
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from rocmtrain.config.checkpoint import CheckpointConfig
from rocmtrain.config.cluster import ClusterConfig
from rocmtrain.config.data import DataConfig
from rocmtrain.config.model import ModelConfig
from rocmtrain.config.monitor import MonitorConfig
from rocmtrain.config.precision import PrecisionConfig
from rocmtrain.config.rccl import RcclConfig
from rocmtrain.config.strategy import KERNELS, StrategyConfig
from rocmtrain.config.trainer import TrainerConfig
from rocmtrain.config.watchdog import WatchdogConfig

if TYPE_CHECKING:
    from rocmtrain.platform import Placement

PRIMARY_CONFIG = "rocmtrain"
SCHEMA_NAME = "rocmtrain_schema"
DEFAULT_RECIPE = "dlrm_cpu"


@dataclass
class RunConfig:
    """One training run: what to train, on what, how, and where its artefacts go."""

    recipe: str = DEFAULT_RECIPE
    """Name of the recipe this config came from (each recipe sets it to its own name)."""
    seed: int = 1234
    """Seed of model init, data and Lightning (``seed_everything``)."""
    dry_run: bool = False
    """Print the plan (world size, sharding per table, env vars, launch command) and exit."""
    profile: bool = False
    """Attach the torch.profiler callback (diagnostics) and write traces into ``run_dir``."""
    kernel: str = "fbgemm"
    """Embedding kernels: ``fbgemm`` (TorchRec's default FBGEMM TBE), ``triton`` or ``torch``
    (rocmtrain's TBE through ``rocmtrain.embedding.get_sharders``)."""
    run_dir: str = "runs/${recipe}/${now:%Y-%m-%d_%H-%M-%S}"
    """Folder of this run's artefacts (logs, checkpoints, reports); stable across a requeue."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """DLRM architecture and optimizers."""
    data: DataConfig = field(default_factory=DataConfig)
    """Data source and per-rank batching."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Lightning Trainer settings (devices, epochs)."""
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    """TorchRec sharding and process-group backend."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Atomic checkpoints and auto-resume."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Numerics (Lightning precision plugin, accumulators)."""
    rccl: RcclConfig = field(default_factory=RcclConfig)
    """RCCL/NCCL environment and process-group timeouts."""
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    """Hang detection and preemption handling."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Where ranks run (local processes or a Slurm job)."""
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    """Device monitoring and step-time statistics."""

    @property
    def world_size(self) -> int:
        """Ranks of the run: ``trainer.devices * trainer.num_nodes``."""
        return self.trainer.devices * self.trainer.num_nodes


def package_root() -> Path:
    """Folder holding ``configs/`` and ``recipes/``: the source checkout, or the installed copy.

    A wheel ships them as ``rocmtrain/_conf/{configs,recipes}``; a source checkout (editable
    install included) uses the top-level folders next to ``rocmtrain/``.
    """
    pkg = Path(__file__).resolve().parents[1]
    shipped = pkg / "_conf"
    if (shipped / "configs").is_dir():
        return shipped
    return pkg.parent


def configs_dir() -> Path:
    return package_root() / "configs"


def recipes_dir() -> Path:
    return package_root() / "recipes"


def available_recipes() -> list[str]:
    return sorted(p.stem for p in recipes_dir().glob("*.yaml"))


def per_rank_batch(global_batch: int, *, _root_: Any) -> int:
    """Resolver ``${per_rank_batch:65536}``: a global batch split over ``trainer.devices x
    trainer.num_nodes`` ranks (recipes that fix the global batch, e.g. MLPerf's 65536)."""
    from rocmtrain.config import ConfigError

    ranks = int(_root_.trainer.devices) * int(_root_.trainer.num_nodes)
    if ranks < 1 or global_batch % ranks:
        raise ConfigError(
            "data.batch_size",
            f"per_rank_batch:{global_batch} over {ranks} rank(s)",
            "the global batch must divide evenly over trainer.devices x trainer.num_nodes; "
            "set data.batch_size=<per-rank batch> explicitly",
        )
    return global_batch // ranks


def register_configs() -> None:
    """Store the primary schema and every ``recipes/*.yaml`` in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    if not OmegaConf.has_resolver("per_rank_batch"):
        OmegaConf.register_new_resolver("per_rank_batch", per_rank_batch)

    cs = ConfigStore.instance()
    cs.store(name=SCHEMA_NAME, node=RunConfig)
    for path in sorted(recipes_dir().glob("*.yaml")):
        cs.store(group="recipe", name=path.stem, node=OmegaConf.load(path), package="_global_")


def to_run_config(cfg: Any) -> RunConfig:
    """Turn a composed DictConfig into a :class:`RunConfig` object (interpolations resolved)."""
    if isinstance(cfg, RunConfig):
        return cfg
    obj = OmegaConf.to_object(cfg)
    assert isinstance(obj, RunConfig), type(obj)
    return obj


def resolve_model_config(cfg: RunConfig, where: Placement | None = None) -> ModelConfig:
    """``cfg.model`` with the run-dependent values made concrete.

    ``model.embedding_output_dtype=autocast`` becomes the autocast dtype (bf16 for ``bf16-mixed``,
    fp16 for ``16-mixed``) when the interaction, the first consumer of the pooled embeddings, runs
    under autocast on a GPU — it would round them to that dtype at its first GEMM anyway — and
    fp32 otherwise (an fp32 run, an fp32 interaction, or the CPU, where FBGEMM's kernels write no
    bf16 pooled output). ``where``, the run's placement, says whether it is a GPU run; without
    it :func:`rocmtrain.platform.is_gpu_run` is asked. ``model.embedding_bounds_check=auto``
    becomes ``off`` where the run's data make every id a row of its table
    (:meth:`DataConfig.ids_in_range <rocmtrain.config.data.DataConfig.ids_in_range>`), else ``on``.
    """
    import dataclasses

    from rocmtrain import platform

    model = cfg.model
    if model.embedding_output_dtype == "autocast":
        low = {"bf16-mixed": "bf16", "16-mixed": "fp16"}.get(cfg.precision.mode)
        autocast_interaction = cfg.precision.policy.interaction == "autocast"
        gpu = where.gpu if where else platform.is_gpu_run(cfg.trainer.accelerator)
        dtype = low if low and autocast_interaction and gpu else "fp32"
        model = dataclasses.replace(model, embedding_output_dtype=dtype)
    if model.embedding_bounds_check == "auto":
        in_range = cfg.data.ids_in_range(model.table_rows())
        model = dataclasses.replace(model, embedding_bounds_check="off" if in_range else "on")
    return model


def validate_run_config(cfg: RunConfig) -> None:
    """Check every value a run needs before anything heavy starts (no data files are read).

    Raises :class:`rocmtrain.config.ConfigError` naming the field, the value and the fix.
    """
    from rocmtrain.config import ConfigError, check_choice

    check_choice("kernel", cfg.kernel, KERNELS)
    for name, value in (("run_dir", cfg.run_dir), ("checkpoint.dir", cfg.checkpoint.dir)):
        if not str(value).strip():  # Path("") is the current folder, wherever that is
            raise ConfigError(
                name, value, "name a folder of this run (run_dir=runs/my_run); empty is not one"
            )
    if cfg.kernel != "fbgemm":  # rocmtrain's TBE implements a subset of FBGEMM's optimizers
        from rocmtrain.embedding import SUPPORTED_EMBEDDING_OPTIMIZERS as ours

        if cfg.model.embedding_optimizer not in ours:
            raise ConfigError(
                "model.embedding_optimizer",
                cfg.model.embedding_optimizer,
                f"kernel={cfg.kernel} supports {', '.join(ours)}; use "
                "model.embedding_optimizer=rowwise_adagrad or kernel=fbgemm",
            )
    # each group (model, data, cluster, trainer, strategy, checkpoint, rccl, watchdog) checked
    # its own values when it was built; what is left spans groups
    names = {f"t_cat_{i}" for i in range(cfg.model.num_features)}
    unknown = sorted(set(cfg.strategy.per_table_sharding) - names)
    if unknown:
        raise ConfigError(
            "strategy.per_table_sharding",
            unknown,
            f"tables are named t_cat_0 .. t_cat_{cfg.model.num_features - 1}",
        )
    if cfg.data.batch_size < 1:
        raise ConfigError("data.batch_size", cfg.data.batch_size, "use a positive per-rank batch")
