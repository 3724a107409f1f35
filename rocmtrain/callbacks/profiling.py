"""``profile=true``: torch.profiler over a window of training steps → trace + top-kernels table.

    python -m rocmtrain recipe=dlrm_cpu profile=true monitor.profiler_active_steps=5

The window is ``monitor.profiler_wait_steps`` skipped, ``profiler_warmup_steps`` profiled and
discarded, then ``profiler_active_steps`` recorded. Output in ``<run_dir>/profile/``:

- ``trace_rank{R}.json``: Chrome trace; open in https://ui.perfetto.dev or chrome://tracing;
- ``top_kernels_rank{R}.md``: the top GPU kernels by device time — kernels, copies and memsets
  only, those replayed from CUDA graphs included, so the column adds up to the device work of the
  recorded steps (on CPU: top operators by self CPU time) — with calls, time and share;
- ``top_kernels_rank{R}.txt``: torch's own ``key_averages().table(...)``;
- ``op_counts_rank{R}.json``: every kernel (operator on CPU) with its calls and self time per step;
- ``step_timeline_rank{R}.json``: per recorded step, the wall time, the time the GPU was busy
  (union of kernel and copy intervals over all streams), its split into embedding work, dense
  work, the two overlapped and idle time, and the host-blocking sync calls
  (``cudaStreamSynchronize``/``hipStreamSynchronize``, blocking memcpys ...). A step whose GPU is
  busy for much less than its wall time is bound by the host: launches, Python, or syncs.
  On a GPU the device is synchronized at the edges of the recorded steps, so each step's window
  holds that step's device work (the host otherwise runs steps ahead); the wall time of a
  recorded step therefore includes its launches, which the timed steps overlap.

For whole-program GPU traces use ``scripts/profile/profile_recipe.sh`` (rocprofv3 / rocprof / nsys).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from rocmtrain import platform
from rocmtrain.config.monitor import MonitorConfig

log = logging.getLogger(__name__)


def device_work(events: list) -> list:
    """The device-side work of a profiled window: kernels, memcpys and memsets.

    ``prof.key_averages()`` mixes three things that all carry device time: the kernels, the host
    operators that launched them (``aten::mm`` owns its GEMM's time) and ``record_function``
    ranges mirrored onto the GPU timeline (``Optimizer.step#Adagrad.step``,
    ``DistributedDataParallel.forward``). Summing those counts the same microsecond two or three
    times; the kernels alone add up to the step. Kernels replayed from a CUDA graph are device
    events too (CUPTI records each kernel of a replay), so they are counted here.
    """
    from torch.autograd import DeviceType

    return [
        e
        for e in events
        if e.device_type != DeviceType.CPU
        and not getattr(e, "is_user_annotation", False)
        and not e.name.startswith("ProfilerStep")
        and e.time_range.end > e.time_range.start
    ]


def _kernel_rows(events: list) -> list[dict]:
    """Device work grouped by kernel name, largest total first (times in ms)."""
    agg: dict[str, list[float]] = {}
    for e in device_work(events):
        a = agg.setdefault(e.name, [0, 0.0])
        a[0] += 1
        a[1] += (e.time_range.end - e.time_range.start) / 1e3
    return [
        {"name": n, "calls": int(c), "self_ms": t, "total_ms": t}
        for n, (c, t) in sorted(agg.items(), key=lambda kv: kv[1][1], reverse=True)
    ]


def _cpu_rows(prof: profile) -> list[dict]:
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    events.sort(key=lambda e: float(e.self_cpu_time_total), reverse=True)
    return [
        {
            "name": e.key,
            "calls": int(e.count),
            "self_ms": float(e.self_cpu_time_total) / 1e3,
            "total_ms": float(e.cpu_time_total) / 1e3,
        }
        for e in events
    ]


def top_table(prof: profile, *, k: int, gpu: bool) -> tuple[str, list[dict]]:
    """Markdown table and rows of the top-``k`` kernels (GPU: device work only, see
    :func:`device_work`) or operators (CPU: self CPU time). Shares are of the window's total,
    so on a GPU the kernels' column adds up to the device time of the recorded steps."""
    rows = _kernel_rows(list(prof.events())) if gpu else _cpu_rows(prof)
    unit = "device time" if gpu else "self CPU time"
    total = sum(r["self_ms"] for r in rows) or 1.0
    for r in rows:
        r["share"] = r["self_ms"] / total
    rows = rows[:k]
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


def op_counts(prof: profile, *, steps: int, gpu: bool) -> dict[str, dict[str, float]]:
    """Every kernel (GPU) or operator (CPU) of the window: calls and self time (ms) per step.

    Two runs of the same model (rocmtrain's and a plain TorchRec loop) compared op by op show
    what one does that the other does not (``scripts/bench/e2e_summary.py`` prints the diff).
    """
    n = max(steps, 1)
    rows = _kernel_rows(list(prof.events())) if gpu else _cpu_rows(prof)
    return {r["name"]: {"calls": r["calls"] / n, "self_ms": r["self_ms"] / n} for r in rows}


#: runtime calls that block the host until the device catches up (CUDA and HIP spellings)
SYNC_CALLS = tuple(
    f"{api}{name}"
    for api in ("cuda", "hip")
    for name in (
        "StreamSynchronize",
        "DeviceSynchronize",
        "EventSynchronize",
        "Memcpy",  # a plain (not Async) memcpy blocks
        "MemcpyDtoH",
    )
)


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    """Total length (ms) of the union of ``(start_us, end_us)`` intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total / 1e3


EMBEDDING_WORK = (
    "split_embedding",  # FBGEMM's TBE forward and backward (with its fused optimizer)
    "bounds_check_indices",
    "RadixSort",  # the TBE backward sorts the ids by row
    "linearize",
    "embedding_bag",
    "tbe_",  # rocmtrain's Triton TBE
)
"""Substrings of the device work that belongs to the embedding side of a step; the rest is the
dense side (GEMMs, elementwise, the dense optimizer, copies)."""


def is_embedding_work(name: str) -> bool:
    return any(part in name for part in EMBEDDING_WORK)


def step_budget(inside: list[tuple[float, float, str]], wall_ms: float) -> dict[str, float]:
    """A step's device time split four ways (ms): ``embedding`` and ``dense`` work (summed over
    streams), ``overlap`` (time two streams ran at once: the sum minus the union), ``idle``
    (wall minus the union)."""
    emb = sum(b - a for a, b, name in inside if is_embedding_work(name)) / 1e3
    dense = sum(b - a for a, b, name in inside if not is_embedding_work(name)) / 1e3
    busy = _union_ms([(a, b) for a, b, _ in inside])
    return {
        "embedding_ms": emb,
        "dense_ms": dense,
        "overlap_ms": emb + dense - busy,
        "idle_ms": max(wall_ms - busy, 0.0),
    }


def step_timeline(events: list) -> dict:
    """Per-step wall / device-busy time and host sync calls from ``prof.events()``.

    ``events`` are torch's ``FunctionEvent``\ s of one profiled window; steps are the
    ``ProfilerStep`` ranges (``ProfilerStep*`` in the events, ``ProfilerStep#N`` in the trace), in order. Device activity is every event whose ``device_type`` is not the CPU
    (kernels, memcpys, memsets), clipped to the step; overlapping streams count once.
    """
    from torch.autograd import DeviceType

    def is_step(e) -> bool:
        return e.name.startswith("ProfilerStep")

    # host-side step ranges only (the GPU timeline carries a copy of each as a user annotation)
    steps = sorted(
        (e for e in events if is_step(e) and e.device_type == DeviceType.CPU),
        key=lambda e: e.time_range.start,
    )
    device = [(e.time_range.start, e.time_range.end, e.name) for e in device_work(events)]
    syncs = [e for e in events if e.device_type == DeviceType.CPU and e.name in SYNC_CALLS]
    rows = []
    for i, st in enumerate(steps):
        a, b = st.time_range.start, st.time_range.end
        named = [(max(x, a), min(y, b), n) for x, y, n in device if y > a and x < b]
        inside = [(x, y) for x, y, _ in named]
        busy = _union_ms(inside)
        kernels = sum(y - x for x, y in inside) / 1e3  # overlapping streams count twice
        calls: dict[str, int] = {}
        for e in syncs:
            if a <= e.time_range.start < b:
                calls[e.name] = calls.get(e.name, 0) + 1
        wall = (b - a) / 1e3
        rows.append(
            {
                "step": i,
                "wall_ms": wall,
                "device_busy_ms": busy if device else None,
                "device_busy_fraction": busy / wall if device and wall > 0 else None,
                "device_kernel_ms": kernels if device else None,
                "budget": step_budget(named, wall) if device else None,
                "host_sync_calls": calls,
            }
        )
    n = len(rows) or 1
    have_device = bool(device)
    return {
        "steps": rows,
        "mean_wall_ms": sum(r["wall_ms"] for r in rows) / n,
        "mean_device_busy_ms": sum(r["device_busy_ms"] for r in rows) / n if have_device else None,
        "mean_device_kernel_ms": (
            sum(r["device_kernel_ms"] for r in rows) / n if have_device else None
        ),
        "mean_budget": (
            {k: sum(r["budget"][k] for r in rows) / n for k in rows[0]["budget"]}
            if have_device and rows
            else None
        ),
        "mean_host_sync_calls": sum(sum(r["host_sync_calls"].values()) for r in rows) / n,
    }


def timeline_markdown(t: dict) -> str:
    """Two lines for the top-kernels report."""
    busy = t["mean_device_busy_ms"]
    share = f" ({busy / t['mean_wall_ms']:.0%} of the step)" if busy and t["mean_wall_ms"] else ""
    busy_s = f"{busy:.2f} ms{share}" if busy is not None else "n/a (no device activity)"
    kern = t.get("mean_device_kernel_ms")
    kern_s = (
        f" The kernels below sum to {kern:.2f} ms a step (streams that overlap count twice; "
        "record_function ranges and the host operators that launched the kernels are left out, "
        "so the column adds up).\n"
        if kern is not None
        else ""
    )
    budget = t.get("mean_budget")
    budget_s = (
        "Step budget (ms): embedding {embedding_ms:.2f}, dense {dense_ms:.2f}, overlapped "
        "{overlap_ms:.2f}, idle {idle_ms:.2f}.\n".format(**budget)
        if budget
        else ""
    )
    return (
        f"Per recorded step: wall {t['mean_wall_ms']:.2f} ms, device busy {busy_s}, "
        f"host-blocking sync calls {t['mean_host_sync_calls']:.1f}.{kern_s}{budget_s}\n"
    )


class ProfilerCallback(pl.Callback):
    """Runs ``torch.profiler`` over the configured step window and writes trace + tables."""

    def __init__(self, cfg: MonitorConfig, run_dir: Path) -> None:
        self._cfg = cfg
        self._dir = Path(run_dir) / "profile"
        self._prof: profile | None = None
        self._rank = 0
        self._steps = 0  # training steps since the profiler started
        self._gpu = False
        self.written: list[Path] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._rank = trainer.global_rank
        self._steps = 0
        self._gpu = pl_module.device.type == "cuda"
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
        if self._prof is None:
            return
        self._steps += 1
        c = self._cfg
        last = c.profiler_wait_steps + c.profiler_warmup_steps + c.profiler_active_steps
        if self._gpu and c.profiler_wait_steps <= self._steps <= last:
            # the host runs steps ahead of the GPU: without a sync at each recorded step's edges
            # its window would hold whatever device work ran meanwhile, not the step's own
            torch.cuda.synchronize()
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
        timeline = step_timeline(list(prof.events()))
        tl_path = self._dir / f"step_timeline_rank{self._rank}.json"
        tl_path.write_text(json.dumps(timeline, indent=2))
        md_path = self._dir / f"top_kernels_rank{self._rank}.md"
        md_path.write_text(
            f"# Top {'kernels' if gpu else 'operators'} (rank {self._rank}, "
            f"{self._cfg.profiler_active_steps} active steps, torch {torch.__version__})\n\n"
            + timeline_markdown(timeline)
            + "\n"
            + md
        )
        counts = op_counts(prof, steps=self._cfg.profiler_active_steps, gpu=gpu)
        (self._dir / f"op_counts_rank{self._rank}.json").write_text(json.dumps(counts, indent=1))
        sort_by = "self_device_time_total" if gpu else "self_cpu_time_total"
        txt_path = self._dir / f"top_kernels_rank{self._rank}.txt"
        txt_path.write_text(
            prof.key_averages().table(sort_by=sort_by, row_limit=self._cfg.profiler_top_k)
        )
        self.written = [trace, md_path, txt_path, tl_path]
        log.info("profiler: wrote %s (open in https://ui.perfetto.dev) and %s", trace, md_path)
