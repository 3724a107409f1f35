"""rocmtrain.callbacks: one build_callbacks picks every training callback of a run config, and
the modules' old paths still import (deprecated) for code written against the old layout."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from rocmtrain.callbacks import build_callbacks


def _names(callbacks) -> list[str]:
    return [type(c).__name__ for c in callbacks]


def test_tiny_run_gets_the_default_callbacks(tiny_config, tmp_path) -> None:
    assert _names(build_callbacks(tiny_config, tmp_path)) == [
        "AtomicCheckpoint",
        "GradHealthCallback",
        "ThroughputCallback",
    ]


def test_every_optional_callback_in_run_order(tiny_config, tmp_path) -> None:
    cfg = tiny_config
    cfg.trainer.progress_bar = True
    cfg.monitor.enabled = True
    cfg.monitor.sync_report_steps = 2
    cfg.profile = True
    cfg.precision.grad_health.enabled = True
    assert _names(build_callbacks(cfg, tmp_path)) == [
        "HostMetricsProgressBar",
        "AtomicCheckpoint",
        "DeviceMonitor",
        "ProfilerCallback",
        "SyncReportCallback",
        "GradHealthCallback",
        "ThroughputCallback",
    ]


def test_checkpoint_callback_takes_the_config(tiny_config, tmp_path) -> None:
    cfg = tiny_config
    cfg.checkpoint.every_n_train_steps, cfg.checkpoint.keep_last = 7, 3
    cb = build_callbacks(cfg, tmp_path)[0]
    assert (cb.every_n_train_steps, cb.keep_last, str(cb.root)) == (7, 3, cfg.checkpoint.dir)
    cfg.checkpoint.enabled = False
    cfg.precision.grad_health.enabled = False
    assert _names(build_callbacks(cfg, tmp_path)) == ["ThroughputCallback"]


OLD_PATHS = [
    ("rocmtrain.throughput", "rocmtrain.callbacks.throughput", "ThroughputCallback"),
    ("rocmtrain.throughput", "rocmtrain.callbacks.throughput", "WindowClock"),
    ("rocmtrain.progress", "rocmtrain.callbacks.progress", "HostMetricsProgressBar"),
    ("rocmtrain.diagnostics.monitor", "rocmtrain.callbacks.monitor", "DeviceMonitor"),
    ("rocmtrain.diagnostics.profiling", "rocmtrain.callbacks.profiling", "ProfilerCallback"),
    ("rocmtrain.diagnostics.syncs", "rocmtrain.callbacks.syncs", "SyncReportCallback"),
    ("rocmtrain.precision.grad_health", "rocmtrain.callbacks.grad_health", "GradHealthCallback"),
]


@pytest.mark.parametrize(("old", "new", "name"), OLD_PATHS)
def test_old_module_paths_import_with_a_deprecation_warning(old, new, name) -> None:
    sys.modules.pop(old, None)  # the warning is given at (first) import
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught)


def test_old_names_still_resolve() -> None:
    from rocmtrain import checkpoint, log_setup, platform
    from rocmtrain.callbacks import monitor_callbacks
    from rocmtrain.callbacks.checkpoint import AtomicCheckpoint
    from rocmtrain.ranks import global_rank

    assert checkpoint.AtomicCheckpoint is AtomicCheckpoint
    assert platform.backend is platform.runtime
    assert log_setup.rank is global_rank
    sys.modules.pop("rocmtrain.diagnostics.monitor", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from rocmtrain.diagnostics.monitor import build_callbacks as old_build
    assert old_build is monitor_callbacks
