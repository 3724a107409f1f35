"""FaultGuard: one object per fit, acting once per completed optimizer step."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from rocmtrain.config.rccl import RcclConfig
from rocmtrain.config.watchdog import WatchdogConfig
from rocmtrain.faults.guard import FaultGuard


def _guard(tmp_path, **watchdog) -> FaultGuard:
    cfg = WatchdogConfig(enabled=False, two_phase_timeouts=False, **watchdog)
    return FaultGuard(cfg, RcclConfig(), tmp_path)


def test_the_loader_closes_each_step_once_before_the_next_fetch(tmp_path) -> None:
    guard = _guard(tmp_path, preemption=False)
    trainer = SimpleNamespace(global_step=0)
    seen: list[int] = []
    guard.step_boundary = lambda t, _orig=guard.step_boundary: (
        seen.append(t.global_step),
        _orig(t),
    )
    guard.start(rank=0, world_size=1)
    guard.on_train_start(global_step=0)
    loader = guard.watch([10, 11, 12], trainer)
    assert len(loader) == 3
    for _batch in loader:
        trainer.global_step += 1  # the step this batch trained
    assert seen == [0, 1, 2, 3]  # before each fetch, and when the loader ends
    assert guard._last_step == 3


def test_a_signal_checkpoints_at_the_next_boundary_and_exits_requeue(tmp_path, monkeypatch) -> None:
    from rocmtrain.faults import preemption

    saved: list[int] = []
    monkeypatch.setattr(
        preemption, "save_preemption_checkpoint", lambda t, d: saved.append(t.global_step) or d
    )
    guard = _guard(tmp_path, preemption_check_every_n_steps=1)
    trainer = SimpleNamespace(global_step=0, world_size=1, is_global_zero=True)
    guard.start(rank=0, world_size=1)
    guard.on_train_start(global_step=0)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        trainer.global_step = 1
        with pytest.raises(SystemExit) as exc:
            guard.step_boundary(trainer)
        assert exc.value.code == 75 and saved == [1]
    finally:
        guard.finish()
    assert signal.getsignal(signal.SIGUSR1) is not None


def test_hints_are_written_before_the_watchdog_hears_of_the_error(tmp_path) -> None:
    guard = _guard(tmp_path)
    guard.on_exception(RuntimeError("Connection reset by peer"), rank=0)
    assert guard.hint is not None and guard.hint.comm
    assert (tmp_path / "error_hint_rank0.txt").is_file()
