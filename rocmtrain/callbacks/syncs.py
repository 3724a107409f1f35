"""Find the host<->device syncs in a training step, with the Python line that caused each one.

    python -m rocmtrain recipe=dlrm_mi300 monitor.sync_report_steps=5

A sync (``.item()``, ``float(t)``, ``bool(t)``, ``.cpu()``, ``torch.nonzero``, ``bincount``
without a fixed output size, ...) makes the host wait for the GPU, so the next step's kernels
cannot be queued while this one runs: the GPU idles for the launch latency of everything after
it. A few per step are enough to cost milliseconds. This report turns on PyTorch's sync
debug mode (``torch.cuda.set_sync_debug_mode("warn")``, the same API on ROCm) for
``monitor.sync_report_steps`` training steps starting at ``monitor.sync_report_start_step``,
records the Python stack of every sync it reports, and writes
``<run_dir>/syncs/syncs_rank{R}.{json,md}``: one row per call site, with its count per step.
The mode only reports syncs PyTorch knows are synchronising; blocking calls inside extensions
(FBGEMM, NCCL) are not seen — the profiler's ``step_timeline`` counts those.
"""

from __future__ import annotations

import json
import logging
import threading
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

from rocmtrain import platform

log = logging.getLogger(__name__)

#: the start of PyTorch's sync-debug warning (c10/cuda/CUDAFunctions.cpp: "called a synchronizing
#: CUDA operation"); matched without the vendor word so a hipified build's text matches too
SYNC_WARNING = "called a synchronizing"
_SKIP = ("/warnings.py", "/rocmtrain/callbacks/syncs.py")


class SyncRecorder:
    """Collects the call sites of sync warnings between :meth:`start` and :meth:`stop`.

    ``debug_mode=False`` leaves PyTorch's sync debug mode alone (for code that warns itself).
    """

    def __init__(self, *, debug_mode: bool = True, depth: int = 8) -> None:
        self.debug_mode = debug_mode
        self.depth = depth
        self.sites: Counter[tuple[str, ...]] = Counter()
        self.threads: Counter[str] = Counter()
        self._show_original: Any = None
        self._catch: warnings.catch_warnings | None = None

    def start(self) -> None:
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.filterwarnings("always", message=f".*{SYNC_WARNING}")
        self._show_original = warnings.showwarning
        warnings.showwarning = self._show
        if self.debug_mode:
            torch.cuda.set_sync_debug_mode("warn")

    def stop(self) -> None:
        if self.debug_mode:
            torch.cuda.set_sync_debug_mode("default")
        if self._catch is not None:
            self._catch.__exit__(None, None, None)  # restores filters and showwarning
            self._catch = None

    def _show(self, message, category, filename, lineno, file=None, line=None) -> None:
        if SYNC_WARNING not in str(message):
            self._show_original(message, category, filename, lineno, file, line)
            return
        frames = [f for f in traceback.extract_stack() if not f.filename.endswith(_SKIP)]
        site = tuple(f"{f.filename}:{f.lineno} ({f.name})" for f in frames[-self.depth :])
        self.sites[site] += 1
        self.threads[threading.current_thread().name] += 1

    def report(self, steps: int) -> dict[str, Any]:
        """``{"syncs_per_step", "sites": [{"count", "per_step", "stack"}...]}`` (innermost last)."""
        total = sum(self.sites.values())
        return {
            "steps": steps,
            "syncs": total,
            "syncs_per_step": total / steps if steps else None,
            "threads": dict(self.threads),
            "sites": [
                {"count": n, "per_step": n / steps if steps else None, "stack": list(site)}
                for site, n in self.sites.most_common()
            ],
        }


def report_markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"# Host-device syncs: {doc['syncs']} in {doc['steps']} training steps "
        f"({doc['syncs_per_step'] or 0:.1f} per step)",
        "",
        "| # | per step | where (innermost frame; the stack follows) |",
        "|---|---:|---|",
    ]
    for i, s in enumerate(doc["sites"], 1):
        lines.append(f"| {i} | {s['per_step']:.2f} | `{s['stack'][-1] if s['stack'] else '?'}` |")
    for i, s in enumerate(doc["sites"], 1):
        lines += ["", f"## {i}", "", "```", *s["stack"], "```"]
    return "\n".join(lines) + "\n"


class SyncReportCallback(pl.Callback):
    """``monitor.sync_report_steps=N``: report the syncs of N training steps (GPU runs)."""

    def __init__(self, run_dir: Path, *, start_step: int, steps: int) -> None:
        self.dir = Path(run_dir) / "syncs"
        self.start_step = start_step
        self.steps = steps
        self.recorder: SyncRecorder | None = None
        self._seen = 0
        self.doc: dict[str, Any] | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not platform.has_gpu():
            self.dir.mkdir(parents=True, exist_ok=True)
            msg = (
                f"monitor.sync_report_steps={self.steps}: no GPU in this run, so there are no "
                "host-device syncs to report; run it on a GPU (or set monitor.sync_report_steps=0)"
            )
            (self.dir / f"NOT_RECORDED_rank{trainer.global_rank}.txt").write_text(msg + "\n")
            log.warning(msg)
            self.steps = 0

    def on_train_batch_start(self, trainer, pl_module, batch: Any, batch_idx: int) -> None:
        started = self.recorder is not None or self.doc is not None
        if self.steps and not started and trainer.global_step >= self.start_step:
            self.recorder = SyncRecorder()
            self.recorder.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch: Any, batch_idx: int) -> None:
        if self.recorder is None:
            return
        self._seen += 1
        if self._seen >= self.steps:
            self._finish(trainer.global_rank)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.recorder is not None:
            self._finish(trainer.global_rank)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self.recorder is not None:
            self.recorder.stop()
            self.recorder = None

    def _finish(self, rank: int) -> None:
        assert self.recorder is not None
        self.recorder.stop()
        self.doc = self.recorder.report(self._seen)
        self.recorder = None
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / f"syncs_rank{rank}.json").write_text(json.dumps(self.doc, indent=2))
        (self.dir / f"syncs_rank{rank}.md").write_text(report_markdown(self.doc))
        top = self.doc["sites"][0]["stack"][-1] if self.doc["sites"] else "none"
        log.info(
            "sync report (rank %d): %.1f host-device syncs per step over %d steps; top site: %s; "
            "see %s",
            rank,
            self.doc["syncs_per_step"] or 0.0,
            self._seen,
            top,
            self.dir / f"syncs_rank{rank}.md",
        )
