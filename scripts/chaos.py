"""Chaos run: one training job under a requeue loop meets many faults and must end exactly where an
uninterrupted job of the same seed ends.

    python scripts/chaos.py --faults 50 --out /tmp/chaos      # the full run (see BENCHMARKS.md)
    python scripts/chaos.py --faults 6 --short --out /tmp/c   # one of each kind (the CI test)

The job is the real CLI (``python -m rocmtrain``, CPU, 2 gloo ranks), each rank its own process as
an srun task is (``MASTER_ADDR``/``MASTER_PORT``/``LOCAL_RANK`` in its environment; the port stays
the same across restarts, as a Slurm job's does). The loop acts as a batch script with requeue:
the same command on the same ``run_dir``, relaunched when a rank exits 75 (hang, preemption) or a
rank died. After a rank exits non-zero the others get a grace period to exit on their own, then
SIGKILL (srun's ``--kill-on-bad-exit``). An uninterrupted reference job with the same seed runs
alongside. Faults (seeded; one per attempt at a random step read from the watchdog's heartbeat
files, plus the port and checkpoint faults at random restarts):

  sigkill  SIGKILL one rank: the other rank's watchdog sees it gone and exits 75
  sigstop  SIGSTOP one rank (a hang): the watchdog names it in hang_report.json and exits 75
  sigterm  SIGTERM the job (every rank, or one): checkpoint at an agreed step, exit 75
  corrupt  while the job is down, its newest checkpoint loses its tail or one bit: the restart
           skips it (sha256) and resumes from the one before
  enospc   the checkpoint filesystem (a small tmpfs) fills up before a save: the job stops, and
           once space is freed it resumes from the last good checkpoint
  port     at a restart the rendezvous port is held by a stale listener until a few seconds after
           rank 0 says it waits for it

At the end the run's per-step loss (both ranks, carried in the checkpoints), every per-step
loss/grad-norm row any attempt logged, and the final checkpoint's tensors are compared with the
reference's: equal bit for bit. Exit 0 when every fault was survived and everything is equal.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos_compare import compare_runs  # noqa: E402
from chaos_faults import (  # noqa: E402
    Fault,
    check_restart,
    corrupt_newest,
    hold_port,
    inject,
    port_outcome,
    resume_step,
)
from chaos_job import (  # noqa: E402
    Job,
    PortSquatter,
    Tmpfs,
    attempts_of,
    free_port,
    heartbeat_step,
)

KINDS = ("sigkill", "sigstop", "sigterm", "corrupt", "enospc", "port")


@dataclass
class Settings:
    out: Path
    faults: int = 50
    seed: int = 0
    epochs: int = 2
    batches: int = 160
    """Train batches per epoch per rank."""
    every: int = 5
    """Checkpoint every N steps: a resume repeats at most N - 1 steps."""
    hang_timeout_s: float = 6.0
    grace_s: float = 45.0
    """How long the other ranks may take to exit on their own after one rank's bad exit."""
    port_hold_s: float = 20.0
    attempt_timeout_s: float = 600.0

    @property
    def total_steps(self) -> int:
        return self.epochs * self.batches


@dataclass
class Attempt:
    name: str
    resumed_from: int
    last_step: int = -1
    codes: list = field(default_factory=list)
    killed: list = field(default_factory=list)
    seconds: float = 0.0
    restart: str = ""
    """What was wrong with how this attempt resumed ('' = from the newest intact checkpoint)."""
    unplanned: bool = False
    """Ended non-zero with no fault injected in it."""


def job_args(run_dir: Path, ckpt_dir: Path, s: Settings) -> list[str]:
    """The job's command line (the reference's differs only in its folders)."""
    return [
        f"run_dir={run_dir}",
        f"checkpoint.dir={ckpt_dir}",
        f"seed={s.seed}",
        f"trainer.max_epochs={s.epochs}",
        f"data.num_train_batches={s.batches}",
        "data.num_val_batches=2",
        "data.batch_size=64",
        "trainer.progress_bar=false",
        "trainer.log_every_n_steps=1",
        "precision.grad_health.log_every_n_steps=1",
        f"checkpoint.every_n_train_steps={s.every}",
        "checkpoint.keep_last=3",
        "monitor.enabled=false",
        # the harness reads the step from the heartbeat files; the hang timeout is short so a
        # stopped rank is found in seconds (fixed: a learned one needs 20 steps per attempt)
        "watchdog.heartbeat_channel=files",
        "watchdog.poll_interval_seconds=0.25",
        f"watchdog.hang_timeout_seconds={s.hang_timeout_s}",
        "watchdog.learn_timeout_from_step_times=false",
        "watchdog.collect_timeout_seconds=2",
    ]


#: faults done to a running attempt; the others happen between two attempts
DURING = ("sigkill", "sigstop", "sigterm", "enospc")


def schedule(s: Settings, rng: random.Random) -> list[dict]:
    """The plan, one entry per launch: the fault done to that attempt, whether the port is held
    when it starts, whether its newest checkpoint is damaged after it ends. One fault of each
    kind, then random kinds; a port or checkpoint fault goes to a random restart."""
    kinds = list(KINDS) + [rng.choice(KINDS) for _ in range(max(0, s.faults - len(KINDS)))]
    kinds = kinds[: s.faults]
    during = [k for k in kinds if k in DURING] or ["sigterm"]
    plan = [
        {"fault": k, "port": False, "corrupt_after": False} for k in rng.sample(during, len(during))
    ]
    plan.append({"fault": None, "port": False, "corrupt_after": False})  # runs to the end
    for kind in (k for k in kinds if k not in DURING):
        key = "port" if kind == "port" else "corrupt_after"
        # a port fault needs a restart (attempt >= 1); a damaged checkpoint must be resumed from
        free = [i for i in range(len(plan) - 1) if not plan[i + (key == "port")][key]]
        if free:
            plan[rng.choice(free) + (key == "port")][key] = True
    return plan


# -- the requeue loop -----------------------------------------------------------------------------
def wait_for_step(job: Job, run_dir: Path, seen: set[str], target: int, timeout_s: float) -> int:
    """Poll the heartbeat files until a rank reached ``target`` (or the job ended); the step."""
    deadline = time.monotonic() + timeout_s
    step = -1
    while job.running() == list(range(job.world)) and time.monotonic() < deadline:
        step = heartbeat_step(run_dir, seen)
        if step >= target:
            break
        time.sleep(0.02)
    return step


def attempt_once(n: int, entry: dict, s: Settings, ctx: dict, rng: random.Random):
    """One launch of the job with the faults of its plan ``entry``; returns (attempt, faults)."""
    faults: list[Fault] = []
    squatter = PortSquatter(ctx["port"]) if entry["port"] else None
    start = resume_step(ctx["ckpt_dir"])
    ctx["seen"] = attempts_of(ctx["run_dir"])
    job = Job(ctx["args"], 2, ctx["port"], ctx["logs"], f"attempt{n:03d}").start()
    if squatter:
        faults.append(Fault("port", n))
        hold_port(job, squatter, faults[-1], s, rng)
    attempt = Attempt(job.name, start)
    codes = None
    if entry["fault"]:
        fault = Fault(entry["fault"], n)
        target = min(start + rng.randint(2, 3 * s.every), s.total_steps - 2)
        fault.at_step = wait_for_step(job, ctx["run_dir"], ctx["seen"], target, s.attempt_timeout_s)
        if job.running() == list(range(job.world)):
            faults.append(fault)
            codes = inject(fault, job, s, ctx, rng)
    if codes is None:
        codes = job.finish(grace_s=s.grace_s)
    attempt.codes, attempt.killed = codes, sorted(job.killed)
    attempt.seconds = round(time.monotonic() - job.started, 1)
    attempt.last_step = heartbeat_step(ctx["run_dir"], ctx["seen"])
    attempt.restart = check_restart(job, start, ctx.pop("skip", ""))
    if squatter:
        faults[0].why = port_outcome(job, start, attempt.last_step)
    if entry["corrupt_after"] and codes != [0, 0]:
        faults.append(corrupt_newest(n, ctx, rng))
        ctx["skip"] = faults[-1].skipped
    return attempt, faults


def chaos_loop(s: Settings, ctx: dict, rng: random.Random, say) -> tuple[list, list]:
    """Relaunch the job, one fault per launch, until it completes; returns (faults, attempts).

    A fault is survived when the job reacted as it must (see :func:`inject`) and the next
    launch resumed from the newest intact checkpoint."""
    plan, faults, attempts = deque(schedule(s, rng)), [], []
    while plan and len(attempts) < 3 * s.faults + 10:
        attempt, new = attempt_once(len(attempts), plan[0], s, ctx, rng)
        for f in faults:  # the faults before this launch answer for how it resumed
            if f.attempt == len(attempts) - 1 and f.kind != "port" and attempt.restart:
                f.why = "; ".join(x for x in (f.why, f"restart: {attempt.restart}") if x)
        attempts.append(attempt)
        faults += new
        for f in faults:
            f.survived = not f.why
        planned = plan[0]["fault"] is None or any(f.kind == plan[0]["fault"] for f in new)
        attempt.unplanned = not planned or (plan[0]["fault"] is None and attempt.codes != [0, 0])
        if planned:
            plan.popleft()  # else the same entry again: the job was restarted for another reason
        say(
            f"{attempt.name}: steps {attempt.resumed_from}-{attempt.last_step}: "
            + (", ".join(f"{f.kind} at step {f.at_step} ({f.detail})" for f in new) or "no fault")
            + f" -> exit {attempt.codes} in {attempt.seconds} s"
            + "".join(f"; {f.kind} NOT SURVIVED: {f.why}" for f in new if f.why)
            + (" UNPLANNED" if attempt.unplanned else "")
        )
        if attempt.codes == [0, 0]:
            if plan:
                say(f"the job completed with {len(plan)} launch(es) of the plan left")
            break
    return faults, attempts


def steps_recomputed(attempts: list[Attempt]) -> int:
    """Steps trained again after a restart: each attempt's last step past the next one's start."""
    return sum(
        max(0, a.last_step - b.resumed_from) for a, b in zip(attempts, attempts[1:], strict=False)
    )


def run(s: Settings, say=print) -> dict:
    rng = random.Random(s.seed)
    out = s.out.resolve()
    if out.exists() and any(out.iterdir()):  # its runs would resume from the last chaos run
        raise SystemExit(f"chaos: --out {out} is not empty; give a new folder")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    ref_dir, run_dir = out / "reference", out / "run"
    tmpfs = Tmpfs(out / "ckpt_fs", size_mb=48)
    try:
        ctx = dict(
            run_dir=run_dir,
            ckpt_dir=tmpfs.path / "checkpoints",
            tmpfs=tmpfs,
            port=free_port(),
            logs=out / "logs",
        )
        ctx["args"] = job_args(run_dir, ctx["ckpt_dir"], s)
        ref = Job(
            job_args(ref_dir, ref_dir / "checkpoints", s), 2, free_port(), out / "logs", "reference"
        ).start()
        faults, attempts = chaos_loop(s, ctx, rng, say)
        ref_codes = ref.finish(grace_s=s.grace_s)
        shutil.copytree(ctx["ckpt_dir"], out / "checkpoints", dirs_exist_ok=True)  # kept
    finally:
        tmpfs.close()
    comparison = compare_runs(ref_dir / "checkpoints", out / "checkpoints", ref_dir, run_dir)
    injected = len(faults)
    survived = sum(f.survived for f in faults)
    report = dict(
        settings={k: str(v) for k, v in asdict(s).items()},
        wall_seconds=round(time.monotonic() - t0, 1),
        faults_injected=injected,
        faults_survived=survived,
        by_kind={
            k: [sum(f.kind == k for f in faults), sum(f.kind == k and f.survived for f in faults)]
            for k in KINDS
        },
        attempts=len(attempts),
        steps_recomputed=steps_recomputed(attempts),
        reference_exit=ref_codes,
        final_exit=attempts[-1].codes if attempts else None,
        comparison=comparison,
        faults=[asdict(f) for f in faults],
        attempt_log=[asdict(a) for a in attempts],
    )
    report["unplanned_exits"] = sum(a.unplanned for a in attempts)
    report["ok"] = (
        not report["unplanned_exits"]
        and injected >= s.faults
        and survived == injected
        and ref_codes == [0, 0]
        and report["final_exit"] == [0, 0]
        and comparison["identical"]
    )
    (out / "chaos_report.json").write_text(json.dumps(report, indent=1))
    return report


def summary(r: dict) -> str:
    c = r["comparison"]
    kinds = ", ".join(f"{k} {s}/{n}" for k, (n, s) in r["by_kind"].items())
    lines = [
        f"chaos: {r['faults_survived']}/{r['faults_injected']} faults survived ({kinds}); "
        f"{r['attempts']} attempts, {r['steps_recomputed']} steps recomputed, {r['wall_seconds']} s",
        f"chaos: vs the uninterrupted run: {c['summary']}",
        f"chaos: {'OK' if r['ok'] else 'FAILED'}",
    ]
    lines += [
        f"  not survived: {f['kind']} at step {f['at_step']} ({f['detail']}): {f['why']}"
        for f in r["faults"]
        if not f["survived"]
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="working folder (reports, logs, runs)")
    p.add_argument("--faults", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batches", type=int, default=None, help="train batches per epoch per rank")
    p.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    p.add_argument("--short", action="store_true", help="CI size: few steps, short waits")
    a = p.parse_args(argv)
    s = Settings(out=a.out, faults=a.faults, seed=a.seed, epochs=a.epochs, every=a.every)
    s.batches = a.batches or max(30, 12 * a.faults // a.epochs + 10)
    if a.short:
        s.port_hold_s, s.hang_timeout_s = 12.0, 4.0
    try:
        report = run(s, say=lambda m: print(f"chaos: {m}", flush=True))
    except Exception:  # noqa: BLE001  (the report says why; the exit code says it failed)
        error = traceback.format_exc()
        print(error, file=sys.stderr, flush=True)
        s.out.mkdir(parents=True, exist_ok=True)
        (s.out / "chaos_report.json").write_text(json.dumps({"ok": False, "error": error}))
        return 1
    print(summary(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
