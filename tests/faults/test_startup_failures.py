"""Start-up and crash failures of ``python -m rocmtrain`` as real processes: each ends in seconds
with one line that says what happened, and leaves no process behind.

- ``MASTER_ADDR`` that does not resolve, a ``MASTER_PORT`` still busy after rank 0 waited for it:
  exit 2 naming host/port and fix.
- SIGTERM while rank 0 waits for peers that never come (``trainer.num_nodes=2`` on one node):
  the held signal still ends the run (exit 143) within 30 s.
- a rank that raises inside ``training_step``: its exception and traceback file are named by the
  launching process, which exits 1; the watchdog reports a failed rank, not a hang.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "trainer.max_epochs=1", "data.num_train_batches=8", "data.num_val_batches=1",
    "data.batch_size=64", "trainer.progress_bar=false", "checkpoint.enabled=false",
]  # fmt: skip

CRASHING = """
import sys
from rocmtrain.models.module import DLRMModule

_step = DLRMModule.training_step


def training_step(self, batch, batch_idx):
    if self.global_rank == 1 and batch_idx == 2:
        raise RuntimeError("injected failure in training_step")
    return _step(self, batch, batch_idx)


DLRMModule.training_step = training_step
from rocmtrain.__main__ import main

sys.exit(main())
"""


def _start(tmp: Path, *args: str, env: dict[str, str] | None = None, script: str | None = None):
    cmd = [sys.executable, script] if script else [sys.executable, "-m", "rocmtrain"]
    return subprocess.Popen(
        [*cmd, f"run_dir={tmp / 'run'}", *SMALL, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: we can tell whether anything is left
    )


def _left_behind(proc: subprocess.Popen) -> list[int]:
    """Live processes still in the run's process group (Lightning's rank children included;
    zombies are gone already, only not yet reaped by this container's init)."""
    out = subprocess.run(
        ["ps", "-o", "pid=,stat=", "-g", str(proc.pid)], capture_output=True, text=True
    )
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    return [int(pid) for pid, stat in rows if not stat.startswith("Z")]


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, float]:
    start = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - start
    time.sleep(1.0)  # PDEATHSIG'd children need a moment to go
    return proc.returncode, out, took


def test_unresolvable_master_addr_fails_fast_naming_the_host(tmp_path):
    proc = _start(tmp_path, env={"MASTER_ADDR": "no-such-host.invalid"})
    code, out, took = _finish(proc, timeout=240)
    assert code == 2, out[-3000:]
    assert "MASTER_ADDR='no-such-host.invalid' does not resolve" in out, out[-3000:]
    assert "Traceback" not in out
    assert took < 90 and not _left_behind(proc)  # named within 90 s, nothing left running


def test_busy_master_port_is_named_and_no_rank_is_orphaned(tmp_path):
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # rank 0 waits for the port (a requeued job's old port may be freed in seconds), at
        # most rccl.init_timeout_seconds: 5 s here
        proc = _start(tmp_path, "rccl.init_timeout_seconds=5", env={"MASTER_PORT": str(port)})
        code, out, _ = _finish(proc, timeout=240)
    assert code == 2, out[-3000:]
    assert f"MASTER_PORT={port} is in use on this host; waiting up to 5 s" in out, out[-3000:]
    assert f"MASTER_PORT={port} is already in use" in out, out[-3000:]
    assert "does not compose" not in out
    assert not _left_behind(proc)


def test_sigterm_while_waiting_for_missing_peers_ends_the_run(tmp_path):
    proc = _start(tmp_path, "trainer.num_nodes=2")  # 4 ranks expected, 2 start
    deadline = time.monotonic() + 240
    while not list((tmp_path / "run").glob("*.log")):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(15)  # imports done: rank 0 now waits in the rendezvous
    assert proc.poll() is None
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code, out, _ = _finish(proc, timeout=60)
    assert time.monotonic() - sent <= 30 + 2, out[-3000:]
    assert code == 128 + signal.SIGTERM, out[-3000:]
    assert "training has not started" in out, out[-3000:]
    assert not _left_behind(proc)


def test_a_crashing_rank_is_named_by_the_launcher_not_called_a_hang(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(CRASHING)
    proc = _start(tmp_path, "watchdog.heartbeat_channel=files", script=str(script))
    code, out, _ = _finish(proc, timeout=300)
    assert code == 1, out[-4000:]
    trace = tmp_path / "run" / "logs" / "error_rank1.txt"
    line = f"rank 1 failed: RuntimeError: injected failure in training_step (traceback: {trace}"
    assert line in out, out[-4000:]
    assert "injected failure in training_step" in trace.read_text()
    assert "HANG REPORT" not in out and "RANK FAILURE REPORT" in out, out[-4000:]
    assert "does not compose" not in out
    assert not _left_behind(proc)
