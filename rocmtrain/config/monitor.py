"""Device monitoring / profiling schema.

``monitor.*`` keys configure :func:`rocmtrain.diagnostics.monitor.build_callbacks`; the root field
``profile=true`` switches the profiler window below on. Example::

    python -m rocmtrain recipe=dlrm_cpu monitor.interval_seconds=0.5 monitor.png=false
    python -m rocmtrain recipe=dlrm_mi300 profile=true monitor.profiler_active_steps=5
"""

from __future__ import annotations

from dataclasses import dataclass

from rocmtrain.config import ConfigError


@dataclass
class MonitorConfig:
    """Per-device utilisation/memory/power monitoring, step-time statistics and the profiler window."""

    enabled: bool = True
    """Attach the device-monitor + step-time callback."""

    interval_seconds: float = 1.0
    """Seconds between device samples (a background thread reads amdsmi / NVML / nvidia-smi)."""

    log_every_n_steps: int = 10
    """Log step-time and device metrics to the Lightning loggers every N training steps."""

    warmup_steps: int = 2
    """Steps excluded from the step-time statistics (compilation, allocator and cache warm-up)."""

    memory_headroom_fraction: float = 0.10
    """Fraction of device memory that should stay free; the monitor and ``doctor`` warn below it."""

    png: bool = True
    """Write ``<run_dir>/monitor/monitor.png`` (step time and memory over time) at the end of fit."""

    sync_cuda: bool = False
    """Synchronize the GPU at each step end so step times are exact (costs throughput; debugging)."""

    profiler_wait_steps: int = 5
    """``profile=true``: steps to skip before the profiler starts warming up."""

    profiler_warmup_steps: int = 2
    """``profile=true``: profiled-but-discarded steps before recording."""

    profiler_active_steps: int = 3
    """``profile=true``: steps recorded into the trace and the top-kernels table."""

    profiler_record_shapes: bool = False
    """``profile=true``: record operator input shapes (bigger trace)."""

    profiler_top_k: int = 25
    """``profile=true``: rows in the top-kernels table."""

    sync_report_steps: int = 0
    """Record every host-device sync of this many training steps with the Python line that caused
    it (``<run_dir>/syncs/``; GPU runs; :mod:`rocmtrain.diagnostics.syncs`). 0 = off."""

    sync_report_start_step: int = 10
    """``sync_report_steps``: the optimizer step to start at (after warm-up)."""

    throughput_warmup_steps: int = 15
    """Training steps (from the start of the fit) left out of the steady-state samples/s that the
    epoch line prints and ``<run_dir>/throughput.json`` holds (compilation, CUDA-graph capture,
    pipeline fill). Always on: the clock costs no host sync on a GPU (:mod:`rocmtrain.throughput`)."""

    throughput_window_steps: int = 5
    """Steps per throughput window; the steady rate is the median window rate."""

    def __post_init__(self) -> None:
        checks = {
            "throughput_warmup_steps": self.throughput_warmup_steps >= 0,
            "throughput_window_steps": self.throughput_window_steps >= 1,
            "sync_report_steps": self.sync_report_steps >= 0,
            "sync_report_start_step": self.sync_report_start_step >= 0,
            "interval_seconds": self.interval_seconds > 0,
            "log_every_n_steps": self.log_every_n_steps >= 1,
            "warmup_steps": self.warmup_steps >= 0,
            "memory_headroom_fraction": 0.0 <= self.memory_headroom_fraction < 1.0,
            "profiler_wait_steps": self.profiler_wait_steps >= 0,
            "profiler_warmup_steps": self.profiler_warmup_steps >= 0,
            "profiler_active_steps": self.profiler_active_steps >= 1,
            "profiler_top_k": self.profiler_top_k >= 1,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            values = ", ".join(f"monitor.{n}={getattr(self, n)!r}" for n in bad)
            raise ConfigError(
                f"invalid monitor config: {values}; need interval_seconds > 0, "
                "log_every_n_steps >= 1, 0 <= memory_headroom_fraction < 1, "
                "profiler_active_steps >= 1, other step counts >= 0"
            )
