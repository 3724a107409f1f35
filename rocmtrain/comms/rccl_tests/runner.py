"""Find and run rccl-tests / nccl-tests binaries safely, then judge the run per size.

    from rocmtrain.comms.rccl_tests.runner import RunSpec, find_binary, build_command, run_test
    binary = find_binary("all_reduce")                     # config dir, $RCCL_TESTS_DIR, then PATH
    cmd = build_command(binary, RunSpec(min_bytes=8, max_bytes=256 << 20, gpus_per_proc=8))
    outcome = run_test(cmd, timeout_s=600, env={"NCCL_PROTO": "Simple", **os.environ})
    outcome.ok, outcome.errors, outcome.parsed.rows

Commands are argument lists (never a shell string). The binary gets its own timeout flag (``-T``) and
the whole process group gets an outer timeout: the child starts in a new session and, on expiry, the
group is sent SIGTERM, then SIGKILL — so ``srun``/``mpirun`` and every rank they started die too.
Multi-process runs go through ``srun --label`` or ``mpirun --tag-output`` (the binary must be built with
``MPI=1`` for several processes); the parser strips both prefixes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rocmtrain.comms.rccl_tests.parser import ParseResult, assess, parse_csv, parse_json, parse_text

Launcher = Literal["local", "srun", "mpirun"]
#: collectives the wrapper knows (binary = ``<name>_perf``)
SUPPORTED = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "sendrecv")
BUILD_HINT = (
    "build rccl-tests (ROCm: https://github.com/ROCm/rccl-tests, `make MPI=1`) or NVIDIA nccl-tests "
    "(scripts/rccl/build_nccl_tests.sh), then pass --tests-dir DIR or set RCCL_TESTS_DIR"
)


def parse_size(text: str | int) -> int:
    """``"256M"`` → 268435456, ``"64K"``, ``"1G"``, ``"8"`` (binary units, like rccl-tests)."""
    if isinstance(text, int):
        return text
    s = str(text).strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    digits = s[:-1] if s[-1:] in "KMG" else s
    try:
        value = int(float(digits) * mult)
    except ValueError:
        raise ValueError(f"size {text!r}: expected bytes like 8, 64K, 256M, 1G") from None
    if value <= 0:
        raise ValueError(f"size {text!r}: must be positive")
    return value


def find_binary(
    collective: str,
    *,
    search_dirs: Sequence[str | os.PathLike[str]] = (),
    environ: Mapping[str, str] | None = None,
) -> Path:
    """Locate ``<collective>_perf`` (or ``_perf_mpi``): ``search_dirs``, ``$RCCL_TESTS_DIR``, ``PATH``.

    Each directory is tried as given and with ``build/`` appended. Raises FileNotFoundError saying
    where it looked and how to build the tests.
    """
    if collective not in SUPPORTED:
        raise ValueError(f"collective {collective!r}: choose one of {', '.join(SUPPORTED)}")
    env = os.environ if environ is None else environ
    dirs = [Path(d) for d in search_dirs]
    if env.get("RCCL_TESTS_DIR"):
        dirs.append(Path(env["RCCL_TESTS_DIR"]))
    names = (f"{collective}_perf", f"{collective}_perf_mpi")
    tried: list[str] = []
    for d in dirs:
        for base in (d, d / "build"):
            for name in names:
                cand = base / name
                tried.append(str(cand))
                if cand.is_file() and os.access(cand, os.X_OK):
                    return cand.resolve()
    for name in names:
        hit = shutil.which(name, path=env.get("PATH", os.defpath))
        if hit:
            return Path(hit)
    where = ", ".join(tried) if tried else "no directory given"
    raise FileNotFoundError(
        f"{names[0]} not found (looked in: {where}; and PATH). To fix: {BUILD_HINT}"
    )


@dataclass
class RunSpec:
    """Arguments of one rccl-tests invocation (the binary's own flags)."""

    min_bytes: int = 8
    max_bytes: int = 128 << 20
    step_factor: int = 2
    iters: int = 20
    warmup_iters: int = 5
    gpus_per_proc: int = 1
    """``-g``: GPUs driven by each process (single-process multi-GPU runs)."""
    check: int = 1
    """``-c``: validate results (0 prints ``N/A`` in ``#wrong``)."""
    op: str | None = None
    datatype: str | None = None
    binary_timeout_s: int = 0
    """``-T``: the binary's own per-collective timeout (0 = do not pass it; old builds lack it)."""
    output_file: str | None = None
    """Also write a machine-readable file: nccl-tests ``-J FILE.json`` or rccl-tests
    ``-x FILE -Z csv`` (see :func:`output_support`)."""
    output_format: Literal["json", "csv"] | None = None
    extra_args: list[str] = field(default_factory=list)


def build_command(
    binary: str | os.PathLike[str],
    spec: RunSpec,
    *,
    launcher: Launcher = "local",
    nprocs: int = 1,
    launcher_args: Sequence[str] = (),
) -> list[str]:
    """The argument list for one run (no shell): ``[srun ...] binary -b .. -e .. -f .. -g ..``."""
    if spec.min_bytes > spec.max_bytes:
        raise ValueError(f"min_bytes={spec.min_bytes} > max_bytes={spec.max_bytes}")
    args = [
        str(binary),
        "-b", str(spec.min_bytes),
        "-e", str(spec.max_bytes),
        "-f", str(spec.step_factor),
        "-g", str(spec.gpus_per_proc),
        "-n", str(spec.iters),
        "-w", str(spec.warmup_iters),
        "-c", str(spec.check),
    ]  # fmt: skip
    if spec.op:
        args += ["-o", spec.op]
    if spec.datatype:
        args += ["-d", spec.datatype]
    if spec.binary_timeout_s > 0:
        args += ["-T", str(spec.binary_timeout_s)]
    if spec.output_file:
        if spec.output_format == "json":
            args += ["-J", spec.output_file]
        elif spec.output_format == "csv":
            args += ["-x", spec.output_file, "-Z", "csv"]
        else:
            raise ValueError(
                "output_file needs output_format 'json' (nccl-tests) or 'csv' (rccl-tests)"
            )
    args += list(spec.extra_args)
    if launcher == "local":
        if nprocs != 1:
            raise ValueError("launcher='local' runs one process; use srun or mpirun for nprocs > 1")
        return args
    if launcher == "srun":
        return ["srun", f"--ntasks={nprocs}", "--label", *launcher_args, *args]
    if launcher == "mpirun":
        return ["mpirun", "-np", str(nprocs), "--tag-output", *launcher_args, *args]
    raise ValueError(f"launcher={launcher!r}: choose local, srun or mpirun")


def output_support(binary: str | os.PathLike[str], *, timeout_s: float = 30.0) -> str | None:
    """Which machine-readable output ``binary -h`` advertises: ``"csv"`` (rccl-tests ``-Z``; its
    ``json`` writes unquoted strings, so csv is used), ``"json"`` (nccl-tests ``-J``) or None."""
    try:
        proc = subprocess.run([str(binary), "-h"], capture_output=True, text=True,
                              errors="replace", timeout=timeout_s)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = proc.stdout + proc.stderr
    if "--output_format" in text and "csv" in text:
        return "csv"
    if "--output_file" in text and "json" in text:
        return "json"
    return None


def read_output_file(path: str | os.PathLike[str], fmt: str) -> ParseResult:
    """Parse a ``-J``/``-Z csv`` file written by a run (errors end up in ``parse_errors``)."""
    try:
        text = Path(path).read_text(errors="replace")
        return parse_json(text) if fmt == "json" else parse_csv(text)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return ParseResult(parse_errors=[f"cannot read {fmt} output {path}: {exc}"])


@dataclass
class Outcome:
    """What one run produced and how it was judged."""

    command: list[str]
    returncode: int | None
    output: str
    timed_out: bool
    duration_s: float
    parsed: ParseResult
    errors: list[str]
    warnings: list[str]

    @property
    def ok(self) -> bool:
        return not self.errors


def _kill_group(proc: subprocess.Popen[str], grace_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_test(
    command: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    log_path: str | os.PathLike[str] | None = None,
    min_busbw_gbps: float | None = None,
    floor_min_bytes: int = 0,
    grace_s: float = 5.0,
) -> Outcome:
    """Run one command in its own process group with an outer timeout; parse and judge its output."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="replace", env=None if env is None else dict(env), start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        empty = ParseResult()
        msg = f"cannot start {command[0]!r}: {exc.strerror or exc}"
        return Outcome(list(command), None, "", False, 0.0, empty, [msg], [])
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc, grace_s)
        try:  # a process that left the group (setsid) may still hold the pipe: do not wait forever
            out, _ = proc.communicate(timeout=2 * grace_s)
        except subprocess.TimeoutExpired as exc:
            out = (
                exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
            )
    except BaseException:  # Ctrl-C: never leave ranks behind
        _kill_group(proc, grace_s)
        raise
    duration = time.monotonic() - start
    out = out or ""
    if log_path is not None:
        Path(log_path).write_text(out)
    parsed = parse_text(out)
    errors, warnings = assess(
        parsed, min_busbw_gbps=min_busbw_gbps, floor_min_bytes=floor_min_bytes
    )
    lead: list[str] = []
    if timed_out:
        lead.append(
            f"hung: no exit after {timeout_s:g} s; the whole process group was killed "
            f"(last size printed: {parsed.rows[-1].size_bytes if parsed.rows else 'none'})"
        )
    elif proc.returncode != 0:
        lead.append(f"{Path(command[0]).name} exited with code {proc.returncode}")
    return Outcome(list(command), proc.returncode, out, timed_out, duration, parsed,
                   lead + errors, warnings)  # fmt: skip
