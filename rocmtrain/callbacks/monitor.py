"""Device monitoring + step-time statistics as a callback.

    from rocmtrain.callbacks.monitor import DeviceMonitor
    trainer = pl.Trainer(callbacks=[DeviceMonitor(cfg.monitor, run_dir)])

What :class:`DeviceMonitor` does:

- every ``log_every_n_steps`` logs through the Lightning loggers: ``monitor/step_time_ms`` (mean
  over the window) and, on a GPU, ``gpu{i}/util_pct``, ``gpu{i}/hbm_used_gib``, ``gpu{i}/hbm_total_gib``,
  ``gpu{i}/power_w``, ``gpu{i}/temp_c`` and PCIe/XGMI bytes/s where the library reports them
  (amdsmi on ROCm, NVML or nvidia-smi on NVIDIA; sampled by a background thread every
  ``interval_seconds`` on local rank 0 of each node);
- at the end: ``monitor/step_time_{mean,p50,p99,std}_ms`` and ``monitor/step_time_jitter``
  (std / mean) over the steps after ``warmup_steps``, written to ``<run_dir>/monitor/step_stats.json``,
  and ``<run_dir>/monitor/monitor.png`` (step time and memory over time: HBM on GPU, host RSS on CPU);
- on a CPU-only machine it logs one info line and samples no device.

Step time = ``on_train_batch_start`` → ``on_train_batch_end`` (forward, backward, optimizer); GPU work
is asynchronous, so set ``monitor.sync_cuda=true`` for exact per-step times.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch

from rocmtrain import platform
from rocmtrain.config.monitor import MonitorConfig
from rocmtrain.diagnostics.device_sampler import Sample, make_sampler

log = logging.getLogger(__name__)


def step_time_stats(seconds: list[float]) -> dict[str, float]:
    """mean/p50/p99/std in ms and jitter (= std / mean) of step durations given in seconds."""
    if not seconds:
        return {}
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    mean = float(ms.mean())
    std = float(ms.std())
    return {
        "step_time_mean_ms": mean,
        "step_time_p50_ms": float(np.percentile(ms, 50)),
        "step_time_p99_ms": float(np.percentile(ms, 99)),
        "step_time_std_ms": std,
        "step_time_jitter": std / mean if mean > 0 else 0.0,
        "steps": float(len(ms)),
    }


def _host_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class DeviceMonitor(pl.Callback):
    """Per-device utilisation/HBM/power/temperature and step-time statistics (see module doc)."""

    def __init__(self, cfg: MonitorConfig, run_dir: Path) -> None:
        self._cfg = cfg
        self._dir = Path(run_dir) / "monitor"
        self._sampler = None
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic()
        self._start: float | None = None
        self.step_seconds: list[float] = []  # every step, warm-up included
        self._step_wall: list[float] = []  # monotonic time at each step end
        self._rss: list[tuple[float, int]] = []
        self._window: list[float] = []
        self.stats: dict[str, float] = {}
        self._warned: set[int] = set()

    # -- sampling thread ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self._cfg.interval_seconds):
            self._sample_once()

    def _sample_once(self) -> None:
        try:
            got = self._sampler.sample() if self._sampler else []
        except Exception as e:  # a flaky SMI must never kill training
            log.debug("device sample failed: %s", e)
            return
        with self._lock:
            self._samples.extend(got)

    def latest(self) -> dict[int, Sample]:
        with self._lock:
            return {s.index: s for s in self._samples[-64:]}

    # -- Lightning hooks ---------------------------------------------------------------------------
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._t0 = time.monotonic()
        if not platform.has_gpu():
            if trainer.is_global_zero:
                log.info(
                    "device monitor: no GPU visible (CPU run); logging step-time statistics only"
                )
            return
        if trainer.local_rank == 0:
            self._sampler = make_sampler()
            if self._sampler is None:
                log.warning(
                    "device monitor: no amdsmi / pynvml / nvidia-smi; install amdsmi (ROCm) or "
                    "nvidia-ml-py (NVIDIA) for utilisation, power and temperature"
                )
                return
            log.info(
                "device monitor: sampling with %s every %.2fs",
                self._sampler.name,
                self._cfg.interval_seconds,
            )
            self._sample_once()
            self._thread = threading.Thread(
                target=self._loop, name="rocmtrain-monitor", daemon=True
            )
            self._thread.start()

    def on_train_batch_start(self, trainer, pl_module, batch: Any, batch_idx: int) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch: Any, batch_idx: int) -> None:
        if self._start is None:
            return
        if self._cfg.sync_cuda and platform.has_gpu():
            torch.cuda.synchronize()
        dt = time.perf_counter() - self._start
        self._start = None
        self.step_seconds.append(dt)
        now = time.monotonic()
        self._step_wall.append(now - self._t0)
        self._window.append(dt)
        if self._sampler is None and (rss := _host_rss_bytes()) is not None:
            self._rss.append((now - self._t0, rss))
        if len(self.step_seconds) % self._cfg.log_every_n_steps == 0:
            metrics = {"monitor/step_time_ms": 1e3 * float(np.mean(self._window))}
            self._window = []
            for i, s in sorted(self.latest().items()):
                metrics.update(_device_metrics(i, s))
                self._check_headroom(i, s)
            if trainer.is_global_zero:  # straight to the loggers: no stale re-logging per step
                for logger in trainer.loggers:
                    logger.log_metrics(metrics, step=trainer.global_step)

    def _check_headroom(self, i: int, s: Sample) -> None:
        if not s.mem_total_bytes or s.mem_used_bytes is None or i in self._warned:
            return
        free = 1.0 - s.mem_used_bytes / s.mem_total_bytes
        if free < self._cfg.memory_headroom_fraction:
            self._warned.add(i)
            log.warning(
                "GPU %d: only %.1f%% of HBM free (%.1f/%.1f GiB used), below "
                "monitor.memory_headroom_fraction=%.2f: fragmentation or a larger batch can OOM; "
                "lower the batch size or set PYTORCH_HIP_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF",
                i,
                100 * free,
                s.mem_used_bytes / 2**30,
                s.mem_total_bytes / 2**30,
                self._cfg.memory_headroom_fraction,
            )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._shutdown()
        measured = self.step_seconds[self._cfg.warmup_steps :]
        self.stats = step_time_stats(measured)
        if self._samples:  # local rank 0 of every node sampled its node's GPUs
            self._dir.mkdir(parents=True, exist_ok=True)
            name = (
                f"devices_node{trainer.node_rank}.csv" if trainer.num_nodes > 1 else "devices.csv"
            )
            _write_samples_csv(self._dir / name, self._samples, self._t0)
        if not trainer.is_global_zero:
            return
        self._dir.mkdir(parents=True, exist_ok=True)
        if self.stats:
            for logger in trainer.loggers:
                logger.log_metrics(
                    {f"monitor/{k}": v for k, v in self.stats.items()}, step=trainer.global_step
                )
                logger.save()
            log.info(
                "step time: mean %.2f ms, p50 %.2f ms, p99 %.2f ms, jitter %.1f%% (%d steps)",
                self.stats["step_time_mean_ms"],
                self.stats["step_time_p50_ms"],
                self.stats["step_time_p99_ms"],
                100 * self.stats["step_time_jitter"],
                len(measured),
            )
        doc = {
            "stats": self.stats,
            "warmup_steps": self._cfg.warmup_steps,
            "step_seconds": self.step_seconds,
            "sampler": self._sampler.name if self._sampler else None,
        }
        (self._dir / "step_stats.json").write_text(json.dumps(doc, indent=2))
        if self._cfg.png and self.step_seconds:
            from rocmtrain.diagnostics.plot import plot_monitor

            plot_monitor(
                self._dir / "monitor.png",
                step_seconds=self.step_seconds,
                samples=self._samples,
                host_rss=self._rss,
                t0=self._t0,
                headroom_fraction=self._cfg.memory_headroom_fraction,
                stats=self.stats,
            )

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._shutdown()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._shutdown()

    def _shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self._cfg.interval_seconds + 1)
            self._thread = None
        if self._sampler is not None and hasattr(self._sampler, "close"):
            self._sampler.close()


def _device_metrics(i: int, s: Sample) -> dict[str, float]:
    out: dict[str, float] = {}
    pairs = {
        "util_pct": s.util_pct,
        "hbm_used_gib": s.mem_used_bytes / 2**30 if s.mem_used_bytes is not None else None,
        "hbm_total_gib": s.mem_total_bytes / 2**30 if s.mem_total_bytes is not None else None,
        "power_w": s.power_w,
        "temp_c": s.temp_c,
        "pcie_tx_mb_s": s.pcie_tx_bytes_per_s / 1e6 if s.pcie_tx_bytes_per_s is not None else None,
        "pcie_rx_mb_s": s.pcie_rx_bytes_per_s / 1e6 if s.pcie_rx_bytes_per_s is not None else None,
        "xgmi_mb_s": s.xgmi_bytes_per_s / 1e6 if s.xgmi_bytes_per_s is not None else None,
    }
    for k, v in pairs.items():
        if v is not None:
            out[f"gpu{i}/{k}"] = float(v)
    return out


def _write_samples_csv(path: Path, samples: list[Sample], t0: float) -> None:
    cols = ["t_s", "index", "util_pct", "mem_used_bytes", "mem_total_bytes", "power_w", "temp_c",
            "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "xgmi_bytes_per_s"]  # fmt: skip
    lines = [",".join(cols)]
    for s in samples:
        row = [f"{s.t - t0:.3f}"] + [
            "" if getattr(s, c) is None else str(getattr(s, c)) for c in cols[1:]
        ]
        lines.append(",".join(row))
    path.write_text("\n".join(lines) + "\n")
