"""``train(cfg) -> metrics``: build data, model, strategy, callbacks and fit. A plain function.

    from rocmtrain.config.schema import RunConfig
    from rocmtrain.train import train
    metrics = train(RunConfig())     # the dlrm_cpu defaults; returns the last epoch's metrics

Read top to bottom: :func:`train` validates ``cfg`` and answers the GPU question once
(:func:`rocmtrain.platform.placement`); :func:`run_training` checks the machine, builds the
strategy (which refuses a device it does not support), prepares the run dir, then builds data,
model and trainer (with :func:`rocmtrain.callbacks.build_callbacks`) and fits. The CLI, which has
validated ``cfg`` and computed the placement already, calls :func:`run_training` directly.

Every rank runs this function (Lightning re-runs the command line for ranks > 0). The run
auto-resumes from the newest complete checkpoint under ``cfg.checkpoint.dir`` (default
``<run_dir>/checkpoints``) unless ``checkpoint.resume=never``.

The run-time protection (collective environment, watchdog, timeouts, preemption, error hints)
lives in :class:`rocmtrain.strategies.TorchRecStrategy`, built by
:meth:`~rocmtrain.strategies.TorchRecStrategy.from_config` exactly as a user's own script would
use it; this function adds only the optional features (progress bar, checkpoints, monitor, grad
health) and the precision plugin.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

from rocmtrain import checkpoint as ckpt
from rocmtrain import platform
from rocmtrain.comms.shutdown import close_process_group
from rocmtrain.config.schema import RunConfig
from rocmtrain.platform import Placement
from rocmtrain.run_dirs import IN_USE, prepare_run_dir, put_back_metrics
from rocmtrain.strategies import TorchRecStrategy

__all__ = ["IN_USE", "HardwareError", "prepare_run_dir", "train", "run_training"]

log = logging.getLogger(__name__)


class HardwareError(RuntimeError):
    """The recipe needs hardware this machine does not have; the message says what to run."""


def placement_of(cfg: RunConfig) -> Placement:
    """The run's :class:`~rocmtrain.platform.Placement` from ``trainer.accelerator`` and
    ``strategy.backend`` (the process-group backend)."""
    return platform.placement(cfg.trainer.accelerator, cfg.strategy.backend)


def train(cfg: RunConfig) -> dict[str, float]:
    """Train ``cfg``; returns the last epoch's metrics (train/val loss, AUC, NE, samples/s)."""
    from rocmtrain.config.schema import validate_run_config

    validate_run_config(cfg)
    return run_training(cfg, placement_of(cfg))


def run_training(cfg: RunConfig, where: Placement) -> dict[str, float]:
    """Train a validated ``cfg`` placed at ``where``; returns the last epoch's metrics."""
    from rocmtrain.console import quiet_precision_hints

    quiet_precision_hints()  # the config sets the matmul precision on purpose
    _hand_over_early_signals(cfg)
    check_hardware(cfg, where)
    check_cpu_ranks(cfg, where)
    strategy = TorchRecStrategy.from_config(cfg)
    strategy.check_supported(where.device)
    run_dir = prepare_run_dir(cfg)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = build_datamodule(cfg)
    module = build_module(cfg, where)
    trainer = build_trainer(cfg, run_dir, strategy=strategy, where=where)
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_path(cfg))
    except ckpt.ResumeError:
        put_back_metrics(run_dir)  # nothing was trained: the folder stays as it was
        raise
    close_process_group(barrier=True)  # every rank gets here; end in step
    final = dict(module.history[-1]) if module.history else {}
    if trainer.is_global_zero and final:
        log.info("final metrics: %s", final)
    return final


# -- checks before anything starts -------------------------------------------------------------
def check_hardware(cfg: RunConfig, where: Placement | None = None) -> None:
    """Fail early, naming what is missing and the CPU recipe to try."""
    where = where or placement_of(cfg)
    t = cfg.trainer
    if not where.gpu:
        return
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


#: CPU ranks per core beyond which a local CPU run only oversubscribes the machine (a few ranks
#: per core still make a useful test of a larger world size)
CPU_RANKS_PER_CORE = 4


def check_cpu_ranks(cfg: RunConfig, where: Placement | None = None) -> None:
    """A local CPU run starts ``trainer.devices`` processes on this machine: refuse a count it
    cannot hold (the dry run too, whose planner would cost a topology of that size)."""
    from rocmtrain.config import ConfigError

    where = where or placement_of(cfg)
    t = cfg.trainer
    if cfg.cluster.kind != "local" or where.gpu:
        return
    cores = os.cpu_count() or 1
    most = CPU_RANKS_PER_CORE * cores
    if t.devices > most:
        raise ConfigError(
            "trainer.devices",
            t.devices,
            f"each CPU rank is a process on this machine, which has {cores} core(s); use at most "
            f"{most} (a larger world size: trainer.num_nodes, or cluster=slurm)",
        )


# -- the parts of the run ------------------------------------------------------------------------
def build_datamodule(cfg: RunConfig) -> pl.LightningDataModule:
    """The datamodule of ``cfg.data``, sized by the model's tables and features."""
    from rocmtrain.data import build_datamodule as build

    m = cfg.model
    return build(
        cfg.data,
        num_embeddings_per_feature=m.table_rows(),
        multi_hot_sizes=m.multi_hot_sizes,
        num_dense=m.num_dense_features,
        seed=cfg.seed,
    )


def build_module(cfg: RunConfig, where: Placement | None = None) -> pl.LightningModule:
    """``DLRMModule``: the strategy pipelines its input (and, for ``strategy.pipeline=semi_sync``,
    its embedding work) itself."""
    from rocmtrain.config.schema import resolve_model_config
    from rocmtrain.models.module import DLRMModule

    return DLRMModule(resolve_model_config(cfg, where or placement_of(cfg)))


def build_trainer(
    cfg: RunConfig,
    run_dir: Path,
    *,
    strategy: TorchRecStrategy | None = None,
    where: Placement | None = None,
    **overrides: Any,
) -> pl.Trainer:
    """The ``pl.Trainer`` of ``cfg`` (strategy, callbacks, plugins, logger in ``run_dir``)."""
    from pytorch_lightning.loggers import CSVLogger

    from rocmtrain.callbacks import build_callbacks

    where = where or placement_of(cfg)
    t = cfg.trainer
    kwargs: dict[str, Any] = dict(
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=strategy or TorchRecStrategy.from_config(cfg),
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
        callbacks=build_callbacks(cfg, run_dir),
        plugins=_precision_plugins(cfg, run_dir, where) + _cluster_plugins(),
    )
    kwargs.update(overrides)
    return pl.Trainer(**kwargs)


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
    root = Path(cfg.checkpoint.dir)
    found = ckpt.find_resume(root)
    if found is not None:
        log.info("resuming from %s", found)
        return str(found)
    skipped = ckpt.list_checkpoints(root)
    if skipped:  # each was named with its problem by find_resume; say what that means
        log.warning(
            "no intact checkpoint under %s (%d skipped): training starts again from step 0",
            root,
            len(skipped),
        )
    return None


# -- plugins and signals ------------------------------------------------------------------------
def _precision_plugins(cfg: RunConfig, run_dir: Path, where: Placement) -> list[Any]:
    """The precision plugin of ``cfg.precision`` for this run's device."""
    from rocmtrain.precision.plugin import build_precision_plugin

    return [build_precision_plugin(cfg.precision, run_dir=run_dir, device=where.device)]


def _hand_over_early_signals(cfg: RunConfig) -> None:
    """Signals held since start-up (``rocmtrain.faults.preemption.arm_early``) that this run's
    PreemptionCallback will not handle get their handlers back."""
    from rocmtrain.faults.preemption import disarm_early, handled_signals

    w = cfg.watchdog
    disarm_early(handled_signals(w) if w.preemption else [])


def _cluster_plugins() -> list[Any]:
    """Lightning's SLURMEnvironment inside a Slurm job (no auto-requeue: the batch script requeues)."""
    from rocmtrain.launch import cluster_environment

    env = cluster_environment()
    return [env] if env is not None else []
