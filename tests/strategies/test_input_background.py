"""The input pipeline's background loader and its bottleneck report, on the CPU.

The background thread (the GPU default) must hand batches over in order, raise a loader's error
in the training thread, and stop when an epoch is left early; the report must speak once, with
the numbers and the fix, only when the wait is a real share of the step.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from rocmtrain.strategies.input_pipeline import (
    InputPipeline,
    InputStallReport,
    PipelinedLoader,
    _host_batches,
)


def _pipeline() -> InputPipeline:
    pipe = InputPipeline(nn.Linear(2, 2), torch.device("cpu"))  # no sharded module: data side only
    pipe.background = True
    return pipe


def _threads() -> set[str]:
    names = ("rocmtrain-fetch", "rocmtrain-input")
    return {t.name for t in threading.enumerate() if t.name in names}


def test_background_loader_hands_over_every_batch_in_order():
    pipe = _pipeline()
    batches = [torch.full((3,), float(i)) for i in range(7)]
    got = list(PipelinedLoader(batches, pipe))
    assert [int(b[0]) for b in got] == list(range(7))
    assert len(pipe._queue) == 7  # each one queued for its training step, in order


def test_a_loader_error_is_raised_in_the_training_thread():
    def broken():
        yield torch.zeros(1)
        yield torch.ones(1)
        raise OSError("disk went away")

    it = iter(PipelinedLoader(broken(), _pipeline(), depth=0))
    assert float(next(it)[0]) == 0.0
    assert float(next(it)[0]) == 1.0
    with pytest.raises(OSError, match="disk went away"):
        next(it)


def test_an_epoch_left_early_stops_the_thread():
    made = []

    def endless():
        i = 0
        while True:
            made.append(i)
            yield torch.tensor([i])
            i += 1

    before = _threads()
    it = iter(PipelinedLoader(endless(), _pipeline()))
    next(it)
    next(it)
    it.close()  # Lightning drops an iterator (max_steps, limit_train_batches)
    deadline = time.monotonic() + 5
    while _threads() - before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not (_threads() - before)
    assert len(made) < 10  # it stopped instead of running ahead forever


def test_loading_and_copying_overlap():
    """The loader's work (building batch k+1) and the copy's (pinning, issuing batch k) run in
    two threads: 8 batches of 40 ms + 40 ms take about 9 x 40 ms, not 16 x 40 ms."""
    pipe = _pipeline()
    prepare = pipe.prepare

    def slow_prepare(batch):
        time.sleep(0.04)
        return prepare(batch)

    pipe.prepare = slow_prepare

    def slow_loader():
        for i in range(8):
            time.sleep(0.04)
            yield torch.tensor([i])

    start = time.perf_counter()
    got = [int(b[0]) for b in PipelinedLoader(slow_loader(), pipe)]
    elapsed = time.perf_counter() - start
    assert got == list(range(8))
    assert elapsed < 0.75 * 16 * 0.04, f"{elapsed:.3f} s: loading and copying ran in series"


def test_a_copy_error_is_raised_in_the_training_thread():
    pipe = _pipeline()

    def broken(batch):
        raise RuntimeError("copy failed")

    pipe.prepare = broken
    with pytest.raises(RuntimeError, match="copy failed"):
        list(PipelinedLoader([torch.zeros(1)], pipe))


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")
def test_a_pinning_loader_without_workers_leaves_pinning_to_the_copy_thread():
    """``DataLoader(num_workers=0, pin_memory=True)`` pins in the fetching thread; for a GPU its
    iterator is made without pinning (the copy thread pins), and the loader is left as given."""
    data = [torch.arange(4) + i for i in range(3)]
    loader = DataLoader(data, batch_size=None, pin_memory=True)
    iterator, pin = _host_batches(loader, torch.device("cuda", 0))
    assert pin and loader.pin_memory and not iterator._pin_memory
    assert [b.tolist() for b in iterator] == [d.tolist() for d in data]
    # with workers (their own pin thread), unpinned, or on the CPU: the loader as it is
    for other, device in (
        (DataLoader(data, batch_size=None, pin_memory=True, num_workers=1), "cuda"),
        (DataLoader(data, batch_size=None, pin_memory=False), "cuda"),
        (loader, "cpu"),
    ):
        assert _host_batches(other, torch.device(device))[1] is False


def test_stall_report_speaks_once_with_the_numbers_and_the_fix(caplog):
    report = InputStallReport(num_workers=0)
    with caplog.at_level(logging.WARNING, logger="rocmtrain.strategies.input_pipeline"):
        report.check(wait_s=0.004, step_s=0.020)  # 20 % of the step
        report.check(wait_s=0.010, step_s=0.020)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "waited 4.0 ms per step" in lines[0] and "20% of a 20.0 ms step" in lines[0]
    assert "data.num_workers=N" in lines[0] and "num_workers=N" in lines[0]
    more = InputStallReport(num_workers=4)
    more.check(wait_s=0.01, step_s=0.02)
    assert "now 4" in more.reported


def test_stall_report_is_silent_when_the_loader_keeps_up():
    report = InputStallReport(num_workers=0)
    report.check(wait_s=0.001, step_s=0.020)  # 5 %: noise
    assert report.reported is None


def test_stall_report_measures_real_waits():
    report = InputStallReport(num_workers=0)
    report.warmup, report.window = 2, 5
    for _ in range(report.warmup + report.window + 1):
        start = time.perf_counter()
        time.sleep(0.006)  # the loader
        report.waited(time.perf_counter() - start)
        time.sleep(0.004)  # the step
        report.step()
    assert report.reported is not None and "the data loader is the bottleneck" in report.reported
