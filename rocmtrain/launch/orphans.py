"""Ranks started by Lightning's script launcher end with their launcher.

Lightning re-runs the command line for local ranks > 0 as children of rank 0. If rank 0 dies
before it can kill them (an error during start-up, SIGKILL, the OOM killer), they would wait for
a rendezvous that never completes. ``PR_SET_PDEATHSIG`` makes the kernel kill such a child when
its parent exits; Linux only (elsewhere a no-op that says so).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def started_by_lightning(environ: dict[str, str] | None = None) -> bool:
    """True in a local rank > 0 that Lightning's script launcher started (not torchrun, not an
    srun task: those have their own supervisor)."""
    env = os.environ if environ is None else environ
    return (
        int(env.get("LOCAL_RANK", "0") or 0) > 0
        and "TORCHELASTIC_RUN_ID" not in env
        and "SLURM_STEP_ID" not in env
    )


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits. Returns whether it
    is armed; exits at once if the parent is already gone (re-parented to init)."""
    if not sys.platform.startswith("linux"):
        log.debug("die_with_parent: not on Linux; orphaned ranks are not cleaned up")
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        return False
    if os.getppid() != parent:  # the launcher died between the two calls
        os._exit(1)
    return True
