"""The faults of ``scripts/chaos.py``: what each does to a job and what the job must do about it,
and the checkpoint folder as the harness sees it from outside (always fully verified: files change
under it)."""

from __future__ import annotations

import random
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos_job import Job, PortSquatter, Tmpfs, checkpoint_bytes, damage_checkpoint, hang_reports

REQUEUE = 75


@dataclass
class Fault:
    kind: str
    attempt: int
    detail: str = ""
    at_step: int = -1
    survived: bool = False
    why: str = ""
    skipped: str = ""
    """The damaged checkpoint the next attempt must skip (``corrupt``)."""


# -- checkpoints, seen from outside ---------------------------------------------------------------
def checkpoints(root: Path) -> list[tuple[int, Path]]:
    from rocmtrain import checkpoint as ckpt

    return [(int(p.name.split("-")[1]), p) for p in ckpt.list_checkpoints(root)]


def intact(path: Path) -> bool:
    """Fully checked (sizes and sha256), never from a cache: files change under the harness."""
    from rocmtrain import checkpoint as ckpt

    try:
        marker = ckpt.read_marker(path)
        return (
            ckpt.size_problem(path, marker) is None and ckpt.checksum_problem(path, marker) is None
        )
    except FileNotFoundError:  # a running job pruned it while it was read
        return False


def resume_step(root: Path) -> int:
    """The step the next attempt must resume from: the newest intact checkpoint's, else 0."""
    return next((step for step, p in reversed(checkpoints(root)) if intact(p)), 0)


def newest_step(root: Path) -> int:
    """The newest completely written checkpoint's step (sizes only: cheap enough to poll)."""
    from rocmtrain import checkpoint as ckpt

    return max((step for step, p in checkpoints(root) if ckpt.is_complete(p)), default=0)


# -- the faults -----------------------------------------------------------------------------------
def others_exited_requeue(job: Job, codes: list[int], culprit: int | None) -> str:
    """'' when every rank but ``culprit`` exited 75 by itself; else what happened."""
    bad = [
        f"rank {r} exit {c}" + (" (killed by the harness)" if r in job.killed else "")
        for r, c in enumerate(codes)
        if r != culprit and (c != REQUEUE or r in job.killed)
    ]
    return "; ".join(bad)


def inject(fault: Fault, job: Job, s: Any, ctx: dict, rng: random.Random) -> list[int]:
    """Do ``fault`` to the running ``job``; wait for its end; set ``survived``; return codes."""
    kind = fault.kind
    if kind in ("sigkill", "sigstop"):
        rank = rng.randrange(job.world)
        fault.detail = f"rank {rank}"
        job.signal(rank, signal.SIGKILL if kind == "sigkill" else signal.SIGSTOP)
        codes = job.finish(grace_s=s.grace_s, stopped={rank} if kind == "sigstop" else set())
        fault.why = others_exited_requeue(job, codes, rank)
        if kind == "sigstop":
            named = [r["stuck_ranks"] for r in hang_reports(ctx["run_dir"], ctx["seen"])]
            if [rank] not in named:
                fault.why += f"; hang reports name {named}, not [{rank}]"
        return codes
    if kind == "sigterm":
        before = newest_step(ctx["ckpt_dir"])
        ranks = list(range(job.world)) if rng.random() < 0.5 else [rng.randrange(job.world)]
        fault.detail = "every rank" if len(ranks) == job.world else f"rank {ranks[0]} only"
        for r in ranks:
            job.signal(r, signal.SIGTERM)
        codes = job.finish(grace_s=s.grace_s)
        fault.why = others_exited_requeue(job, codes, None)
        after = newest_step(ctx["ckpt_dir"])
        if after <= before:
            fault.why += f"; no preemption checkpoint (newest still step {after})"
        return codes
    if kind == "enospc":
        return _enospc(fault, job, s, ctx)
    raise ValueError(kind)


def _enospc(fault: Fault, job: Job, s: Any, ctx: dict) -> list[int]:
    """Keep the checkpoint filesystem full to within half a checkpoint until the job exits (as a
    disk that something else fills): the next save fails, however a save in flight or a prune
    moved the free space meanwhile. The job must stop by itself (non-zero); the operator then
    frees space and resubmits. The first error line a rank printed goes into the report (its
    wording is not checked)."""
    fs: Tmpfs = ctx["tmpfs"]
    done = [p for _, p in checkpoints(ctx["ckpt_dir"]) if intact(p)]
    # the job runs and prunes meanwhile: the newest checkpoint still there gives the size
    size = next((b for b in map(checkpoint_bytes, reversed(done)) if b), 1 << 20)
    stop = threading.Event()
    filled = [0]

    def keep_full() -> None:
        while not stop.is_set():
            filled[0] += fs.fill(leave_bytes=size // 2)
            time.sleep(0.002)

    filler = threading.Thread(target=keep_full, daemon=True)
    filler.start()
    codes = job.finish(grace_s=s.grace_s)
    stop.set()
    filler.join()
    fs.free()
    said = next(
        (ln for r in range(job.world) for ln in job.log_text(r).splitlines() if "error:" in ln),
        "",
    )
    fault.detail = f"filled {filled[0] >> 20} MiB, {size // 2 >> 10} KiB left; said: {said[:160]}"
    problems = [f"rank {r} did not exit by itself" for r in sorted(job.killed)]
    if all(c == 0 for c in codes):
        problems.append("the job ended 0: the save did not fail")
    fault.why = "; ".join(problems)
    return codes


def check_restart(job: Job, expected_step: int, skipped: str | None) -> str:
    """'' when rank 0's log shows the resume the harness expects (and the skipped checkpoint)."""
    text = job.log_text(0)
    problems = []
    if skipped and not re.search(rf"skipping checkpoint \S*{skipped}", text):
        problems.append(f"did not skip the damaged {skipped}")
    found = re.search(r"resuming from \S*step-(\d+)", text)
    got = int(found.group(1)) if found else 0
    if got != expected_step:
        problems.append(f"resumed from step {got}, the newest intact checkpoint is {expected_step}")
    return "; ".join(problems)


#: what rank 0 logs while it waits for a busy MASTER_PORT (rocmtrain.comms.rendezvous)
PORT_WAIT_LINE = "is in use on this host; waiting"


def hold_port(job: Job, squatter: PortSquatter, fault: Fault, s: Any, rng: random.Random):
    """Release the held port a few seconds after rank 0 says it waits for it (or when rank 0
    has exited, or after ``port_hold_s``)."""
    delay = rng.uniform(1.0, 4.0)

    def release() -> None:
        deadline = time.monotonic() + s.port_hold_s
        while time.monotonic() < deadline and job.procs[0].poll() is None:
            if PORT_WAIT_LINE in job.log_text(0):
                time.sleep(delay)
                break
            time.sleep(0.1)
        squatter.release()

    fault.detail = f"port {squatter.port} held until {delay:.1f} s after rank 0 waits for it"
    threading.Thread(target=release, daemon=True).start()


def port_outcome(job: Job, start: int, last_step: int) -> str:
    """'' when rank 0 waited for the held port and the attempt then trained."""
    if PORT_WAIT_LINE not in job.log_text(0):
        gave_up = " (exit 2: it gave up at once)" if job.codes()[0] == 2 else ""
        return "rank 0 never waited for the port" + gave_up
    return "" if last_step > start else f"nothing trained after the port was free ({job.codes()})"


def corrupt_newest(n: int, ctx: dict, rng: random.Random) -> Fault:
    """Damage the newest intact checkpoint while the job is down (the next launch must skip it)."""
    fault = Fault("corrupt", n)
    done = [(st, p) for st, p in checkpoints(ctx["ckpt_dir"]) if intact(p)]
    if not done:
        fault.why = "no checkpoint to damage"
        return fault
    step, path = done[-1]
    fault.at_step, fault.skipped = step, path.name
    fault.detail = damage_checkpoint(path, rng)
    return fault
