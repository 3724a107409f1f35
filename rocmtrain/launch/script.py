"""Render a Slurm batch script for a run (pure: text in, text out; nothing is submitted here).

    from rocmtrain.launch.script import JobSpec, render
    job = render(JobSpec(job_name="demo", nodes=2, ntasks_per_node=8, command=[...], ...))
    print(job.text)        # the exact script sbatch receives
    print(job.srun_line)   # the srun command inside it

Quoting. Two parsers read the script and each gets its own quoting:

* ``#SBATCH`` lines are parsed by sbatch, not by the shell. sbatch splits on blanks, honours ``'``
  and ``"`` and treats a backslash as "take the next character literally" even inside quotes, so
  :func:`sbatch_quote` writes ``"..."`` with ``\\`` and ``"`` escaped (``shlex.quote`` would lose
  backslashes). A newline cannot be quoted there (it would end the comment and start shell code):
  such a value is refused with an error.
* Everything the shell reads (exports, the srun line, the container runtime's options and image,
  the rank's command and overrides) goes through :func:`shlex.quote`. The only exceptions are
  ``cluster.setup`` lines (your shell code) and the two variables the script itself sets
  (``$RUN_DIR``, ``$SLURM_JOB_ID``).

Containers (:class:`ContainerSpec`). With Apptainer the per-rank wrapper runs on the host and
starts ``apptainer exec [--rocm|--nv] --bind ... --pwd <job folder> <image> <command>``, so the
requeue flag is written by the host. With pyxis the srun options ``--container-image``,
``--container-mounts`` and ``--container-workdir`` make the whole task (wrapper included) run in
the container: the run folder is mounted at its own path, so the flag lands on the host too.

File names. Slurm (and the file system) refuse a file name over 255 bytes, so the job name is
shortened for the log, script and run-folder names (:func:`file_slug`); ``--job-name`` keeps the
whole name.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rocmtrain import exit_codes

#: rendered in the rank command as ``<prefix>"$RUN_DIR"`` (the per-job run folder)
RUN_DIR = "$RUN_DIR"
#: longest job-name part of a file name: the longest suffix added to it is the .sbatch
#: script's ``-YYYYmmdd-HHMMSS-<pid>.sbatch`` (< 40 bytes), and NAME_MAX is 255 bytes
MAX_NAME_IN_FILE = 200
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def file_slug(name: str, *, max_len: int = MAX_NAME_IN_FILE) -> str:
    """File-system-safe, length-capped form of a job name (log, script and run-folder names).

    A name longer than ``max_len`` keeps its start and gets a hash of the whole name, so two
    long names that share a prefix still get different folders.
    """
    safe = _UNSAFE.sub("_", name).strip("._") or "job"
    if len(safe) <= max_len:
        return safe
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{safe[: max_len - len(digest) - 1].rstrip('._-')}-{digest}"


@dataclass(frozen=True)
class RunDirArg:
    """A command-line token ``<prefix><run dir of this job>``, e.g. ``run_dir=/x/runs/demo-123``."""

    prefix: str = "run_dir="


@dataclass(frozen=True)
class ContainerSpec:
    """How each rank enters the container (resolved from ``cluster.container``)."""

    runtime: str
    """``apptainer`` or ``pyxis``."""
    image: str
    """Image reference, passed verbatim (one argv token)."""
    mounts: Sequence[str] = ()
    """``src[:dst[:flags]]`` host paths, the job and run folders included."""
    workdir: str | None = None
    """Working directory inside the container (the job folder)."""
    gpu: str = "none"
    """``rocm`` (``apptainer exec --rocm``), ``nvidia`` (``--nv``) or ``none``."""

    def __post_init__(self) -> None:
        if self.runtime not in ("apptainer", "pyxis"):
            raise ValueError(f"container runtime {self.runtime!r}: use apptainer or pyxis")
        if self.gpu not in _APPTAINER_GPU_FLAGS:
            raise ValueError(f"container gpu {self.gpu!r}: use {', '.join(_APPTAINER_GPU_FLAGS)}")


_APPTAINER_GPU_FLAGS = {"rocm": ["--rocm"], "nvidia": ["--nv"], "none": []}


def apptainer_argv(c: ContainerSpec) -> list[str]:
    """``apptainer exec`` and its options up to the image; the rank's command follows."""
    argv = ["apptainer", "exec", *_APPTAINER_GPU_FLAGS[c.gpu]]
    for mount in c.mounts:
        argv += ["--bind", mount]  # one flag per mount: a ',' inside a path stays a path
    if c.workdir:
        argv += ["--pwd", c.workdir]
    return [*argv, c.image]


def _pyxis_mount(mount: str) -> str:
    # pyxis wants SRC:DST[:FLAGS]; a bare path is mounted at the same path
    return mount if ":" in mount else f"{mount}:{mount}"


def pyxis_srun_args(c: ContainerSpec) -> list[str]:
    """pyxis's srun options: image, mounts (one ','-joined list), working directory."""
    args = [f"--container-image={c.image}"]
    if c.mounts:
        args.append("--container-mounts=" + ",".join(_pyxis_mount(m) for m in c.mounts))
    if c.workdir:
        args.append(f"--container-workdir={c.workdir}")
    return args


@dataclass(frozen=True)
class JobSpec:
    """Everything a batch script needs, already resolved (see ``rocmtrain.launch.slurm``)."""

    job_name: str
    """``--job-name`` (verbatim; may contain any printable character)."""
    command: Sequence[str | RunDirArg]
    """What every rank runs (``python -m rocmtrain <overrides>``); each item is one argv token."""
    run_dir_prefix: str
    """Absolute run-folder path without the job id: the folder is ``<prefix>-<SLURM_JOB_ID>``,
    the same after a requeue (requeued jobs keep their id). A prefix ending in ``/`` or equal to
    an explicit ``run_dir=`` is used as is (see ``run_dir_fixed``)."""
    output: str
    """``--output`` path pattern."""
    nodes: int = 1
    ntasks_per_node: int = 1
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    mem: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    requeue: bool = True
    signal: str | None = None
    error: str | None = None
    chdir: str | None = None
    sbatch_args: Sequence[str] = ()
    srun_args: Sequence[str] = ()
    setup: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    kill_on_bad_exit: bool = True
    max_restarts: int = 3
    run_dir_fixed: bool = False
    """True when the user gave ``run_dir=`` explicitly: use ``run_dir_prefix`` without a job id."""
    header: Sequence[str] = ()
    """Comment lines at the top (how the script was made)."""
    container: ContainerSpec | None = None
    """Run each rank in this container (None: on the host)."""


@dataclass(frozen=True)
class JobScript:
    """A rendered batch script."""

    text: str
    """The whole script (what sbatch gets)."""
    srun_line: str
    """The srun command line in it (shell syntax, as written in the script)."""
    directives: list[tuple[str, str | None]]
    """``(option, value)`` pairs of the ``#SBATCH`` lines (value None for flags)."""


def sbatch_quote(value: str, *, option: str = "") -> str:
    """Quote ``value`` for an ``#SBATCH`` line (sbatch's own parser, see the module docstring)."""
    bad = [c for c in value if c in "\n\r\0"]
    if bad:
        raise ValueError(
            f"{option or 'sbatch option'}={value!r}: a newline/NUL cannot appear in a #SBATCH "
            "line (it would end the comment and run the rest as shell code); remove it"
        )
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _directives(spec: JobSpec) -> list[tuple[str, str | None]]:
    d: list[tuple[str, str | None]] = [("--job-name", spec.job_name)]
    for opt, value in (
        ("--partition", spec.partition),
        ("--account", spec.account),
        ("--qos", spec.qos),
        ("--time", spec.time),
    ):
        if value is not None:
            d.append((opt, str(value)))
    d += [("--nodes", str(spec.nodes)), ("--ntasks-per-node", str(spec.ntasks_per_node))]
    if spec.gpus_per_node:
        d.append(("--gpus-per-node", str(spec.gpus_per_node)))
    for opt, value in (
        ("--cpus-per-task", spec.cpus_per_task),
        ("--mem", spec.mem),
        ("--constraint", spec.constraint),
    ):
        if value is not None:
            d.append((opt, str(value)))
    if spec.exclusive:
        d.append(("--exclusive", None))
    d.append(("--requeue", None) if spec.requeue else ("--no-requeue", None))
    if spec.signal:
        d.append(("--signal", spec.signal))
    d.append(("--output", spec.output))
    if spec.error:
        d.append(("--error", spec.error))
    # a requeued job appends to its log instead of truncating what the first run wrote
    d.append(("--open-mode", "append"))
    if spec.chdir:
        d.append(("--chdir", spec.chdir))
    return d


_PLAIN = re.compile(r"^[A-Za-z0-9_.,:@%/+=-]+$")


def _directive_line(opt: str, value: str | None) -> str:
    if value is None:
        return f"#SBATCH {opt}"
    shown = value if _PLAIN.match(value) else sbatch_quote(value, option=opt)
    return f"#SBATCH {opt}={shown}"


def _extra_directive(arg: str) -> str:
    if not arg.startswith("-"):
        raise ValueError(f"cluster.sbatch_args item {arg!r}: give an option like --reservation=x")
    opt, eq, value = arg.partition("=")
    if any(c.isspace() for c in opt) or not opt.strip("-"):
        raise ValueError(f"cluster.sbatch_args item {arg!r}: not an sbatch option")
    return _directive_line(opt, value if eq else None)


def _token(tok: str | RunDirArg) -> str:
    if isinstance(tok, RunDirArg):
        return shlex.quote(tok.prefix) + '"$RUN_DIR"' if tok.prefix else '"$RUN_DIR"'
    return shlex.quote(str(tok))


#: per-rank wrapper: run the rank, and when it exits 75 leave a flag, so the batch script requeues
#: even when srun reports another code (e.g. 137 for ranks that --kill-on-bad-exit killed).
_RANK_WRAPPER = (
    "bash -c "
    + shlex.quote(
        'flag=$1; shift; trap : USR1 TERM; "$@"; rc=$?; '
        f'[ "$rc" = {exit_codes.REQUEUE} ] && : > "$flag"; exit "$rc"'
    )
    + ' rocmtrain-rank "$REQUEUE_FLAG"'
)


def srun_line(spec: JobSpec) -> str:
    """The srun command of the script (one rank per task; see :data:`_RANK_WRAPPER`)."""
    parts = ["srun", f"--kill-on-bad-exit={int(spec.kill_on_bad_exit)}"]
    if spec.cpus_per_task is not None:
        # since Slurm 22.05 srun does not inherit sbatch's --cpus-per-task
        parts.append(f"--cpus-per-task={int(spec.cpus_per_task)}")
    parts += [shlex.quote(a) for a in spec.srun_args]
    c = spec.container
    if c is not None and c.runtime == "pyxis":
        parts += [shlex.quote(a) for a in pyxis_srun_args(c)]
    parts.append(_RANK_WRAPPER)
    if c is not None and c.runtime == "apptainer":
        parts += [shlex.quote(a) for a in apptainer_argv(c)]
    parts += [_token(t) for t in spec.command]
    return " ".join(parts)


def _run_dir_assignment(spec: JobSpec) -> str:
    if spec.run_dir_fixed:
        return f"RUN_DIR={shlex.quote(spec.run_dir_prefix)}"
    return f'RUN_DIR={shlex.quote(spec.run_dir_prefix + "-")}"$SLURM_JOB_ID"'


def _requeue_block(spec: JobSpec) -> list[str]:
    rq = exit_codes.REQUEUE
    if not spec.requeue:
        return [
            f'if [ "$rc" = {rq} ] || [ -e "$REQUEUE_FLAG" ]; then',
            f'  echo "rocmtrain: a rank asked for a requeue (exit {rq}) but cluster.requeue=false:'
            ' resubmit to resume from $RUN_DIR"',
            f"  exit {rq}",
            "fi",
        ]
    return [
        f'if [ "$rc" = {rq} ] || [ -e "$REQUEUE_FLAG" ]; then',
        '  if [ "$ending" = 1 ]; then',
        '    echo "rocmtrain: ranks checkpointed, but the job was cancelled, timed out or preempted'
        " (SIGTERM): not requeued here (Slurm requeues preempted jobs itself); resubmit with"
        ' run_dir=$RUN_DIR to resume"',
        f"    exit {rq}",
        "  fi",
        '  restarts="${SLURM_RESTART_COUNT:-0}"',
        f'  if [ "$restarts" -ge {int(spec.max_restarts)} ]; then',
        f'    echo "rocmtrain: a rank asked for a requeue (exit {rq}) but the job already restarted'
        f' $restarts times (cluster.max_restarts={int(spec.max_restarts)}): giving up"',
        f"    exit {rq}",
        "  fi",
        f'  echo "rocmtrain: a rank asked for a requeue (exit {rq}): scontrol requeue'
        ' $SLURM_JOB_ID (restart $((restarts + 1))); it resumes from $RUN_DIR"',
        '  scontrol requeue "$SLURM_JOB_ID" || echo "rocmtrain: scontrol requeue failed'
        ' (job cancelled, or not requeueable): not requeued"',
        f"  exit {rq}",
        "fi",
    ]


def render(spec: JobSpec) -> JobScript:
    """Render the batch script for ``spec`` (raises ValueError for an unquotable value)."""
    directives = _directives(spec)
    lines = ["#!/bin/bash"]
    # a comment ends at a newline: escape control characters so a header stays one comment line
    lines += ["# " + h.encode("unicode_escape").decode("ascii") for h in spec.header]
    lines += [_directive_line(o, v) for o, v in directives]
    lines += [_extra_directive(a) for a in spec.sbatch_args]
    lines += ["set -uo pipefail", ""]
    if spec.setup:
        lines.append("# --- setup (cluster.setup, verbatim)")
        lines += list(spec.setup)
        lines.append("")
    if spec.env:
        lines.append("# --- environment (rccl config plan + cluster.env)")
        lines += [f"export {name}={shlex.quote(str(v))}" for name, v in spec.env.items()]
        lines.append("")
    srun = srun_line(spec)
    lines += [
        "# --- run folder: stable across a requeue (the job keeps its id), so the job resumes",
        _run_dir_assignment(spec),
        'REQUEUE_FLAG="$RUN_DIR/.requeue"',
        'mkdir -p "$RUN_DIR" && rm -f "$REQUEUE_FLAG"',
        'echo "rocmtrain: job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on'
        ' $SLURM_JOB_NODELIST, run_dir $RUN_DIR"',
        "",
        "# --- before the time limit Slurm signals this shell (--signal=B:...): forward it to the",
        f"# ranks, which checkpoint and exit {exit_codes.REQUEUE}. SIGTERM (scancel, time limit,"
        " preemption) reaches the ranks directly and means: do not requeue from here.",
        "signalled=0 ending=0",
        'forward() { signalled=1; echo "rocmtrain: batch shell got SIG$1, forwarding it to the'
        ' ranks"; [ -n "${srun_pid:-}" ] && kill -s "$1" "$srun_pid" 2>/dev/null; }',
        "trap 'forward USR1' USR1",
        "trap 'forward USR2' USR2",
        "trap 'signalled=1; ending=1; echo \"rocmtrain: batch shell got SIGTERM: Slurm is ending"
        " the job\"' TERM",
        "",
        "# --- one rank per task; rank/world size/master address come from Slurm's variables",
        "#     (Lightning's SLURMEnvironment)",
        srun + " &",
        "srun_pid=$!",
        'while :; do signalled=0; wait "$srun_pid"; rc=$?; [ "$signalled" = 1 ] || break; done',
        'echo "rocmtrain: ranks finished with exit code $rc"',
        "",
        *_requeue_block(spec),
        'exit "$rc"',
        "",
    ]
    return JobScript(text="\n".join(lines), srun_line=srun, directives=directives)
