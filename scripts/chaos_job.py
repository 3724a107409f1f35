"""The pieces ``scripts/chaos.py`` acts with: a job of rank processes started the way srun starts
them, the watchdog's heartbeat files read from outside, and the damage a fault does (a held port,
a full filesystem, a damaged checkpoint file). Real processes, real signals, a real tmpfs.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Job:
    """One attempt of the job: ``world`` rank processes of ``python -m rocmtrain <args>``, each
    started as an srun task is (its own process, rank and rendezvous address in the
    environment), so any rank can be signalled, stopped or killed on its own."""

    args: list[str]
    world: int
    port: int
    logs: Path
    name: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    started: float = 0.0
    #: ranks the harness had to kill (stopped, or still running after a peer's bad exit)
    killed: set[int] = field(default_factory=set)

    def start(self) -> Job:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        for rank in range(self.world):
            env = {
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "PYTHONWARNINGS": "ignore",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(self.port),
                "NODE_RANK": "0",
                "LOCAL_RANK": str(rank),
                "RANK": str(rank),
                "WORLD_SIZE": str(self.world),
            }
            log = open(self.log_path(rank), "w")  # noqa: SIM115 - the child owns it
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "rocmtrain", *self.args],
                    cwd=REPO,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a signal reaches only the rank it is sent to
                )
            )
            log.close()
        return self

    def log_path(self, rank: int) -> Path:
        return self.logs / f"{self.name}_rank{rank}.log"

    def log_text(self, rank: int) -> str:
        return self.log_path(rank).read_text(errors="replace")

    def signal(self, rank: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.procs[rank].pid, sig)

    def running(self) -> list[int]:
        return [r for r, p in enumerate(self.procs) if p.poll() is None]

    def codes(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def finish(self, *, grace_s: float, stopped: set[int] = frozenset()) -> list[int]:
        """Wait for every rank, as srun with ``--kill-on-bad-exit`` would after a grace: once a
        rank has exited non-zero, the others get ``grace_s`` to exit on their own, then SIGKILL
        (a stopped rank is killed as soon as every other rank is gone: it cannot exit)."""
        bad_since: float | None = None
        while self.running():
            now = time.monotonic()
            codes = self.codes()
            if bad_since is None and any(c not in (None, 0) for c in codes):
                bad_since = now
            if set(self.running()) <= set(stopped) or (
                bad_since is not None and now - bad_since > grace_s
            ):
                for r in self.running():
                    self.killed.add(r)
                    self.signal(r, signal.SIGKILL)
                    self.signal(r, signal.SIGCONT)
                for p in self.procs:
                    p.wait()
                break
            time.sleep(0.05)
        return [p.wait() for p in self.procs]

    def kill_all(self) -> None:
        for r in self.running():
            self.signal(r, signal.SIGKILL)
            self.signal(r, signal.SIGCONT)
        for p in self.procs:
            p.wait()


# -- what the harness observes ---------------------------------------------------------------------
def heartbeat_step(run_dir: Path, seen_attempts: set[str]) -> int:
    """The lowest step any rank has published in this attempt's watchdog heartbeat files
    (``watchdog.heartbeat_channel=files``), -1 before the first heartbeat."""
    root = run_dir / "watchdog"
    fresh = [d for d in root.glob("*/kv/hb") if d.parent.parent.name not in seen_attempts]
    if not fresh:
        return -1
    steps = []
    for f in max(fresh, key=lambda d: d.stat().st_mtime).iterdir():
        with contextlib.suppress(OSError, ValueError, KeyError):
            steps.append(int(json.loads(f.read_text())["step"]))
    return min(steps) if steps else -1


def attempts_of(run_dir: Path) -> set[str]:
    return {d.name for d in (run_dir / "watchdog").glob("*") if d.is_dir()}


def hang_reports(run_dir: Path, attempt_dirs: set[str]) -> list[dict]:
    """Hang reports written by the watchdog in attempts not in ``attempt_dirs``."""
    found = []
    for d in (run_dir / "watchdog").glob("*"):
        if d.name in attempt_dirs:
            continue
        for f in d.glob("hang_report*.json"):
            with contextlib.suppress(OSError, ValueError):
                found.append(json.loads(f.read_text()))
    return found


# -- damage ----------------------------------------------------------------------------------------
class PortSquatter:
    """A stale process on the rendezvous port: listens there (as a previous attempt's rank 0
    still hosting its TCPStore would) until :meth:`release`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", port))
        self.sock.listen(16)

    def release(self) -> None:
        self.sock.close()


class Tmpfs:
    """A small tmpfs for the checkpoints, so that a save can meet a real ENOSPC."""

    def __init__(self, path: Path, size_mb: int) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
            check=True,
            capture_output=True,
            text=True,
        )
        self.filler = path / ".chaos-filler"

    def fill(self, leave_bytes: int) -> int:
        """Fill the filesystem until ``leave_bytes`` are free (a save running meanwhile may get
        ENOSPC first); returns the bytes written."""
        written = 0
        with open(self.filler, "ab") as f:
            while True:
                st = os.statvfs(self.path)
                room = st.f_bavail * st.f_frsize - leave_bytes
                if room <= 0:
                    break
                try:
                    f.write(b"\0" * min(room, 1 << 20))
                    f.flush()
                except OSError:  # ENOSPC: a concurrent save took the rest
                    break
                written += min(room, 1 << 20)
        return written

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)


def damage_checkpoint(path: Path, rng: random.Random) -> str:
    """Truncate one data file of checkpoint ``path``, or flip one bit in it; returns what."""
    files = sorted(
        f for f in path.iterdir() if f.suffix in (".distcp", ".pt") or f.name == ".metadata"
    )
    victim = rng.choice(files)
    data = bytearray(victim.read_bytes())
    if rng.random() < 0.5:
        cut = rng.randrange(len(data))
        victim.write_bytes(bytes(data[:cut]))
        return f"truncated {victim.name} to {cut} of {len(data)} bytes"
    pos, bit = rng.randrange(len(data)), rng.randrange(8)
    data[pos] ^= 1 << bit
    victim.write_bytes(bytes(data))
    return f"flipped bit {bit} of byte {pos} in {victim.name}"


def checkpoint_bytes(path: Path) -> int:
    """Bytes of checkpoint ``path``, or 0 when the running job pruned it while they were counted
    (it keeps the newest few and deletes the rest as it saves)."""
    try:
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    except FileNotFoundError:
        return 0
