"""The training callbacks of a run, one module each, and :func:`build_callbacks`, the one place
that picks them from a :class:`~rocmtrain.config.schema.RunConfig`.

- :mod:`~rocmtrain.callbacks.progress`: ``HostMetricsProgressBar`` (no host sync per step)
- :mod:`~rocmtrain.callbacks.checkpoint`: ``AtomicCheckpoint`` (atomic sharded checkpoints)
- :mod:`~rocmtrain.callbacks.monitor`: ``DeviceMonitor`` (device samples, step-time statistics)
- :mod:`~rocmtrain.callbacks.profiling`: ``ProfilerCallback`` (``profile=true``)
- :mod:`~rocmtrain.callbacks.syncs`: ``SyncReportCallback`` (``monitor.sync_report_steps``)
- :mod:`~rocmtrain.callbacks.grad_health`: ``GradHealthCallback`` (grad norms, NaN/Inf steps)
- :mod:`~rocmtrain.callbacks.throughput`: ``ThroughputCallback`` (steady-state samples/s)

Run-time protection (watchdog, timeouts, preemption) is not here: the strategy owns it.
Submodules are imported on use, so importing this package is cheap.

    from rocmtrain.callbacks import build_callbacks
    trainer = pl.Trainer(callbacks=build_callbacks(cfg, run_dir))
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytorch_lightning as pl

    from rocmtrain.config.monitor import MonitorConfig
    from rocmtrain.config.schema import RunConfig


def build_callbacks(cfg: RunConfig, run_dir: Path) -> list[pl.Callback]:
    """Every training callback ``cfg`` asks for, in the order they run: progress bar,
    checkpoints, monitor / profiler / sync report, grad health, throughput (always on)."""
    from rocmtrain.callbacks.throughput import ThroughputCallback

    callbacks = _progress_callbacks(cfg) + _checkpoint_callbacks(cfg)
    callbacks += monitor_callbacks(cfg.monitor, run_dir, profile=cfg.profile)
    callbacks += _grad_health_callbacks(cfg)
    callbacks.append(
        ThroughputCallback(
            run_dir,
            warmup_steps=cfg.monitor.throughput_warmup_steps,
            sync_every=cfg.monitor.throughput_window_steps,
            batch_per_rank=cfg.data.batch_size,
        )
    )
    return callbacks


def monitor_callbacks(cfg: MonitorConfig, run_dir: Path, *, profile: bool) -> list[pl.Callback]:
    """The diagnostics callbacks of a run: device monitor (if enabled), profiler (if
    ``profile``), sync report (if ``sync_report_steps``)."""
    callbacks: list[pl.Callback] = []
    if cfg.enabled:
        from rocmtrain.callbacks.monitor import DeviceMonitor

        callbacks.append(DeviceMonitor(cfg, Path(run_dir)))
    if profile:
        from rocmtrain.callbacks.profiling import ProfilerCallback

        callbacks.append(ProfilerCallback(cfg, Path(run_dir)))
    if cfg.sync_report_steps:
        from rocmtrain.callbacks.syncs import SyncReportCallback

        callbacks.append(
            SyncReportCallback(
                Path(run_dir), start_step=cfg.sync_report_start_step, steps=cfg.sync_report_steps
            )
        )
    return callbacks


def _progress_callbacks(cfg: RunConfig) -> list[pl.Callback]:
    """The progress bar that reads its numbers on the host (``trainer.progress_bar``)."""
    if not cfg.trainer.progress_bar:
        return []
    from rocmtrain.callbacks.progress import HostMetricsProgressBar

    return [HostMetricsProgressBar(refresh_rate=cfg.trainer.progress_bar_refresh_steps)]


def _checkpoint_callbacks(cfg: RunConfig) -> list[pl.Callback]:
    """Atomic sharded checkpoints (``checkpoint.enabled``)."""
    c = cfg.checkpoint
    if not c.enabled:
        return []
    from rocmtrain.callbacks.checkpoint import AtomicCheckpoint

    return [
        AtomicCheckpoint(
            c.dir,
            every_n_train_steps=c.every_n_train_steps,
            every_n_epochs=c.every_n_epochs,
            keep_last=c.keep_last,
        )
    ]


def _grad_health_callbacks(cfg: RunConfig) -> list[pl.Callback]:
    """Per-group gradient norms; NaN/Inf steps named and skipped (``precision.grad_health``)."""
    gh = cfg.precision.grad_health
    if not gh.enabled:
        return []
    from rocmtrain.callbacks.grad_health import GradHealthCallback

    return [GradHealthCallback.from_config(gh)]
