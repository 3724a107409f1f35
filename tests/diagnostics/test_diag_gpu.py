"""Doctor, monitor and profiler on a real GPU (skipped on CPU-only machines; run on the H200/MI300X).

TRITON_INTERPRET=0 python -m pytest -q -m gpu tests/diagnostics/test_diag_gpu.py
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from rocmtrain import platform
from rocmtrain.callbacks import monitor_callbacks
from rocmtrain.config.monitor import MonitorConfig
from rocmtrain.diagnostics.checks import Inputs, run_checks

pytestmark = pytest.mark.gpu


class Matmuls(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def _fit(tmp_path: Path, callbacks, steps: int) -> None:
    ds = TensorDataset(torch.randn(steps * 256, 1024), torch.randn(steps * 256))
    trainer = pl.Trainer(
        max_steps=steps, accelerator="gpu", devices=1, callbacks=callbacks,
        logger=pl.loggers.CSVLogger(tmp_path, name="logs", version=0),
        enable_checkpointing=False, enable_progress_bar=False, log_every_n_steps=1,
    )  # fmt: skip
    trainer.fit(Matmuls(), DataLoader(ds, batch_size=256))


def test_doctor_live_gpu() -> None:
    facts, checks = run_checks(Inputs())
    by = {c.name: c for c in checks}
    assert by["gpu.visible"].status == "ok"
    assert len(facts.torch) == torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    assert facts.devices[0].wave_size == getattr(props, "warp_size", 32)
    assert by["gpu.memory_headroom"].status in ("ok", "warn")
    assert facts.devices[0].vram_total_bytes == torch.cuda.mem_get_info(0)[1]
    if platform.is_cuda_build():
        assert "nvidia-smi" in facts.cli or facts.library  # NVML or nvidia-smi read the GPU too


def test_monitor_samples_gpu(tmp_path: Path) -> None:
    cfg = MonitorConfig(interval_seconds=0.2, log_every_n_steps=10, sync_cuda=True)
    (mon,) = monitor_callbacks(cfg, tmp_path, profile=False)
    _fit(tmp_path, [mon], steps=60)
    stats = json.loads((tmp_path / "monitor/step_stats.json").read_text())
    assert stats["sampler"] in ("pynvml", "nvidia-smi", "amdsmi", "torch.cuda.mem_get_info")
    rows = list(csv.DictReader(open(tmp_path / "monitor/devices.csv")))
    assert rows and all(int(r["mem_total_bytes"]) > 0 for r in rows)
    logged = list(csv.DictReader(open(tmp_path / "logs/version_0/metrics.csv")))
    assert any(r.get("gpu0/hbm_used_gib") for r in logged)
    assert (tmp_path / "monitor/monitor.png").stat().st_size > 10_000


def test_profiler_gpu_kernels(tmp_path: Path) -> None:
    cfg = MonitorConfig(
        enabled=False, profiler_wait_steps=2, profiler_warmup_steps=1, profiler_active_steps=3
    )
    _fit(tmp_path, monitor_callbacks(cfg, tmp_path, profile=True), steps=10)
    md = (tmp_path / "profile/top_kernels_rank0.md").read_text()
    assert "| kernel |" in md and "device time" in md
    assert len([ln for ln in md.splitlines() if ln.startswith("| 1 |")]) == 1
    timeline = json.loads((tmp_path / "profile/step_timeline_rank0.json").read_text())
    assert len(timeline["steps"]) == 3
    for r in timeline["steps"]:  # the GPU did work inside every step, never longer than the step
        assert 0 < r["device_busy_ms"] <= r["wall_ms"] * 1.001


def test_step_timeline_counts_a_sync() -> None:
    """A ``.item()`` per step shows as one host-blocking call per step; the busy time of a
    known-length kernel is within the step."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from rocmtrain.callbacks.profiling import step_timeline

    x = torch.randn(4096, 4096, device="cuda")
    got: list = []
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=0, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: got.extend(p.events()),
    ) as prof:
        for _ in range(4):
            y = x @ x
            float(y[0, 0])  # one device->host copy that blocks
            prof.step()
    t = step_timeline(got)
    assert len(t["steps"]) == 3
    for r in t["steps"]:
        assert sum(r["host_sync_calls"].values()) >= 1, r
        assert r["device_busy_ms"] > 0.05  # a 4096^3 matmul is ~0.1-1 ms on any data-centre GPU


def test_top_kernels_add_up_with_a_cuda_graph_replay_inside_a_range() -> None:
    """The kernels table lists device work only: the ``record_function`` range around the step
    and the host ops are not rows, kernels replayed from a CUDA graph are, and the rows of a
    step sum to at least the union of its device time (equal when nothing overlaps)."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from rocmtrain.callbacks.profiling import step_timeline, top_table

    x = torch.randn(2048, 2048, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            torch.relu(x @ x)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            graph_out = torch.relu(x @ x)
    torch.cuda.current_stream().wait_stream(s)
    holder: dict = {}

    def ready(p) -> None:
        holder["events"] = list(p.events())
        holder["table"] = top_table(p, k=50, gpu=True)

    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
        on_trace_ready=ready,
    ) as prof:
        for _ in range(3):
            with record_function("my_range"):
                g.replay()
                torch.cuda.synchronize()
            prof.step()
    md, rows = holder["table"]
    names = [r["name"] for r in rows]
    assert "my_range" not in names and not any(n.startswith("aten::") for n in names), names
    t = step_timeline(holder["events"])
    total = sum(r["self_ms"] for r in rows) / len(t["steps"])
    busy = t["mean_device_busy_ms"]
    assert busy > 0.05, t  # a replayed 2048^3 GEMM is recorded as device work
    assert total >= 0.99 * busy, (total, busy)
    # the table covers the window, the timeline clips to the steps: the same work either way
    assert abs(total - t["mean_device_kernel_ms"]) <= 0.05 * total, (total, t)
    assert md.count("| ") > len(rows)
    assert graph_out.shape == x.shape
