"""``profile=true``: torch.profiler over a window of training steps → trace + top-kernels table.

    python -m rocmtrain recipe=dlrm_cpu profile=true monitor.profiler_active_steps=5

The window is ``monitor.profiler_wait_steps`` skipped, ``profiler_warmup_steps`` profiled and
discarded, then ``profiler_active_steps`` recorded. Output in ``<run_dir>/profile/``:

- ``trace_rank{R}.json``: Chrome trace; open in https://ui.perfetto.dev or chrome://tracing;
- ``top_kernels_rank{R}.md``: the top GPU kernels by self device time (on CPU: top operators by
  self CPU time) with calls, self/total time and share;
- ``top_kernels_rank{R}.txt``: torch's own ``key_averages().table(...)``.

For whole-program GPU traces use ``scripts/profile/profile_recipe.sh`` (rocprofv3 / rocprof / nsys).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from rocmtrain import platform
from rocmtrain.config.monitor import MonitorConfig

log = logging.getLogger(__name__)


def _device_time(evt) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(evt, attr):
            return float(getattr(evt, attr))
    return 0.0


def top_table(prof: profile, *, k: int, gpu: bool) -> tuple[str, list[dict]]:
    """Markdown table and rows of the top-``k`` kernels (GPU) or operators (CPU), by self time."""
    events = list(prof.key_averages())
    if gpu:
        events = [e for e in events if _device_time(e) > 0]
        key, unit = _device_time, "self device time"
    else:
        events = [e for e in events if not e.key.startswith("ProfilerStep")]
        key, unit = (lambda e: float(e.self_cpu_time_total)), "self CPU time"
    events.sort(key=key, reverse=True)
    total = sum(key(e) for e in events) or 1.0
    rows = [
        {
            "name": e.key,
            "calls": int(e.count),
            "self_ms": key(e) / 1e3,
            "total_ms": (
                e.device_time_total if gpu and hasattr(e, "device_time_total") else e.cpu_time_total
            )
            / 1e3,
            "share": key(e) / total,
        }
        for e in events[:k]
    ]
    lines = [
        f"| # | {'kernel' if gpu else 'operator'} | calls | {unit} (ms) | total (ms) | share |",
        "|---|---|---|---|---|---|",
    ]
    for n, r in enumerate(rows, 1):
        name = r["name"].replace("|", "\\|")
        name = name if len(name) <= 90 else name[:87] + "..."
        lines.append(
            f"| {n} | `{name}` | {r['calls']} | {r['self_ms']:.3f} | {r['total_ms']:.3f} | {r['share']:.1%} |"
        )
    return "\n".join(lines) + "\n", rows


class ProfilerCallback(pl.Callback):
    """Runs ``torch.profiler`` over the configured step window and writes trace + tables."""

    def __init__(self, cfg: MonitorConfig, run_dir: Path) -> None:
        self._cfg = cfg
        self._dir = Path(run_dir) / "profile"
        self._prof: profile | None = None
        self._rank = 0
        self.written: list[Path] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._rank = trainer.global_rank
        activities = [ProfilerActivity.CPU]
        if platform.has_gpu():
            activities.append(ProfilerActivity.CUDA)  # also the HIP/ROCm activity on ROCm builds
        c = self._cfg
        self._prof = profile(
            activities=activities,
            schedule=schedule(
                wait=c.profiler_wait_steps,
                warmup=c.profiler_warmup_steps,
                active=c.profiler_active_steps,
                repeat=1,
            ),
            on_trace_ready=self._on_ready,
            record_shapes=c.profiler_record_shapes,
        )
        self._prof.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self._prof is not None:
            self._prof.step()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish(trainer.global_step)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._finish(trainer.global_step)

    def _finish(self, steps: int) -> None:
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        prof.stop()  # flushes a partially recorded window through _on_ready
        if not self.written:
            c = self._cfg
            msg = (
                f"profiler window not reached: the run did {steps} step(s), the window needs "
                f"{c.profiler_wait_steps + c.profiler_warmup_steps + 1} "
                f"(wait={c.profiler_wait_steps}, warmup={c.profiler_warmup_steps}); lower "
                "monitor.profiler_wait_steps or train longer"
            )
            self._dir.mkdir(parents=True, exist_ok=True)
            (self._dir / f"NOT_PROFILED_rank{self._rank}.txt").write_text(msg + "\n")
            log.warning(msg)

    def _on_ready(self, prof: profile) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        trace = self._dir / f"trace_rank{self._rank}.json"
        prof.export_chrome_trace(str(trace))
        gpu = platform.has_gpu()
        md, _ = top_table(prof, k=self._cfg.profiler_top_k, gpu=gpu)
        md_path = self._dir / f"top_kernels_rank{self._rank}.md"
        md_path.write_text(
            f"# Top {'kernels' if gpu else 'operators'} (rank {self._rank}, "
            f"{self._cfg.profiler_active_steps} active steps, torch {torch.__version__})\n\n" + md
        )
        sort_by = "self_device_time_total" if gpu else "self_cpu_time_total"
        txt_path = self._dir / f"top_kernels_rank{self._rank}.txt"
        txt_path.write_text(
            prof.key_averages().table(sort_by=sort_by, row_limit=self._cfg.profiler_top_k)
        )
        self.written = [trace, md_path, txt_path]
        log.info("profiler: wrote %s (open in https://ui.perfetto.dev) and %s", trace, md_path)
