"""Why a run stopped: one row per cause, read by the classifier, the hang report and the exit.

A cause is a name (what the hang report and the logs print), whether a requeue from the last
checkpoint can help, and the next steps the report lists. The exit code follows from the
requeue flag: the configured requeue code (``watchdog.exit_code``, 75 by default) or the plain
failure code, so that Slurm never requeues a run that would fail the same way again.

A new fault type is one row here plus its detector (in :mod:`rocmtrain.faults.hang_report` or
:mod:`rocmtrain.faults.watchdog`); nothing else matches on its name.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocmtrain import exit_codes


@dataclass(frozen=True)
class Cause:
    """One row of the cause table."""

    name: str
    """What the hang report, its JSON and the logs call it."""
    requeue: bool
    """True when a restart from the last checkpoint may succeed (exit with the requeue code)."""
    next_steps: tuple[str, ...]
    """What the reader of the hang report should do, in order."""

    def exit_code(self, requeue_code: int = exit_codes.REQUEUE) -> int:
        """The process exit code: ``requeue_code`` for a requeueable cause, else FAILURE."""
        return requeue_code if self.requeue else exit_codes.FAILURE


_REQUEUE_NOTE = "The job exits with the requeue code; it resumes from the last checkpoint."

STALL = Cause(
    "stall",
    True,
    (
        "Read the stuck rank's Python stacks (above, and in its stacks file): the first frames "
        "of its main thread are the line it waits on.",
        "Compare the flight-recorder files: `torchfrtrace <dir> --prefix fr_rank_` names "
        "mismatched or missing collectives.",
        "If the stuck rank was doing legitimate slow work (data loading, checkpoint, first step), "
        "raise watchdog.hang_timeout_seconds / checkpoint_timeout_seconds / "
        "first_step_timeout_seconds.",
        _REQUEUE_NOTE,
    ),
)
PEER_EXITED = Cause(
    "peer_exited",
    True,
    (
        "Look at the exited rank's own log (Slurm: its task's output file) for the crash reason "
        "(OOM killer: `dmesg | grep -i kill`; GPU fault: AMD_LOG_LEVEL=1).",
        _REQUEUE_NOTE,
    ),
)
PEER_FAILED = Cause(
    "peer_failed",
    False,
    (
        "Fix the exception reported by the failed rank (<run_dir>/logs/error_rank<R>.txt has its "
        "traceback and hint); the other ranks exit with the plain failure code so Slurm does not "
        "requeue a broken run.",
    ),
)
COMM_ERROR = Cause(
    "comm_error",
    True,
    (
        "A collective failed while every peer was alive: read the error hint "
        "(<run_dir>/error_hint_rank<R>.txt) and the flight-recorder files "
        "(`torchfrtrace <dir> --prefix fr_rank_`).",
        "Check the network between the nodes (NCCL_DEBUG=WARN, rccl.debug=WARN, names the failing "
        "transport) and the collective environment the run logged at start-up.",
        _REQUEUE_NOTE,
    ),
)
STORE_LOST = Cause(
    "store_lost",
    True,
    (
        "The rendezvous store (hosted by rank 0 or the torchrun agent) stopped answering: rank "
        "0's process or node is probably gone; check its log.",
        _REQUEUE_NOTE,
    ),
)

#: name -> row: every cause rocmtrain reports
CAUSES: dict[str, Cause] = {
    c.name: c for c in (STALL, PEER_EXITED, PEER_FAILED, COMM_ERROR, STORE_LOST)
}


def cause(name: str) -> Cause:
    """The row of ``name``; an unknown name (a report written by another version) is a stall."""
    return CAUSES.get(name, STALL)
