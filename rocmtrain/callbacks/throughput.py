"""Steady-state throughput: windowed samples/s and peak memory -> ``<run_dir>/throughput.json``.

    trainer = pl.Trainer(callbacks=[ThroughputCallback(run_dir, warmup_steps=15)])

``python -m rocmtrain`` adds it to every run (``monitor.throughput_*``), the epoch line prints its
rate, and the benchmarks (``scripts/bench/``) read the same file: one code path for the number a
user sees and the number a benchmark reports.

Each window of ``sync_every`` steps (after the first ``warmup_steps`` training steps of the fit,
never spanning a validation or an epoch end) gives one rate ``global_batch * steps / seconds``.
``samples_per_s`` is the median of those window rates (``samples_per_s_mean`` = total samples /
total time over the windows); ``epochs`` holds the same per epoch. Window boundaries are timed by
:class:`WindowClock`: on a GPU with CUDA events on the training stream, so timing never
synchronises the host and the host keeps running ahead of the GPU as in training (a host sync per
window drains the GPU, which then waits for the host to refill it); with ``E2E_CLOCK=host`` or on
CPU, the device is synchronised and the host clock read at each boundary. Either way the time
includes the data loading between steps. Written by global rank 0 at the end of every epoch
(partial results survive a later crash) and at the end of training; every rank reports its peak
memory. The final write adds the module's ``step_losses`` (the loss of every step) where it has
them. At each epoch end the epoch's median rate is logged as ``samples_per_s_steady`` (NaN when
the epoch had no window: fewer steps than the warm-up).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch

CLOCKS = ("events", "host")
STEADY_KEY = "samples_per_s_steady"
"""The logged metric: this epoch's median window rate (all ranks, samples/s)."""


class WindowClock:
    """Window-boundary timestamps on ``device``: ``mark()`` -> a mark, ``seconds(a, b)`` -> the
    time between two marks. ``E2E_CLOCK`` (default ``events``): ``events`` records a CUDA event
    on the device's current stream (no host sync; CPU devices use the host clock), ``host``
    synchronises the device and reads the host clock."""

    def __init__(self, device: torch.device) -> None:
        mode = os.environ.get("E2E_CLOCK", "events")
        if mode not in CLOCKS:
            raise ValueError(
                f"E2E_CLOCK={mode!r}: use 'events' (CUDA events, no host sync) or 'host' "
                "(device synchronised at each window boundary)"
            )
        self.device = device
        self.events = device.type == "cuda" and mode == "events"
        self.name = "cuda_events" if self.events else "host"

    def mark(self) -> Any:
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        if self.events:
            end.synchronize()  # long done by the time windows are read, except the last
            return start.elapsed_time(end) / 1e3
        return end - start


class ThroughputCallback(pl.Callback):
    """Windowed samples/s (median after warm-up) and peak device memory per rank.

    Samples are counted as optimizer steps (``trainer.global_step``, one per trained batch, also
    when a pipelined ``training_step`` trains several batches in one call) x ``batch_per_rank``
    (default: the size of the batch Lightning hands to the hooks) x world size.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        warmup_steps: int = 15,
        sync_every: int = 5,
        batch_per_rank: int | None = None,
    ) -> None:
        self.path = Path(run_dir) / "throughput.json"
        self.warmup_steps = warmup_steps
        self.sync_every = max(1, sync_every)
        self._windows: list[dict[str, float]] = []
        self._pending: list[tuple[Any, Any, dict[str, float]]] = []  # (start, end, window)
        self._epoch_step = 0
        self._steps = 0
        self._mark: tuple[Any, int] | None = None  # (clock mark, global_step) at the window start
        self._batch = batch_per_rank or 0
        self._clock: WindowClock | None = None

    @property
    def windows(self) -> list[dict[str, float]]:
        """The finished windows, their times read now (one wait for the last CUDA event)."""
        for start, end, window in self._pending:
            seconds = self._clock.seconds(start, end)
            window["seconds"] = seconds
            window["samples_per_s"] = window["samples"] / seconds if seconds > 0 else 0.0
            self._windows.append(window)
        self._pending = []
        return self._windows

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_step = 0
        self._mark = None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        self._epoch_step += 1
        self._steps += 1
        if not self._batch:
            self._batch = _batch_size(batch)
        if self._steps < self.warmup_steps or self._epoch_step % self.sync_every:
            return
        if self._clock is None:
            self._clock = WindowClock(pl_module.device)
        now, step = self._clock.mark(), trainer.global_step
        if self._mark is not None and step > self._mark[1]:
            steps = step - self._mark[1]
            samples = steps * self._batch * trainer.world_size
            window = {"epoch": trainer.current_epoch, "end_step": step, "steps": steps,
                      "samples": samples}  # fmt: skip
            self._pending.append((self._mark[0], now, window))
        self._mark = (now, step)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mark = None  # a window never spans validation

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # callbacks' epoch-end hooks run before the module's: its epoch line can read this value
        rate = self.epoch_rate(trainer.current_epoch)
        pl_module.log(STEADY_KEY, float("nan") if rate is None else rate, batch_size=1)
        self.write(trainer, pl_module, final=False)

    def epoch_rate(self, epoch: int) -> float | None:
        """Median window rate of ``epoch`` (None: no window finished in it)."""
        rates = [w["samples_per_s"] for w in self.windows if w["epoch"] == epoch]
        return statistics.median(rates) if rates else None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.write(trainer, pl_module, final=True)

    def summary(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """The document written to ``throughput.json`` (collective: all ranks must call it)."""
        windows = self.windows
        rates = [w["samples_per_s"] for w in windows]
        total_s = sum(w["seconds"] for w in windows)
        # the strategy's device: after fit Lightning has moved the module back to the CPU
        device = trainer.strategy.root_device
        peak = _peak_memory(device)
        peaks = trainer.strategy.all_gather(torch.tensor(peak, device=device))
        peaks = peaks.reshape(-1, 2).tolist() if trainer.world_size > 1 else [peak]
        return {
            "samples_per_s": statistics.median(rates) if rates else None,
            "samples_per_s_mean": sum(w["samples"] for w in windows) / total_s if total_s else None,
            "step_ms_median": 1e3
            * statistics.median([w["seconds"] / self.sync_every for w in windows])
            if windows
            else None,
            "epochs": [
                {"epoch": e, "samples_per_s": self.epoch_rate(e)}
                for e in sorted({int(w["epoch"]) for w in windows})
            ],
            "windows": windows,
            "measured_steps": sum(w["steps"] for w in windows),
            "warmup_steps": self.warmup_steps,
            "sync_every": self.sync_every,
            "clock": self._clock.name if self._clock is not None else None,
            "world_size": trainer.world_size,
            "batch_per_rank": self._batch,
            "global_batch": self._batch * trainer.world_size,
            "peak_mem_alloc_gib_per_rank": [p[0] for p in peaks],
            "peak_mem_reserved_gib_per_rank": [p[1] for p in peaks],
            "history": list(getattr(pl_module, "history", [])),
            "device": torch.cuda.get_device_name(pl_module.device)
            if pl_module.device.type == "cuda"
            else "cpu",
        }

    def write(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *, final: bool) -> None:
        doc = self.summary(trainer, pl_module)
        doc["final"] = final
        losses = getattr(pl_module, "step_losses", None) if final else None
        if losses is not None:  # rank 0's loss of every step (one host copy, after training)
            doc["step_losses"] = [float(x) for x in losses]
        if trainer.is_global_zero:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, indent=2))
            tmp.replace(self.path)


def _batch_size(batch: Any) -> int:
    if isinstance(batch, (tuple, list)) and batch:  # dataloader_iter flavour: (batch, idx, ...)
        batch = batch[0]
    labels = getattr(batch, "labels", None)
    return int(labels.shape[0]) if labels is not None else 0


def _peak_memory(device: torch.device) -> list[float]:
    if device.type != "cuda":
        return [0.0, 0.0]
    return [
        torch.cuda.max_memory_allocated(device) / 2**30,
        torch.cuda.max_memory_reserved(device) / 2**30,
    ]
