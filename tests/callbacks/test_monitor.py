"""Monitor + profiler callbacks in a real tiny Lightning fit on the CPU.

An independent probe callback times each step itself; the monitor's statistics must agree with
numpy over the probe's times, and every step must last at least the sleep the model performs.
"""

from __future__ import annotations

import csv
import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from rocmtrain.callbacks import monitor_callbacks
from rocmtrain.callbacks.monitor import DeviceMonitor, step_time_stats
from rocmtrain.callbacks.profiling import ProfilerCallback
from rocmtrain.config.monitor import MonitorConfig

SLEEP_S = 0.008


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        time.sleep(SLEEP_S)  # every step lasts at least this long
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Probe(pl.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_start(self, *a) -> None:
        self._t = time.perf_counter()

    def on_train_batch_end(self, *a) -> None:
        self.times.append(time.perf_counter() - self._t)


def _fit(tmp_path: Path, callbacks: list[pl.Callback], steps: int) -> pl.Trainer:
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.randn(steps * 4, 8, generator=g), torch.randn(steps * 4, generator=g))
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=pl.loggers.CSVLogger(tmp_path, name="logs", version=0),
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    trainer.fit(Tiny(), DataLoader(ds, batch_size=4))
    return trainer


def test_step_time_stats_against_numpy() -> None:
    rng = np.random.default_rng(0)
    secs = list(rng.uniform(0.01, 0.02, size=101))
    st = step_time_stats(secs)
    ms = np.array(secs) * 1e3
    assert st["step_time_p50_ms"] == pytest.approx(np.median(ms))
    assert st["step_time_p99_ms"] == pytest.approx(np.percentile(ms, 99))
    assert st["step_time_jitter"] == pytest.approx(ms.std() / ms.mean())
    assert step_time_stats([]) == {}


def test_monitor_in_cpu_fit(tmp_path: Path, caplog) -> None:
    cfg = MonitorConfig(log_every_n_steps=5, warmup_steps=2, interval_seconds=0.05)
    callbacks = monitor_callbacks(cfg, tmp_path, profile=False)
    (mon,) = callbacks
    assert isinstance(mon, DeviceMonitor)
    probe = Probe()
    with caplog.at_level(logging.INFO, logger="rocmtrain.callbacks.monitor"):
        _fit(tmp_path, [probe, mon], steps=20)  # probe brackets the same span as the monitor
    # CPU: exactly one info line announces the CPU run; the end-of-run summary line follows
    recs = [r for r in caplog.records if r.name == "rocmtrain.callbacks.monitor"]
    assert "no GPU visible" in recs[0].getMessage()
    assert sum("no GPU" in r.getMessage() for r in recs) == 1

    assert len(mon.step_seconds) == 20 == len(probe.times)
    assert min(mon.step_seconds) >= SLEEP_S
    ref = step_time_stats(probe.times[2:])
    assert mon.stats["steps"] == 18
    for key in ("step_time_mean_ms", "step_time_p50_ms"):
        assert mon.stats[key] == pytest.approx(ref[key], rel=0.15, abs=1.0)
    assert mon.stats["step_time_p99_ms"] >= mon.stats["step_time_p50_ms"] >= SLEEP_S * 1e3

    stats = json.loads((tmp_path / "monitor/step_stats.json").read_text())
    assert stats["stats"] == pytest.approx(mon.stats) and stats["sampler"] is None
    png = tmp_path / "monitor/monitor.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[:2] == (600, 800)

    rows = list(csv.DictReader(open(tmp_path / "logs/version_0/metrics.csv")))
    logged = [float(r["monitor/step_time_ms"]) for r in rows if r.get("monitor/step_time_ms")]
    assert len(logged) == 4  # every 5 of 20 steps
    window_means = [1e3 * np.mean(mon.step_seconds[i : i + 5]) for i in range(0, 20, 5)]
    assert logged == pytest.approx(window_means, rel=1e-4)
    final = [r for r in rows if r.get("monitor/step_time_p99_ms")]
    assert float(final[-1]["monitor/step_time_p99_ms"]) == pytest.approx(
        mon.stats["step_time_p99_ms"]
    )
    assert not any(
        k.startswith("gpu") for r in rows for k, v in r.items() if v
    )  # nothing per-device


def test_profiler_window_in_cpu_fit(tmp_path: Path) -> None:
    # top_k above the number of distinct operators: the table lists them all (aten::linear's own
    # CPU time is tiny, so in a top 25 by self time it comes and goes with the machine's load)
    cfg = MonitorConfig(enabled=False, profiler_wait_steps=1, profiler_warmup_steps=1,
                        profiler_active_steps=3, profiler_top_k=500)  # fmt: skip
    (prof,) = monitor_callbacks(cfg, tmp_path, profile=True)
    assert isinstance(prof, ProfilerCallback)
    _fit(tmp_path, [prof], steps=8)
    trace = json.loads((tmp_path / "profile/trace_rank0.json").read_text())
    names = [e.get("name", "") for e in trace["traceEvents"]]
    steps = sorted({n for n in names if n.startswith("ProfilerStep#")})
    assert steps == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]  # active window only
    assert any(n == "aten::addmm" for n in names)
    md = (tmp_path / "profile/top_kernels_rank0.md").read_text()
    # two nn.Linear per forward, 3 recorded steps -> 6 calls of aten::linear
    row = next(line for line in md.splitlines() if "`aten::linear`" in line)
    assert row.split("|")[3].strip() == "6"
    assert "aten::" in (tmp_path / "profile/top_kernels_rank0.txt").read_text()
    # the step timeline: one row per recorded step, wall time = the trace's ProfilerStep span
    timeline = json.loads((tmp_path / "profile/step_timeline_rank0.json").read_text())
    spans = sorted(
        (e["ts"], e["dur"] / 1e3) for e in trace["traceEvents"] if e.get("name") in steps
    )
    assert [r["step"] for r in timeline["steps"]] == [0, 1, 2]
    for r, (_, dur) in zip(timeline["steps"], spans, strict=True):
        assert r["wall_ms"] == pytest.approx(dur, rel=1e-3, abs=1e-3)
        assert r["device_busy_ms"] is None and r["host_sync_calls"] == {}  # CPU run
    assert "Per recorded step: wall" in md


def test_union_of_intervals() -> None:
    from rocmtrain.callbacks.profiling import _union_ms

    # overlapping streams count once; nested and disjoint intervals; microseconds in, ms out
    assert _union_ms([(0, 1000), (500, 1500), (600, 700), (3000, 4000)]) == pytest.approx(2.5)
    assert _union_ms([]) == 0.0


def test_profiler_window_not_reached(tmp_path: Path) -> None:
    cfg = MonitorConfig(enabled=False, profiler_wait_steps=10)
    (prof,) = monitor_callbacks(cfg, tmp_path, profile=True)
    _fit(tmp_path, [prof], steps=3)
    note = (tmp_path / "profile/NOT_PROFILED_rank0.txt").read_text()
    assert "3 step(s)" in note and "profiler_wait_steps" in note


def test_monitor_config_validation() -> None:
    with pytest.raises(ValueError, match=r"monitor.memory_headroom_fraction=1.5"):
        MonitorConfig(memory_headroom_fraction=1.5)
    with pytest.raises(ValueError, match=r"monitor.profiler_active_steps=0"):
        MonitorConfig(profiler_active_steps=0)


def test_headroom_warning_once_per_device(tmp_path: Path, caplog) -> None:
    from rocmtrain.diagnostics.device_sampler import Sample

    total = 201310208 * 1024  # MI300X VRAM from the recorded rocminfo
    mon = DeviceMonitor(MonitorConfig(memory_headroom_fraction=0.10), tmp_path)
    with caplog.at_level(logging.WARNING, logger="rocmtrain.callbacks.monitor"):
        mon._check_headroom(
            0, Sample(0.0, 0, mem_used_bytes=int(total * 0.80), mem_total_bytes=total)
        )
        assert not caplog.records
        for _ in range(3):
            mon._check_headroom(
                1, Sample(0.0, 1, mem_used_bytes=int(total * 0.95), mem_total_bytes=total)
            )
    (rec,) = caplog.records
    assert "GPU 1" in rec.getMessage() and "5.0% of HBM free" in rec.getMessage()
