"""Turn cryptic RCCL/NCCL/gloo/HIP error text into an actionable hint (pure functions of text).

::

    >>> h = hint_for("[Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4486, "
    ...              "OpType=ALLTOALL, NumelIn=8, NumelOut=8, Timeout(ms)=600000) ran for 600013 "
    ...              "milliseconds before timing out.")
    >>> h.kind, h.details["op"], h.details["rank"]
    ('collective_timeout', 'ALLTOALL', '7')

``hint_for_exception(exc)`` looks at the exception, its chained causes and its type name.
:class:`ErrorHintCallback` logs the hint when training raises and writes it
to ``<run_dir>/error_hint.txt``. ``Hint.requeue`` says whether restarting can help (a dead peer,
a timeout) or not (wrong GPU architecture, out of memory): the watchdog uses it to pick the exit code.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytorch_lightning as pl

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hint:
    kind: str
    """collective_timeout | gloo_timeout | peer_gone | comm_init | store_timeout | arch_mismatch |
    out_of_memory"""
    title: str
    advice: tuple[str, ...]
    requeue: bool
    """True when a restart from the last checkpoint may succeed."""
    details: dict[str, str] = field(default_factory=dict)
    comm: bool = False
    """True for a communication failure (a collective, a peer, the communicator): the watchdog
    then looks for the culprit among the peers instead of blaming this rank. Set by the rule."""

    def render(self) -> str:
        facts = ", ".join(f"{k}={v}" for k, v in self.details.items())
        head = f"[rocmtrain hint: {self.kind}] {self.title}" + (f" ({facts})" if facts else "")
        return "\n".join([head] + [f"  - {a}" for a in self.advice])


_TIMEOUT_ADVICE = (
    "Another rank never joined this collective: a straggler, a crashed rank or ranks issuing "
    "different collectives. Open the hang report (<run_dir>/hang_report.txt) — the rocmtrain "
    "watchdog names the rank that is behind and where.",
    "Flight recorder: keep rccl.flight_recorder_entries > 0 and rccl.dump_on_timeout=true, then "
    "`torchfrtrace <dump dir> --prefix rank_` lists the mismatched/missing collective per rank.",
    "TORCH_NCCL_DESYNC_DEBUG=1 (rccl.desync_debug=true) names the culprit rank of a desync.",
    "If the step is legitimately slow (first step, checkpoint), raise rccl.train_timeout_seconds "
    "(steady state) or rccl.init_timeout_seconds (init and first step).",
)


def _collective_timeout(m: re.Match[str], text: str) -> Hint:
    rank = re.search(r"\[Rank (\d+)\]", text)
    d = {"seq": m["seq"], "op": m["op"], "timeout_ms": m["timeout"], "ran_ms": m["ran"]}
    if rank:
        d = {"rank": rank[1], **d}
    return Hint(
        "collective_timeout",
        f"collective {m['op']} #{m['seq']} timed out after {int(m['ran']) / 1000:.0f} s",
        _TIMEOUT_ADVICE,
        True,
        d,
    )


def _gloo_timeout(m: re.Match[str], text: str) -> Hint:
    return Hint(
        "gloo_timeout",
        f"gloo {m['op']} timed out after {int(m['ms']) / 1000:.0f} s",
        _TIMEOUT_ADVICE,
        True,
        {"timeout_ms": m["ms"], "op": m["op"]},
    )


def _peer_gone(m: re.Match[str], text: str) -> Hint:
    return Hint(
        "peer_gone",
        "a peer process closed its connection: another rank crashed or was killed",
        (
            "The root cause is in the other rank's log (Slurm: its task output file); look for a "
            "Python traceback, 'Killed' (host OOM killer: `dmesg | grep -i kill`) or a GPU fault.",
            "The rocmtrain watchdog report (<run_dir>/hang_report.txt) names the rank that exited.",
            "This rank exits with the requeue code; the job resumes from the last checkpoint.",
        ),
        True,
        {"evidence": m[0][:80]},
    )


def _comm_init(m: re.Match[str], text: str) -> Hint:
    last = re.search(r"Last error:\s*\n?\s*(.+)", text)
    version = re.search(r"NCCL version ([\d.]+)", text)
    d = {"error": m[0][:80]}
    if version:
        d["nccl_version"] = version[1]
    if last and last[1].strip():
        d["last_error"] = last[1].strip()[:160]
    return Hint(
        "comm_init",
        "the NCCL/RCCL communicator failed (creation or transport)",
        (
            "Rerun with rccl.debug=INFO rccl.debug_subsys=INIT,NET (NCCL_DEBUG/NCCL_DEBUG_SUBSYS): the "
            "'NCCL WARN' lines name the failing call, interface and peer.",
            "Multi-node: pin the interface with rccl.socket_ifname (NCCL_SOCKET_IFNAME); on RoCE, "
            "RCCL >= 2.21.5 (ROCm 6.3) picks the RoCE v2 GID itself (NCCL_IB_GID_INDEX unset), so "
            "set rccl.ib_gid_index only when the INFO log shows a wrong GID, or with an older RCCL "
            "(default GID 0); make sure the ports between nodes are open.",
            "All nodes need the same RCCL/ROCm version and the same visible GPU count; "
            "`python -m rocmtrain doctor` checks the node, `python -m rocmtrain rccl-tests` the fabric.",
        ),
        True,
        d,
    )


def _store_timeout(m: re.Match[str], text: str) -> Hint:
    return Hint(
        "store_timeout",
        f"only {m['joined']}/{m['world']} ranks reached the rendezvous within {m['s']} s",
        (
            "Some ranks never started or cannot reach MASTER_ADDR:MASTER_PORT: check that every "
            "Slurm task launched, that MASTER_ADDR resolves on all nodes and the port is free "
            "(`python -m rocmtrain scan`).",
        ),
        True,
        {"joined": m["joined"], "world": m["world"], "timeout_s": m["s"]},
    )


def _arch_mismatch(m: re.Match[str], text: str) -> Hint:
    return Hint(
        "arch_mismatch",
        "the GPU code for this device's architecture is missing (wrong wheel / build for this gfx)",
        (
            "Find the GPU architecture: `rocminfo | grep gfx` (or `python -m rocmtrain doctor`); MI250X "
            "is gfx90a, MI300X/MI325X gfx942, MI355X gfx950.",
            "Install a PyTorch ROCm wheel (and fbgemm-gpu/torchrec) built for that gfx; for "
            "extensions built from source export PYTORCH_ROCM_ARCH=<gfx> at *build* time (it does "
            "nothing at run time).",
            "An integrated GPU visible next to the Instinct GPUs (RCCL 'invalid kernel file' at init) "
            "has no code objects: hide it with ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES.",
            "Do not set HSA_OVERRIDE_GFX_VERSION on MI200/MI300. To localise the failing kernel: "
            "AMD_SERIALIZE_KERNEL=3.",
        ),
        False,
        {"error": m[0]},
    )


_SIZE = r"[\d.]+ [KMGT]?i?B"


def _oom(m: re.Match[str], text: str) -> Hint:
    api = re.search(r"(HIP|CUDA) out of memory", text)
    d = {"device": api[1] if api else "GPU"}
    for key, pat in (
        ("tried", rf"Tried to allocate ({_SIZE})"),
        ("gpu", r"GPU (\d+) has a total capacity"),
        ("capacity", rf"total capacity of ({_SIZE})"),
        ("free", rf"of which ({_SIZE}) is free"),
        ("allocated_by_pytorch", rf"({_SIZE}) is allocated by PyTorch"),
    ):
        found = re.search(pat, text)
        if found:
            d[key] = found[1]
    return Hint(
        "out_of_memory",
        "the GPU ran out of memory",
        (
            "Lower data.batch_size (per rank) or shard the embedding tables over more GPUs "
            "(strategy=row_wise / table_wise; the planner's storage estimate is per GPU).",
            "Fragmentation (much reserved-but-unallocated memory): PYTORCH_HIP_ALLOC_CONF="
            "expandable_segments:True helps only with PyTorch >= 2.12 built with ROCm >= 7.0 "
            "(pytorch PRs #177974, #179781; a no-op before).",
            "Other processes on the GPU: `amd-smi process` / `rocm-smi --showpids`.",
            "A requeue will not fix this: change the configuration first.",
        ),
        False,
        d,
    )


#: (pattern, hint maker, whether it is a communication failure), in priority order
_RULES: tuple[tuple[re.Pattern[str], Callable[[re.Match[str], str], Hint], bool], ...] = (
    (
        re.compile(
            r"Watchdog caught collective operation timeout:\s*Work\w*\(SeqNum=(?P<seq>\d+), "
            r"OpType=(?P<op>\w+).*?Timeout\(ms\)=(?P<timeout>\d+)\) ran for (?P<ran>\d+) milliseconds",
            re.S,
        ),
        _collective_timeout,
        True,
    ),
    (
        re.compile(r"Timed out waiting (?P<ms>\d+)ms for (?P<op>\w+) operation to complete"),
        _gloo_timeout,
        True,
    ),
    (
        re.compile(
            r"Timed out after (?P<s>\d+) seconds waiting for clients\. (?P<joined>\d+)/(?P<world>\d+) clients joined"
        ),
        _store_timeout,
        False,
    ),
    (
        re.compile(
            r"invalid device function|hipErrorInvalidDeviceFunction|invalid kernel file|"
            r"hipErrorNoBinaryForGpu|no kernel image is available for execution on the device"
        ),
        _arch_mismatch,
        False,
    ),
    (
        re.compile(
            r"(HIP|CUDA) out of memory|OutOfMemoryError|hipErrorOutOfMemory|HIP_ERROR_OutOfMemory"
        ),
        _oom,
        False,
    ),
    (
        re.compile(
            r"ncclCommInitRank\w* failed|ncclSystemError|ncclInternalError|ncclRemoteError|"
            r"NCCL error[^\n]*?(unhandled system error|internal error|remote process exited)"
        ),
        _comm_init,
        True,
    ),
    (
        re.compile(
            r"Connection closed by peer|Connection reset by peer|Failed to recv, got 0 bytes|"
            r"Broken pipe"
        ),
        _peer_gone,
        True,
    ),
)


def hint_for(text: str) -> Hint | None:
    """The hint for the first known error pattern in ``text`` (rules in priority order), or None."""
    for pattern, make, comm in _RULES:
        m = pattern.search(text)
        if m:
            return replace(make(m, text), comm=comm)
    return None


def hint_for_exception(exc: BaseException) -> Hint | None:
    """:func:`hint_for` over the exception chain (type name + message of each link)."""
    parts, seen, cur = [], set(), exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        parts.append(f"{type(cur).__name__}: {cur}")
        cur = cur.__cause__ or cur.__context__
    return hint_for("\n".join(parts))


def write_traceback(exc: BaseException, run_dir: Path, rank: int) -> Path | None:
    """``<run_dir>/logs/error_rank<rank>.txt``: the full traceback (hint notes included)."""
    import traceback

    path = Path(run_dir) / "logs" / f"error_rank{rank}.txt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(traceback.format_exception(exc)))
    except OSError as e:
        log.warning("could not write the traceback to %s: %s", path, e)
        return None
    return path


def explain(exc: BaseException, *, run_dir: Path | None = None, rank: int = 0) -> Hint | None:
    """Hint for ``exc``: logged, added as an exception note, written to the run dir. None if unknown."""
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return None
    hint = hint_for_exception(exc)
    if hint is None:
        return None
    text = hint.render()
    log.error("%s", text)
    if hasattr(exc, "add_note"):
        exc.add_note(text)
    else:
        print(text, file=sys.stderr)
    if run_dir is not None:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / f"error_hint_rank{rank}.txt").write_text(text + "\n")
        except OSError as e:
            log.warning("could not write the error hint to %s: %s", run_dir, e)
    return hint


class ErrorHintCallback(pl.Callback):
    """``on_exception`` → :func:`explain`, then the traceback into ``<run_dir>/logs`` (before the
    watchdog tells the peers, so the path they print exists)."""

    def __init__(self, run_dir: Path) -> None:
        self._run_dir = Path(run_dir)
        self.hint: Hint | None = None

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.hint = explain(exception, run_dir=self._run_dir, rank=trainer.global_rank)
        if not isinstance(exception, (SystemExit, KeyboardInterrupt)):
            write_traceback(exception, self._run_dir, trainer.global_rank)
