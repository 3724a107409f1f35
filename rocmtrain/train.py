"""``train(cfg) -> metrics``: build data, model, strategy, callbacks and fit. A plain function.

    from rocmtrain.config.schema import RunConfig
    from rocmtrain.train import train
    metrics = train(RunConfig())     # the dlrm_cpu defaults; returns the last epoch's metrics

Every rank runs this function (Lightning re-runs the command line for ranks > 0). The run
auto-resumes from the newest complete checkpoint under ``cfg.checkpoint.dir`` (default
``<run_dir>/checkpoints``) unless ``checkpoint.resume=never``.

Integration points of the other areas are one small function each below (``_precision_plugins``,
``_watchdog_callbacks``, ``_monitor_callbacks``, ``_grad_health_callbacks``,
``_cluster_plugins``); the strategy calls the RCCL env and device binding itself.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from rocmtrain import checkpoint as ckpt
from rocmtrain import platform
from rocmtrain.config.schema import RunConfig

log = logging.getLogger(__name__)


class HardwareError(RuntimeError):
    """The recipe needs hardware this machine does not have; the message says what to run."""


def check_hardware(cfg: RunConfig) -> None:
    """Fail early, naming what is missing and the CPU recipe to try."""
    t = cfg.trainer
    if t.accelerator == "gpu" or cfg.strategy.backend == "nccl":
        have = platform.device_count() if platform.has_gpu() else 0
        if have < t.devices:
            build = "CPU-only" if not (platform.is_rocm() or platform.is_cuda_build()) else "GPU"
            raise HardwareError(
                f"recipe {cfg.recipe} needs {t.devices} GPU(s) per node (trainer.accelerator="
                f"{t.accelerator}, trainer.devices={t.devices}, strategy.backend="
                f"{cfg.strategy.backend}) but this machine has {have} visible GPU(s) "
                f"(torch {'.'.join(map(str, platform.torch_version()))}, {build} build). "
                "On a CPU machine run: python -m rocmtrain recipe=dlrm_cpu  "
                f"(or see this recipe's plan: python -m rocmtrain recipe={cfg.recipe} dry_run=true)"
            )


def train(cfg: RunConfig) -> dict[str, float]:
    """Train ``cfg``; returns the last epoch's metrics (train/val loss, AUC, NE, samples/s)."""
    from rocmtrain.config.schema import validate_run_config
    from rocmtrain.data import build_datamodule

    validate_run_config(cfg)
    _hand_over_early_signals(cfg)
    check_hardware(cfg)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    m = cfg.model
    datamodule = build_datamodule(
        cfg.data,
        num_embeddings_per_feature=m.table_rows(),
        multi_hot_sizes=m.multi_hot_sizes,
        num_dense=m.num_dense_features,
        seed=cfg.seed,
    )
    module = build_module(cfg)
    trainer = build_trainer(cfg, run_dir)
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume_path(cfg))
    final = dict(module.history[-1]) if module.history else {}
    if trainer.is_global_zero and final:
        log.info("final metrics: %s", final)
    return final


def use_pipeline(cfg: RunConfig) -> bool:
    """``strategy.pipeline``: sparse_dist, none, or auto (= sparse_dist on GPU)."""
    if cfg.strategy.pipeline == "auto":
        return cfg.trainer.accelerator == "gpu"
    return cfg.strategy.pipeline == "sparse_dist"


def build_module(cfg: RunConfig) -> pl.LightningModule:
    """``DLRMModule``, or ``PipelinedDLRMModule`` when the TorchRec train pipeline is on."""
    from rocmtrain.models.module import DLRMModule, PipelinedDLRMModule

    cls = PipelinedDLRMModule if use_pipeline(cfg) else DLRMModule
    return cls(cfg.model)


def build_trainer(cfg: RunConfig, run_dir: Path, **overrides: Any) -> pl.Trainer:
    """The ``pl.Trainer`` of ``cfg`` (strategy, callbacks, plugins, logger in ``run_dir``)."""
    from pytorch_lightning.callbacks import TQDMProgressBar
    from pytorch_lightning.loggers import CSVLogger

    t = cfg.trainer
    callbacks: list[pl.Callback] = []
    if t.progress_bar:
        callbacks.append(TQDMProgressBar(refresh_rate=t.progress_bar_refresh_steps))
    if cfg.checkpoint.enabled:
        callbacks.append(
            ckpt.AtomicCheckpoint(
                cfg.checkpoint.dir,
                every_n_train_steps=cfg.checkpoint.every_n_train_steps,
                every_n_epochs=cfg.checkpoint.every_n_epochs,
                keep_last=cfg.checkpoint.keep_last,
            )
        )
    callbacks += _watchdog_callbacks(cfg, run_dir)
    callbacks += _monitor_callbacks(cfg, run_dir)
    callbacks += _grad_health_callbacks(cfg)
    kwargs: dict[str, Any] = dict(
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=build_strategy(cfg),
        max_epochs=t.max_epochs,
        max_steps=t.max_steps,
        limit_train_batches=t.limit_train_batches,
        limit_val_batches=t.limit_val_batches,
        log_every_n_steps=t.log_every_n_steps,
        num_sanity_val_steps=t.num_sanity_val_steps,
        deterministic=t.deterministic or None,
        enable_progress_bar=t.progress_bar,
        enable_checkpointing=False,  # AtomicCheckpoint instead of ModelCheckpoint
        enable_model_summary=False,
        default_root_dir=str(run_dir),
        logger=CSVLogger(str(run_dir), name="logs", version=""),
        callbacks=callbacks,
        plugins=_precision_plugins(cfg, run_dir) + _cluster_plugins(),
    )
    kwargs.update(overrides)
    return pl.Trainer(**kwargs)


def build_strategy(cfg: RunConfig) -> pl.strategies.Strategy:
    """``TorchRecStrategy`` configured from ``cfg.strategy``/``cfg.rccl``/``cfg.kernel``."""
    from rocmtrain.models.dlrm import pooling_factors
    from rocmtrain.strategies import TorchRecStrategy

    s, m = cfg.strategy, cfg.model
    return TorchRecStrategy(
        sharding_type=s.sharding_type,
        per_table_sharding=dict(s.per_table_sharding),
        kernel=cfg.kernel,
        pooling_factors=pooling_factors(m),
        planner_batch_size=cfg.data.batch_size,
        hbm_cap_gb=s.hbm_cap_gb,
        ddr_cap_gb=s.ddr_cap_gb,
        rccl=cfg.rccl,
        run_dir=cfg.run_dir,
        timeout=timedelta(seconds=cfg.rccl.init_timeout_seconds),
        process_group_backend=None if s.backend == "auto" else s.backend,
    )


def resume_path(cfg: RunConfig) -> str | None:
    """The checkpoint to resume from: ``checkpoint.resume`` = auto | never | a path."""
    r = cfg.checkpoint.resume
    if r == "never":
        return None
    if r != "auto":
        if not ckpt.is_complete(Path(r)):
            raise FileNotFoundError(
                f"checkpoint.resume={r!r}: not a complete checkpoint folder; use auto, never, or "
                f"a folder with {ckpt.MARKER} (rocmtrain.checkpoint.find_resume picks one)"
            )
        return r
    found = ckpt.find_resume(Path(cfg.checkpoint.dir))
    if found is not None:
        log.info("resuming from %s", found)
        return str(found)
    return None


# -- integration points (one small function per area) ---------------------------------------------
def _precision_plugins(cfg: RunConfig, run_dir: Path) -> list[Any]:
    """rocmtrain.precision.plugin.build_precision_plugin (precision area)."""
    from rocmtrain.precision.plugin import build_precision_plugin

    device = "cuda" if cfg.trainer.accelerator == "gpu" else "cpu"
    return [build_precision_plugin(cfg.precision, run_dir=run_dir, device=device)]


def _watchdog_callbacks(cfg: RunConfig, run_dir: Path) -> list[pl.Callback]:
    """rocmtrain.faults.watchdog.build_callbacks (watchdog area)."""
    from rocmtrain.faults.watchdog import build_callbacks

    return build_callbacks(cfg.watchdog, cfg.rccl, run_dir)


def _monitor_callbacks(cfg: RunConfig, run_dir: Path) -> list[pl.Callback]:
    """rocmtrain.diagnostics.monitor.build_callbacks (diagnostics area)."""
    from rocmtrain.diagnostics.monitor import build_callbacks

    return build_callbacks(cfg.monitor, run_dir, profile=cfg.profile)


def _grad_health_callbacks(cfg: RunConfig) -> list[pl.Callback]:
    """rocmtrain.precision.grad_health.GradHealthCallback (precision area)."""
    from rocmtrain.precision.grad_health import GradHealthCallback

    gh = cfg.precision.grad_health
    return [GradHealthCallback.from_config(gh)] if gh.enabled else []


def _hand_over_early_signals(cfg: RunConfig) -> None:
    """Signals held since start-up (``rocmtrain.faults.preemption.arm_early``) that this run's
    PreemptionCallback will not handle get their default action back (watchdog area)."""
    from rocmtrain.faults.preemption import disarm_early

    w = cfg.watchdog
    disarm_early(list(w.preemption_signals) if w.preemption else [])


def _cluster_plugins() -> list[Any]:
    """rocmtrain.launch.cluster_environment (Slurm area): SLURMEnvironment inside a job."""
    from rocmtrain.launch import cluster_environment

    env = cluster_environment()
    return [env] if env is not None else []
