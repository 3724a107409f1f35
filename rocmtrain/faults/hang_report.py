"""Hang evidence and the hang report: who is stuck, where, and what each rank was doing.

Pieces, used by :mod:`rocmtrain.faults.watchdog` (and testable on their own):

- :func:`dump_stacks` — all-thread Python stacks of this process (``faulthandler``) into a file.
- :func:`dump_flight_recorder` — this rank's PyTorch flight-recorder buffer (pickle, the format
  ``torchfrtrace DIR --prefix fr_rank_`` reads) plus a short summary (last collective, its sequence
  number and state). torch >= 2.8 records gloo collectives too; older torch only has it for NCCL.
- :func:`classify` — pure: from the last heartbeats, which ranks are behind and why.
- :func:`build_report` / :func:`render_text` / :func:`write_report` — ``hang_report.json`` and
  ``hang_report.txt`` in the attempt directory, copied to ``<run_dir>/hang_report.{json,txt}``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import glob
import json
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocmtrain.faults.causes import CAUSES, PEER_EXITED, PEER_FAILED, STALL, cause
from rocmtrain.faults.heartbeat import HOST, PID_NS, Heartbeat, pid_alive


def run_with_timeout(fn: Callable[[], Any], timeout_s: float) -> tuple[bool, Any]:
    """Run ``fn`` in a daemon thread; ``(finished, result_or_exception)`` after at most ``timeout_s``.

    Used for everything that might block on a wedged runtime (a flight-recorder dump querying GPU
    events, an NCCL abort): the watchdog must always reach its exit.
    """
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # noqa: BLE001 - reported, never raised in the monitor
            box.append(e)

    t = threading.Thread(target=target, name="rocmtrain-watchdog-helper", daemon=True)
    t.start()
    t.join(timeout_s)
    return (not t.is_alive(), box[0] if box else None)


def dump_stacks(path: Path) -> str:
    """Append all threads' Python stacks of this process to ``path``; return the path as text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(f"# pid {os.getpid()} at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
    return str(path)


def _fr_dumpers(backend: str) -> tuple[list[tuple[str, Callable[[], bytes]]], str]:
    """The flight-recorder dump functions this torch offers, best first for ``backend``.

    torch keeps two recorders: ``_dump_nccl_trace`` (ProcessGroupNCCL, CUDA events; CUDA/ROCm
    builds) and ``_dump_fr_trace`` (the device-agnostic one gloo records into, torch >= 2.8).
    """
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return [], "torch.distributed is not available in this build"
    order = (
        ("_dump_nccl_trace", "_dump_fr_trace")
        if "nccl" in backend
        else ("_dump_fr_trace", "_dump_nccl_trace")
    )
    found = [(name, getattr(c10d, name)) for name in order if hasattr(c10d, name)]
    why = (
        "this torch has no flight recorder dump (_dump_fr_trace / _dump_nccl_trace); on gloo it "
        "needs torch >= 2.8, on older torch only ProcessGroupNCCL records collectives"
    )
    return found, why


def summarise_fr(raw: bytes) -> dict[str, Any]:
    """Entries count and the last collective of a flight-recorder pickle."""
    data = pickle.loads(raw)
    entries = data.get("entries", []) or []
    out: dict[str, Any] = {"entries": len(entries)}
    if entries:
        last = entries[-1]
        out["last"] = {
            k: last.get(k)
            for k in ("collective_seq_id", "p2p_seq_id", "profiling_name", "state", "process_group")
        }
        out["last"]["process_group"] = list(out["last"]["process_group"] or [])
        out["not_completed"] = sum(1 for e in entries if e.get("state") != "completed")
    return out


def fr_buffer_size() -> int:
    """``TORCH_FR_BUFFER_SIZE`` (or its old name) as PyTorch reads it; 0 = recorder off."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = os.environ.get(name)
        if value:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


def dump_flight_recorder(
    path: Path, *, backend: str = "", timeout_s: float = 5.0
) -> dict[str, Any]:
    """Write this rank's flight recorder to ``path``; return ``{file, via, entries, last}`` or
    ``{skipped: why}``. Tries the recorder that fits ``backend`` first, the other if it is empty."""
    dumpers, why = _fr_dumpers(backend)
    if not dumpers:
        return {"skipped": why}
    if fr_buffer_size() <= 0:
        return {
            "skipped": "flight recorder off: TORCH_FR_BUFFER_SIZE is unset or 0 "
            "(set rccl.flight_recorder_entries, e.g. 2000)"
        }
    best: tuple[str, bytes, dict[str, Any]] | None = None
    errors = []
    for how, fn in dumpers:
        done, result = run_with_timeout(fn, timeout_s)
        if not done or isinstance(result, BaseException):
            errors.append(
                f"{how}(): " + (f"no answer in {timeout_s} s" if not done else repr(result))
            )
            continue
        try:
            summary = summarise_fr(result)
        except Exception as e:  # noqa: BLE001 - keep the raw bytes, say why there is no summary
            summary = {"summary_error": repr(e)}
        if best is None or (summary.get("entries", 0) and not best[2].get("entries", 0)):
            best = (how, result, summary)
        if summary.get("entries", 0):
            break
    if best is None:
        return {"skipped": "; ".join(errors)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(best[1])
    return {"file": str(path), "via": best[0], **best[2]}


def collect_dumps(
    kv: Any,
    expected: list[int],
    beats: dict[int, Heartbeat],
    dumps: dict[int, dict[str, Any]],
    *,
    timeout_s: float,
    signal_silent: bool,
) -> dict[int, str]:
    """Wait up to ``timeout_s`` for the ``ack/<rank>`` dumps of ``expected`` ranks (into ``dumps``);
    half-way, send SIGUSR2 to silent same-host ranks (faulthandler prints their stacks to stderr).
    Returns a note per rank that did not answer."""
    notes: dict[int, str] = {}
    start, signalled = time.monotonic(), False
    while expected:
        try:
            for r, v in zip(expected, kv.multi_get([f"ack/{r}" for r in expected]), strict=True):
                if v:
                    dumps[r] = json.loads(v)
        except Exception:  # noqa: BLE001 - channel gone: report what we have
            break
        expected = [r for r in expected if r not in dumps]
        waited = time.monotonic() - start
        if expected and signal_silent and not signalled and waited > timeout_s / 2:
            signalled = True
            for r in expected:
                b = beats.get(r)
                if b and b.host == HOST and b.pid_ns == PID_NS and pid_alive(b.pid):
                    with contextlib.suppress(OSError):
                        os.kill(b.pid, signal.SIGUSR2)
                        notes[r] = "did not answer; sent SIGUSR2: its stacks are in its stderr"
        if waited > timeout_s:
            for r in expected:
                notes.setdefault(r, f"did not answer within {timeout_s} s")
            break
        time.sleep(0.1)
    return notes


def classify(
    beats: dict[int, Heartbeat], *, world_size: int, dead: set[int], stale: set[int]
) -> dict[str, Any]:
    """Which ranks are stuck, and why (pure function of the last heartbeats).

    - a rank whose process is gone → ``peer_exited`` (or ``peer_failed`` if it reported an exception);
    - otherwise, among live non-finished ranks, the ones furthest behind in ``(step, beat_in_step)``
      → ``stall`` with those ranks named;
    - all at the same point → ``stall`` with every rank named (everybody waits inside the same
      collective: suspect the network / collective library rather than one slow rank).
    - ranks that never sent a heartbeat are behind everybody.
    """
    missing = [r for r in range(world_size) if r not in beats]
    failed = sorted(r for r, b in beats.items() if b.phase.startswith("failed"))
    if failed:
        return {
            "cause": PEER_FAILED.name,
            "stuck_ranks": failed,
            "summary": "rank(s) "
            + ", ".join(f"{r} ({beats[r].phase})" for r in failed)
            + " raised an exception; the others waited for them",
        }
    if dead:
        names = sorted(dead)
        where = ", ".join(
            f"{r} (last seen at step {beats[r].step}, phase {beats[r].phase!r})"
            for r in names
            if r in beats
        )
        return {
            "cause": PEER_EXITED.name,
            "stuck_ranks": names,
            "summary": f"rank(s) {names} exited without finishing: {where or 'before their first heartbeat'}",
        }
    live = {r: b for r, b in beats.items() if not b.terminal}
    if missing:
        return {
            "cause": STALL.name,
            "stuck_ranks": missing,
            "summary": f"rank(s) {missing} never sent a heartbeat (stuck in start-up or init)",
        }
    if not live:
        return {"cause": STALL.name, "stuck_ranks": sorted(stale), "summary": "all ranks finished"}
    key = {r: (b.step, b.beat_in_step) for r, b in live.items()}
    low = min(key.values())
    behind = sorted(r for r, k in key.items() if k == low)
    b0 = live[behind[0]]
    where = f"step {b0.step}, phase {b0.phase!r}" + (
        f", collective {b0.collective!r}" if b0.collective else ""
    )
    if len(behind) == len(live):
        summary = (
            f"every live rank stopped at the same point ({where}): all wait inside the same "
            "operation; suspect the network/collective library or a rank-independent hang"
        )
    else:
        ahead = sorted(set(live) - set(behind))
        a0 = live[ahead[0]]
        summary = (
            f"rank(s) {behind} are behind at {where}; rank(s) {ahead} already reached step "
            f"{a0.step}, phase {a0.phase!r} and wait for them"
        )
    return {"cause": STALL.name, "stuck_ranks": behind, "summary": summary}


def refine_with_answers(decision: dict[str, Any], answered: set[int]) -> dict[str, Any]:
    """When every rank stopped at the same step and phase, the ones whose watchdog thread did not
    answer the dump request are the stuck ones: a rank that waits in a collective still runs its
    monitor thread, a stopped (SIGSTOP, a debugger) or wedged process does not. Returns
    ``decision`` with only the silent ranks as stuck when some answered and some did not."""
    stuck = decision.get("stuck_ranks", ())
    if decision.get("cause") != STALL.name or len(stuck) < 2:
        return decision
    silent = sorted(r for r in stuck if r not in answered)
    waiting = sorted(r for r in stuck if r in answered)
    if not silent or not waiting:
        return decision
    return {
        **decision,
        "stuck_ranks": silent,
        "summary": (
            f"rank(s) {silent} stopped answering (the process is stopped or wedged: not even its "
            f"watchdog thread runs); rank(s) {waiting} answered and wait for them"
        ),
    }


def refine_with_flight_recorder(
    decision: dict[str, Any], dumps: dict[int, dict[str, Any]]
) -> dict[str, Any]:
    """When every rank stopped at the same step and phase (a collective inside the model's
    forward, e.g. TorchRec's input all-to-all), the flight recorders still tell them apart: a
    rank that issued fewer collectives on the same process group has not reached the one the
    others wait in. Returns ``decision`` with those ranks as the stuck ones, else unchanged."""
    if decision.get("cause") != STALL.name or len(decision.get("stuck_ranks", ())) < 2:
        return decision
    last = {r: dumps.get(r, {}).get("last") or {} for r in decision["stuck_ranks"]}
    seqs = {r: e.get("collective_seq_id") for r, e in last.items()}
    groups = {tuple(e.get("process_group") or ()) for e in last.values()}
    if None in seqs.values() or len(groups) != 1 or len(set(seqs.values())) < 2:
        return decision
    low, high = min(seqs.values()), max(seqs.values())
    behind = sorted(r for r, q in seqs.items() if q == low)
    ahead = sorted(r for r, q in seqs.items() if q == high)
    name = last[ahead[0]].get("profiling_name") or "a collective"
    return {
        **decision,
        "stuck_ranks": behind,
        "summary": (
            f"rank(s) {behind} are behind (flight recorder: their last collective is #{low}); "
            f"rank(s) {ahead} already issued #{high} ({name}) and wait inside it for them"
        ),
    }


#: cause name -> next steps (kept for readers of the old name; the table is faults.causes)
NEXT_STEPS = {name: list(row.next_steps) for name, row in CAUSES.items()}


def stack_excerpt(path: str | os.PathLike[str], *, max_lines: int = 40) -> str:
    """The training threads' stacks from a :func:`dump_stacks` file (the watchdog's own thread and
    the header dropped), at most ``max_lines`` lines."""
    try:
        text = Path(path).read_text()
    except OSError:
        return ""
    blocks = [
        b for b in text.split("\n\n") if b.strip() and "rocmtrain/faults/watchdog.py" not in b
    ]
    lines = [ln for b in blocks for ln in b.splitlines() if not ln.startswith("# pid")]
    return "\n".join(lines[:max_lines])


def build_report(
    *,
    decision: dict[str, Any],
    beats: dict[int, Heartbeat],
    stale_s: dict[int, float],
    dumps: dict[int, dict[str, Any]],
    notes: dict[int, str],
    world_size: int,
    declared_by: int,
    timeout_s: float,
    attempt: str,
    backend: str,
    fr_files: list[str],
) -> dict[str, Any]:
    """The JSON-able hang report."""
    ranks = []
    for r in range(world_size):
        b = beats.get(r)
        entry: dict[str, Any] = {"rank": r, "answered": r in dumps}
        if b is not None:
            entry.update(
                host=b.host,
                pid=b.pid,
                step=b.step,
                phase=b.phase,
                collective=b.collective,
                seq=b.seq,
                last_beat_wall=b.wall_time,
            )
        if r in stale_s:
            entry["seconds_since_progress"] = round(stale_s[r], 2)
        entry.update(dumps.get(r, {}))
        if r in notes:
            entry["note"] = notes[r]
        if r in decision["stuck_ranks"] and entry.get("stacks_file"):
            entry["stack_excerpt"] = stack_excerpt(entry["stacks_file"])
        ranks.append(entry)
    stuck = decision["stuck_ranks"]
    return {
        "version": 1,
        "cause": decision["cause"],
        "summary": decision["summary"],
        "stuck_ranks": stuck,
        "stuck_steps": {str(r): beats[r].step for r in stuck if r in beats},
        "declared_by": declared_by,
        "declared_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "timeout_seconds": timeout_s,
        "world_size": world_size,
        "attempt": attempt,
        "backend": backend,
        "ranks": ranks,
        "flight_recorder_dump_files": fr_files,
        "next_steps": list(cause(decision["cause"]).next_steps),
    }


def render_text(report: dict[str, Any]) -> str:
    """A readable version of the report (what an operator reads first)."""
    if report["cause"] == PEER_FAILED.name:  # not a hang: a rank raised and said so
        title = (
            f"RANK FAILURE REPORT — rank(s) {report['stuck_ranks']} raised an exception; "
            f"declared by rank {report['declared_by']} at {report['declared_at']}"
        )
    else:
        title = (
            f"HANG REPORT ({report['cause']}) — declared by rank {report['declared_by']} at "
            f"{report['declared_at']} after {report['timeout_seconds']:.1f} s without progress"
        )
    lines = [
        title,
        f"stuck rank(s): {report['stuck_ranks']}  step(s): {report['stuck_steps']}",
        report["summary"],
        "",
        f"{'rank':>4}  {'host':<16} {'pid':>7} {'step':>6}  {'phase':<22} {'idle s':>7}  answered  last collective (flight recorder)",
    ]
    for e in report["ranks"]:
        last = e.get("last") or {}
        fr = (
            f"#{last.get('collective_seq_id')} {last.get('profiling_name')} ({last.get('state')})"
            if last
            else e.get("skipped", "-")
        )
        lines.append(
            f"{e['rank']:>4}  {str(e.get('host', '?')):<16} {str(e.get('pid', '?')):>7} "
            f"{str(e.get('step', '?')):>6}  {str(e.get('phase', '?')):<22} "
            f"{str(e.get('seconds_since_progress', '?')):>7}  {'yes' if e['answered'] else 'no':<8}  {fr}"
        )
    lines.append("")
    for e in report["ranks"]:
        if e.get("note"):
            lines.append(f"rank {e['rank']}: {e['note']}")
        if e.get("stacks_file"):
            lines.append(f"rank {e['rank']} stacks: {e['stacks_file']}")
        if e.get("file"):
            lines.append(f"rank {e['rank']} flight recorder: {e['file']}")
    for e in report["ranks"]:
        if e.get("stack_excerpt"):
            lines += ["", f"stuck rank {e['rank']} — Python stacks:"]
            lines += ["  " + ln for ln in e["stack_excerpt"].splitlines()]
    if report["flight_recorder_dump_files"]:
        lines.append(
            "PyTorch flight-recorder dumps: " + ", ".join(report["flight_recorder_dump_files"])
        )
    lines += ["", "Next steps:"] + [f"  - {s}" for s in report["next_steps"]]
    return "\n".join(lines) + "\n"


def find_fr_dump_files(prefix: str | None) -> list[str]:
    """Files PyTorch itself dumped (TORCH_NCCL_DUMP_ON_TIMEOUT) under the configured prefix."""
    prefix = (
        prefix
        or os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
        or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    )
    return sorted(glob.glob(prefix + "*")) if prefix else []


def write_report(
    report: dict[str, Any], *, attempt_dir: Path, run_dir: Path, name: str = "hang_report"
) -> Path:
    """Write ``<name>.json``/``.txt`` into ``attempt_dir`` and a copy into ``run_dir``."""
    text = render_text(report)
    blob = json.dumps(report, indent=2, default=str)
    for d in (attempt_dir, run_dir):
        d.mkdir(parents=True, exist_ok=True)
        for fname, content in ((f"{name}.json", blob), (f"{name}.txt", text)):
            tmp = d / f".{fname}.{os.getpid()}.tmp"
            tmp.write_text(content)
            os.replace(tmp, d / fname)
    return attempt_dir / f"{name}.json"
