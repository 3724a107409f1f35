"""``train(cfg) -> metrics``: build data, model, strategy, callbacks and fit. A plain function.

    from rocmtrain.config.schema import RunConfig
from rocmtrain.strategies import TorchRecStrategy
    from rocmtrain.train import train
    metrics = train(RunConfig())     # the dlrm_cpu defaults; returns the last epoch's metrics

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
from rocmtrain.strategies import TorchRecStrategy

log = logging.getLogger(__name__)


class HardwareError(RuntimeError):
    """The recipe needs hardware this machine does not have; the message says what to run."""


def check_hardware(cfg: RunConfig) -> None:
    """Fail early, naming what is missing and the CPU recipe to try."""
    t = cfg.trainer
    if platform.is_gpu_run(t.accelerator, cfg.strategy.backend):
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


def check_cpu_ranks(cfg: RunConfig) -> None:
    """A local CPU run starts ``trainer.devices`` processes on this machine: refuse a count it
    cannot hold (the dry run too, whose planner would cost a topology of that size)."""
    from rocmtrain.config import ConfigError

    t = cfg.trainer
    if cfg.cluster.kind != "local" or platform.is_gpu_run(t.accelerator, cfg.strategy.backend):
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


def train(cfg: RunConfig) -> dict[str, float]:
    """Train ``cfg``; returns the last epoch's metrics (train/val loss, AUC, NE, samples/s)."""
    from rocmtrain.config.schema import validate_run_config
    from rocmtrain.console import quiet_precision_hints
    from rocmtrain.data import build_datamodule

    validate_run_config(cfg)
    quiet_precision_hints()  # the config sets the matmul precision on purpose
    _hand_over_early_signals(cfg)
    check_hardware(cfg)
    check_cpu_ranks(cfg)
    strategy = TorchRecStrategy.from_config(cfg)
    gpu = platform.is_gpu_run(cfg.trainer.accelerator, cfg.strategy.backend)
    strategy.check_supported("cuda" if gpu else "cpu")
    run_dir = prepare_run_dir(cfg)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    m = cfg.model
    datamodule = build_datamodule(
        cfg.data,
        num_embeddings_per_feature=m.table_rows(),
        multi_hot_sizes=m.multi_hot_sizes,
        num_dense=m.num_dense_features,
        seed=cfg.seed,
    )
    module = build_module(cfg, strategy)
    trainer = build_trainer(cfg, run_dir, strategy=strategy)
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_path(cfg))
    except ckpt.ResumeError:
        _put_back_metrics(run_dir)  # nothing was trained: the folder stays as it was
        raise
    close_process_group(barrier=True)  # every rank gets here; end in step
    final = dict(module.history[-1]) if module.history else {}
    if trainer.is_global_zero and final:
        log.info("final metrics: %s", final)
    return final


def prepare_run_dir(cfg: RunConfig) -> Path:
    """Create ``run_dir`` (checked writable before anything starts) and keep the metrics of an
    earlier attempt: Lightning's CSV logger deletes ``logs/metrics.csv`` when it starts."""
    from rocmtrain.config import ConfigError

    run_dir = Path(cfg.run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            "run_dir", cfg.run_dir, f"cannot write there ({exc.strerror}); choose a writable folder"
        ) from None
    if _launching_rank():
        from rocmtrain import run_lock

        other = run_lock.acquire(run_dir)
        if other is not None:
            raise ConfigError("run_dir", cfg.run_dir, f"{IN_USE.format(other)}")
    metrics = run_dir / "logs" / "metrics.csv"
    if _launching_rank() and metrics.is_file():
        n = 1
        while (kept := metrics.with_name(f"metrics.attempt{n}.csv")).exists():
            n += 1
        metrics.rename(kept)
        _KEPT_METRICS.append(kept)
        log.info("resume: the previous attempt's metrics are kept in %s", kept)
    return run_dir


#: the previous attempt's metrics.csv as this process renamed it (prepare_run_dir)
_KEPT_METRICS: list[Path] = []


def _put_back_metrics(run_dir: Path) -> None:
    """Undo prepare_run_dir's rename when the run could not resume (no new metrics written)."""
    metrics = run_dir / "logs" / "metrics.csv"
    while _KEPT_METRICS:
        kept = _KEPT_METRICS.pop()
        if kept.parent == metrics.parent and kept.is_file() and not metrics.exists():
            kept.rename(metrics)


#: the fix when another run holds the run dir (``{}``: who holds it)
IN_USE = (
    "another run ({}) is using this folder; wait for it to end, or give this run its own "
    "run_dir (leave run_dir out for runs/<recipe>/<date_time>)"
)


def _launching_rank() -> bool:
    """True in the process that launches the run (global rank 0 of Lightning, torchrun or Slurm)."""
    env = os.environ
    return int(env.get("RANK", env.get("SLURM_PROCID", env.get("LOCAL_RANK", "0"))) or 0) == 0


def build_module(cfg: RunConfig, strategy: TorchRecStrategy) -> pl.LightningModule:
    """``DLRMModule`` (the strategy pipelines its input itself), or ``PipelinedDLRMModule`` for
    ``strategy.pipeline=semi_sync`` (TorchRec's TrainPipelineSemiSync owns the data iterator)."""
    from rocmtrain.config.schema import resolve_model_config
    from rocmtrain.models.module import DLRMModule, PipelinedDLRMModule

    semi_sync = strategy.pipeline_kind(cfg.trainer.accelerator) == "semi_sync"
    return (PipelinedDLRMModule if semi_sync else DLRMModule)(resolve_model_config(cfg))


def build_trainer(
    cfg: RunConfig, run_dir: Path, *, strategy: TorchRecStrategy | None = None, **overrides: Any
) -> pl.Trainer:
    """The ``pl.Trainer`` of ``cfg`` (strategy, callbacks, plugins, logger in ``run_dir``)."""
    from pytorch_lightning.loggers import CSVLogger

    from rocmtrain.progress import HostMetricsProgressBar
    from rocmtrain.throughput import ThroughputCallback

    t = cfg.trainer
    callbacks: list[pl.Callback] = []
    if t.progress_bar:
        callbacks.append(HostMetricsProgressBar(refresh_rate=t.progress_bar_refresh_steps))
    if cfg.checkpoint.enabled:
        callbacks.append(
            ckpt.AtomicCheckpoint(
                cfg.checkpoint.dir,
                every_n_train_steps=cfg.checkpoint.every_n_train_steps,
                every_n_epochs=cfg.checkpoint.every_n_epochs,
                keep_last=cfg.checkpoint.keep_last,
            )
        )
    callbacks += _monitor_callbacks(cfg, run_dir)
    callbacks += _grad_health_callbacks(cfg)
    callbacks.append(
        ThroughputCallback(
            run_dir,
            warmup_steps=cfg.monitor.throughput_warmup_steps,
            sync_every=cfg.monitor.throughput_window_steps,
            batch_per_rank=cfg.data.batch_size,
        )
    )
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
        callbacks=callbacks,
        plugins=_precision_plugins(cfg, run_dir) + _cluster_plugins(),
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


# -- optional features and plugins ---------------------------------------------
def _precision_plugins(cfg: RunConfig, run_dir: Path) -> list[Any]:
    """The precision plugin of ``cfg.precision`` for this run's device."""
    from rocmtrain.precision.plugin import build_precision_plugin

    gpu = platform.is_gpu_run(cfg.trainer.accelerator, cfg.strategy.backend)
    device = "cuda" if gpu else "cpu"
    return [build_precision_plugin(cfg.precision, run_dir=run_dir, device=device)]


def _monitor_callbacks(cfg: RunConfig, run_dir: Path) -> list[pl.Callback]:
    """Device monitor, step-time statistics and the optional profiler."""
    from rocmtrain.diagnostics.monitor import build_callbacks

    return build_callbacks(cfg.monitor, run_dir, profile=cfg.profile)


def _grad_health_callbacks(cfg: RunConfig) -> list[pl.Callback]:
    """Per-group gradient norms; NaN/Inf steps named and skipped."""
    from rocmtrain.precision.grad_health import GradHealthCallback

    gh = cfg.precision.grad_health
    return [GradHealthCallback.from_config(gh)] if gh.enabled else []


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
