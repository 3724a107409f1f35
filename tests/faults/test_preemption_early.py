"""A preemption signal that arrives before training starts: held, then checkpoint + requeue exit.

Real processes: ``python -m rocmtrain recipe=dlrm_cpu`` (2 gloo ranks). SIGUSR1 goes to rank 0 while
it is still starting (the run dir exists, no heartbeat yet). Without the start-up handler the
default action kills the rank (exit -10); with it the run trains one step, the ranks agree,
checkpoint and exit 75 (REQUEUE). With the watchdog's preemption handling off, the held signal is
re-delivered with its default action: the signal is never swallowed. Ctrl-C during start-up is held
the same way (every rank stops at the same step, exit 130); a second Ctrl-C exits at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rocmtrain import checkpoint as ckpt
from rocmtrain import exit_codes

REPO = Path(__file__).resolve().parents[2]


def _ctrl_c_default() -> None:
    """Ctrl-C at its default action in the child, as in a terminal's foreground job (a shell
    starts background jobs, e.g. ``pytest ... &``, with SIGINT ignored, and children inherit it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(run_dir: Path, ckpt_dir: Path, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "rocmtrain", "recipe=dlrm_cpu", f"run_dir={run_dir}",
        f"checkpoint.dir={ckpt_dir}", "checkpoint.every_n_epochs=0", "trainer.max_epochs=1",
        "data.num_train_batches=20", "data.num_val_batches=1", "data.batch_size=64",
        "trainer.progress_bar=false", "watchdog.heartbeat_channel=files", *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=_ctrl_c_default,
    )


def _launch(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    run_dir, ckpt_dir = tmp_path / "run", tmp_path / "ckpt"
    run_dir.mkdir()
    return _start(run_dir, ckpt_dir, *extra), run_dir, ckpt_dir


def _signal_during_startup(
    proc: subprocess.Popen, run_dir: Path, send=lambda p: p.send_signal(signal.SIGUSR1)
) -> None:
    deadline = time.monotonic() + 120
    while not (run_dir / "cli.log").exists():  # Hydra is up: the CLI armed the handlers first
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    assert not list(run_dir.glob("watchdog/*/kv/hb/0")), "training already started"
    send(proc)


def _ctrl_c(proc: subprocess.Popen) -> None:
    """What a terminal does: SIGINT to the whole process group (every rank started so far)."""
    os.killpg(proc.pid, signal.SIGINT)


@pytest.mark.timeout(600)
def test_sigusr1_during_startup_checkpoints_and_exits_for_requeue(tmp_path: Path) -> None:
    proc, run_dir, ckpt_dir = _launch(tmp_path)
    _signal_during_startup(proc, run_dir)
    code = proc.wait(timeout=400)
    log = (tmp_path / "run.log").read_text()
    assert code == exit_codes.REQUEUE, log[-4000:]
    assert "got SIGUSR1 before training started" in log
    saved = ckpt.find_resume(ckpt_dir)
    assert saved is not None and ckpt.is_complete(saved), log[-4000:]
    assert int(saved.name.split("-")[1]) < 20  # stopped early, not at the end


@pytest.mark.timeout(600)
def test_held_signal_is_redelivered_when_preemption_is_off(tmp_path: Path) -> None:
    proc, run_dir, ckpt_dir = _launch(tmp_path, "watchdog.preemption=false")
    _signal_during_startup(proc, run_dir)
    code = proc.wait(timeout=400)
    assert code == -signal.SIGUSR1, (tmp_path / "run.log").read_text()[-4000:]
    assert ckpt.find_resume(ckpt_dir) is None


@pytest.mark.timeout(600)
def test_ctrl_c_during_startup_stops_every_rank_at_one_step(tmp_path: Path) -> None:
    proc, run_dir, ckpt_dir = _launch(tmp_path)
    _signal_during_startup(proc, run_dir, _ctrl_c)
    code = proc.wait(timeout=400)
    log = (tmp_path / "run.log").read_text()
    assert code == exit_codes.INTERRUPTED, log[-4000:]
    assert "got SIGINT before training started" in log, log[-4000:]
    assert "rocmtrain: interrupted at step" in log, log[-4000:]
    saved = ckpt.find_resume(ckpt_dir)
    assert saved is not None and ckpt.is_complete(saved), log[-4000:]
    assert int(saved.name.split("-")[1]) < 20


@pytest.mark.timeout(300)
def test_second_ctrl_c_during_startup_exits_at_once(tmp_path: Path) -> None:
    proc, run_dir, ckpt_dir = _launch(tmp_path)
    _signal_during_startup(proc, run_dir, _ctrl_c)
    time.sleep(0.5)
    _ctrl_c(proc)
    code = proc.wait(timeout=60)
    log = (tmp_path / "run.log").read_text()
    assert code == exit_codes.INTERRUPTED, log[-4000:]
    assert "rocmtrain: interrupted at step" not in log, log[-4000:]
    assert ckpt.find_resume(ckpt_dir) is None


def test_held_ctrl_c_is_a_keyboard_interrupt_once_given_back() -> None:
    """In-process: a held SIGINT does not interrupt; handing it back (no callback will take it)
    raises the ``KeyboardInterrupt`` it would have been, and Ctrl-C is Python's again. Starts
    from Python's own Ctrl-C handler, as a foreground process has it (a shell's background job
    starts with SIGINT ignored, which ``arm_early`` rightly leaves alone: next test)."""
    from rocmtrain.faults.preemption import arm_early, disarm_early

    prior = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        arm_early(("SIGINT",))
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.3)  # the handler runs between bytecodes: no KeyboardInterrupt here
            with pytest.raises(KeyboardInterrupt):
                disarm_early(())
                time.sleep(0.3)
        finally:
            disarm_early(())
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, prior)


def test_ignored_ctrl_c_stays_ignored() -> None:
    """A process started with SIGINT ignored (nohup, a shell's background job) keeps it ignored:
    ``arm_early`` does not hold it, and a Ctrl-C does nothing."""
    from rocmtrain.faults.preemption import arm_early, disarm_early

    prior = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        arm_early(("SIGINT",))
        try:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.3)
        finally:
            disarm_early(())
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, prior)


def test_cli_gives_signals_back_when_it_returns(tmp_path: Path) -> None:
    """In-process use (a dry run here): after ``hydra_main`` returns, SIGTERM/SIGUSR1/SIGINT have
    their previous actions again — the start-up hold never outlives the CLI call."""
    from rocmtrain.cli import hydra_main

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    assert hydra_main(["dry_run=true", f"run_dir={tmp_path / 'dry'}"]) == 0
    assert {s: signal.getsignal(s) for s in before} == before
