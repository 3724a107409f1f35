"""One run per run directory: the launching rank holds an exclusive lock on ``<run_dir>/.lock``
while it runs, so a second run started on the same folder is refused at once instead of training
alongside and then colliding on its checkpoints and ``metrics.csv``.

``flock`` is released by the kernel when the process ends, however it ends (SIGKILL, OOM), so a
requeued or resumed run never meets a stale lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = ".lock"

#: open lock files of this process, by run dir (kept open: closing one releases its lock)
_held: dict[str, int] = {}


def holder(run_dir: Path) -> str | None:
    """Who holds ``run_dir``'s lock (``pid N``), or None when it is free or not ours to read."""
    path = Path(run_dir) / LOCK_NAME
    key = str(Path(run_dir).resolve())
    if key in _held or not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        text = path.read_text().strip()
        return f"pid {text}" if text else "another process"
    except OSError:  # a filesystem without flock: nothing can be said
        return None
    finally:
        os.close(fd)
    return None


def acquire(run_dir: Path) -> str | None:
    """Hold ``run_dir``'s lock for the rest of this process; the holder's ``pid N`` when
    another process has it (nothing is held then)."""
    run_dir = Path(run_dir)
    key = str(run_dir.resolve())
    if key in _held:
        return None
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return f"pid {(run_dir / LOCK_NAME).read_text().strip() or '?'}"
    except OSError:  # a filesystem without flock (some network mounts): run unguarded
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held[key] = fd
    return None
