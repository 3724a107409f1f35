"""Submit a run to Slurm: build the job from the config, render it, ``sbatch`` it, explain errors.

    python -m rocmtrain recipe=dlrm_mi300 cluster=slurm cluster.nodes=4 dry_run=true   # print only
    python -m rocmtrain recipe=dlrm_mi300 cluster=slurm cluster.nodes=4 cluster.partition=mi300x

From Python::

    from rocmtrain.launch import slurm
    spec = slurm.build_spec(cfg, overrides)        # RunConfig + the command-line overrides
    job = slurm.submit(spec)                       # -> SubmittedJob(job_id, script, log, run_dir)
    slurm.wait(job.job_id, timeout_s=600)          # -> JobStatus(state, exit_code, restarts)

Errors from sbatch (unknown partition, a request no node can satisfy, bad GRES, ...) become a
:class:`SubmitError` naming the ``cluster.*`` field, what Slurm has (``sinfo``) and the fix.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocmtrain import __version__, exit_codes
from rocmtrain.launch.script import ContainerSpec, JobSpec, RunDirArg, file_slug, render

#: trainer keys the job sets from the allocation (Lightning checks them against SLURM_* vars)
_SHAPE_KEYS = ("trainer.num_nodes", "trainer.devices")
#: characters a container mount list cannot carry in a path (apptainer/pyxis split on them)
_MOUNT_SEPARATORS = {"apptainer": ":", "pyxis": ":,"}


class SubmitError(RuntimeError):
    """sbatch refused the job (or is missing); the message says which field to change."""

    def __init__(self, message: str, *, code: int = exit_codes.USAGE) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class SubmittedJob:
    job_id: str
    script_path: Path
    log_path: str
    run_dir: str


@dataclass(frozen=True)
class JobStatus:
    state: str
    """Slurm's JobState (PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...)."""
    exit_code: int | None
    """Exit code of the batch script (None while running)."""
    restarts: int
    """``SLURM_RESTART_COUNT`` of the job (requeues so far)."""
    reason: str


# -- building the job --------------------------------------------------------------------------
def slug(name: str) -> str:
    """File-system-safe, length-capped form of a job name (run folder, log and script names)."""
    return file_slug(name)


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def job_shape(cfg: Any) -> tuple[int, int, int | None]:
    """``(nodes, ntasks_per_node, gpus_per_node)`` of the job for a RunConfig."""
    c = cfg.cluster
    nodes = c.nodes if c.nodes is not None else cfg.trainer.num_nodes
    ntasks = c.ntasks_per_node if c.ntasks_per_node is not None else cfg.trainer.devices
    gpus = c.gpus_per_node
    if gpus is None and cfg.trainer.accelerator == "gpu":
        gpus = ntasks
    return int(nodes), int(ntasks), gpus


def planned_env(cfg: Any) -> dict[str, str]:
    """Variables exported by the script: the RCCL plan, OMP_NUM_THREADS, then ``cluster.env``."""
    env: dict[str, str] = {}
    if cfg.cluster.export_rccl:
        try:
            from rocmtrain.comms.rccl import plan_rccl_env
        except ImportError:  # the RCCL area is optional for launching
            plan_rccl_env = None
        if plan_rccl_env is not None:
            # run_dir is per job: leave the flight-recorder path to each rank (it knows run_dir)
            env.update(plan_rccl_env(cfg.rccl))
    if cfg.cluster.cpus_per_task is not None:
        env["OMP_NUM_THREADS"] = str(cfg.cluster.cpus_per_task)
    env.update({str(k): str(v) for k, v in cfg.cluster.env.items()})
    try:
        from rocmtrain.comms.env import validate_names
    except ImportError:
        validate_names = None
    if validate_names is not None:
        validate_names(tuple(env), source="cluster.env / rccl config")
    return env


def _auto_mount(path: str, runtime: str) -> str:
    bad = [c for c in _MOUNT_SEPARATORS[runtime] if c in path]
    if bad:
        raise ValueError(
            f"cluster.chdir / run folder {path!r} contains {''.join(bad)!r}, which a {runtime} "
            "mount list cannot carry: submit from (or set cluster.chdir / run_dir to) a path "
            "without it"
        )
    return path


def container_spec(cfg: Any, *, base: Path, run_path: str) -> ContainerSpec | None:
    """The container each rank runs in: the job folder and the run folder are mounted at their
    own paths (logs, checkpoints and the requeue flag stay where the batch script looks)."""
    c = cfg.cluster.container
    if c.runtime == "none":
        return None
    mounts = [_auto_mount(str(base), c.runtime)]
    if not Path(run_path).is_relative_to(base):
        mounts.append(_auto_mount(run_path, c.runtime))
    mounts += [str(m) for m in c.mounts if str(m) not in mounts]
    return ContainerSpec(
        runtime=c.runtime,
        image=str(c.image),
        mounts=mounts,
        workdir=str(base),
        gpu=c.resolved_gpu(accelerator=cfg.trainer.accelerator, recipe=cfg.recipe),
    )


def build_spec(
    cfg: Any,
    overrides: list[str],
    *,
    workdir: str | os.PathLike[str] | None = None,
    program: list[str] | None = None,
) -> JobSpec:
    """The job for RunConfig ``cfg`` launched with Hydra ``overrides`` (the command line).

    Every rank runs ``<python> -m rocmtrain <overrides> trainer.num_nodes=N trainer.devices=T
    run_dir=<run_root>/<job>-<SLURM_JOB_ID>`` (``program`` replaces ``python -m rocmtrain``).
    """
    c = cfg.cluster  # validated when it was built
    nodes, ntasks, gpus = job_shape(cfg)
    base = Path(c.chdir or workdir or os.getcwd()).resolve()
    name = c.job_name or f"rocmtrain-{cfg.recipe}"
    run_root = (base / c.run_root).resolve()
    explicit = [o for o in overrides if _key(o) == "run_dir"]
    if explicit:
        # the user's run_dir (stable by construction); Hydra resolves it the same way in the job
        run_dir_prefix, fixed = str(getattr(cfg, "run_dir", explicit[-1].split("=", 1)[1])), True
        run_dir_prefix = str((base / run_dir_prefix).resolve())
    else:
        run_dir_prefix, fixed = str(run_root / slug(name)), False
    output = c.output or str(run_root / f"{slug(name)}-%j.out")
    kept = [o for o in overrides if _key(o) not in (*_SHAPE_KEYS, "run_dir", "dry_run")]
    shape = [f"trainer.num_nodes={nodes}", f"trainer.devices={ntasks}"]
    container = container_spec(cfg, base=base, run_path=run_dir_prefix if fixed else str(run_root))
    # inside a container the image's python (first on its PATH) runs the rank, not this one
    python = c.python or ("python" if container else sys.executable)
    program = program or [python, "-m", "rocmtrain"]
    command: list[str | RunDirArg] = [*program, *kept, *shape, RunDirArg("run_dir=")]
    header = [
        f"rocmtrain {__version__} batch job for recipe {cfg.recipe} (rocmtrain/launch/LAUNCH.md)",
        "submitted as: python -m rocmtrain " + " ".join(shlex.quote(o) for o in overrides),
    ]
    return JobSpec(
        job_name=name,
        command=command,
        run_dir_prefix=run_dir_prefix,
        run_dir_fixed=fixed,
        output=str(base / output) if not os.path.isabs(output) else output,
        error=(str(base / c.error) if not os.path.isabs(c.error) else c.error) if c.error else None,
        nodes=nodes,
        ntasks_per_node=ntasks,
        gpus_per_node=gpus,
        cpus_per_task=c.cpus_per_task,
        partition=c.partition,
        account=c.account,
        qos=c.qos,
        time=c.time,
        mem=c.mem,
        constraint=c.constraint,
        exclusive=c.exclusive,
        requeue=c.requeue,
        signal=c.signal,
        chdir=str(base),
        sbatch_args=list(c.sbatch_args),
        srun_args=list(c.srun_args),
        setup=list(c.setup),
        env=planned_env(cfg),
        kill_on_bad_exit=c.kill_on_bad_exit,
        max_restarts=c.max_restarts,
        header=header,
        container=container,
    )


# -- submitting --------------------------------------------------------------------------------
def expand_pattern(pattern: str, *, job_id: str, job_name: str) -> str:
    """Slurm's filename pattern for one job (``%j``, ``%x``, ``%u``, ``%%``; others kept)."""
    table = {"j": job_id, "x": job_name, "u": getpass.getuser(), "%": "%"}
    return re.sub(r"%([jxu%])", lambda m: table[m.group(1)], pattern)


def _sbatch(argv: list[str], *, cwd: str | None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=120)
    except FileNotFoundError as exc:
        raise SubmitError(
            f"cluster.submit_command={argv[0]!r} not found: run on a Slurm login node, or set "
            "cluster.submit_command to sbatch's path (or use cluster=local)",
            code=exit_codes.FAILURE,
        ) from exc


def submit(spec: JobSpec, *, submit_command: str = "sbatch", precheck: bool = True) -> SubmittedJob:
    """Write the script next to the logs and ``sbatch`` it. Raises :class:`SubmitError`."""
    job = render(spec)
    log_dir = Path(spec.output).parent
    for folder in {log_dir, *([Path(spec.error).parent] if spec.error else [])}:
        folder.mkdir(parents=True, exist_ok=True)  # Slurm does not create the log folder
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = log_dir / f"{slug(spec.job_name)}-{stamp}-{os.getpid()}.sbatch"
    path.write_text(job.text)
    if precheck:
        test = _sbatch([submit_command, "--test-only", str(path)], cwd=spec.chdir)
        if test.returncode != 0:
            raise SubmitError(explain_sbatch_error(test.stderr, spec, path))
    proc = _sbatch([submit_command, "--parsable", str(path)], cwd=spec.chdir)
    if proc.returncode != 0:
        raise SubmitError(explain_sbatch_error(proc.stderr, spec, path))
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SubmitError(
            f"sbatch printed {proc.stdout.strip()!r} instead of a job id (script {path})",
            code=exit_codes.FAILURE,
        )
    log = expand_pattern(spec.output, job_id=job_id, job_name=spec.job_name)
    run_dir = spec.run_dir_prefix if spec.run_dir_fixed else f"{spec.run_dir_prefix}-{job_id}"
    return SubmittedJob(job_id=job_id, script_path=path, log_path=log, run_dir=run_dir)


# -- errors --------------------------------------------------------------------------------------
def _run(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


def describe_partitions(partition: str | None = None) -> str:
    """What ``sinfo`` says the partition(s) offer, one line per node type."""
    argv = ["sinfo", "-h", "-o", "%P %D %c %m %G %f"]
    if partition:
        argv[2:2] = ["-p", partition]
    lines = []
    for row in _run(argv).splitlines():
        p, n, cpus, mem, gres, feat = (row.split() + [""] * 6)[:6]
        lines.append(
            f"partition {p}: {n} node(s) with {cpus} CPUs, {mem} MB memory, GRES {gres}, "
            f"features {feat}"
        )
    return "; ".join(lines) or "(sinfo printed nothing)"


def _request(spec: JobSpec) -> str:
    return (
        f"nodes={spec.nodes} ntasks_per_node={spec.ntasks_per_node} "
        f"gpus_per_node={spec.gpus_per_node} cpus_per_task={spec.cpus_per_task} "
        f"mem={spec.mem} constraint={spec.constraint} time={spec.time}"
    )


def explain_sbatch_error(stderr: str, spec: JobSpec, script: Path) -> str:
    """Turn sbatch's stderr into: what was wrong (the ``cluster.*`` field), what Slurm has, the fix."""
    text = " ".join(
        line.split("error:", 1)[-1].strip() for line in stderr.strip().splitlines() if line.strip()
    )
    low = text.lower()
    if "controller" in low and ("unable to contact" in low or "connect" in low):
        why = "the Slurm controller does not answer (not a Slurm login node, or slurmctld is down)"
        fix = "run where `sinfo` works, or use cluster=local"
    elif "invalid partition" in low:
        why = f"cluster.partition={spec.partition!r} does not exist"
        names = sorted({p.rstrip("*") for p in _run(["sinfo", "-h", "-o", "%P"]).split()})
        fix = f"set cluster.partition to one of: {', '.join(names) or '(sinfo printed none)'}"
    elif "gres" in low or "generic resource" in low:
        why = f"cluster.gpus_per_node={spec.gpus_per_node} is not a GPU request this cluster knows"
        fix = (
            f"the cluster has: {describe_partitions(spec.partition)}. On clusters without GPU "
            "GRES set cluster.gpus_per_node=0 (whole nodes: cluster.exclusive=true)"
        )
    elif "feature" in low:
        why = f"cluster.constraint={spec.constraint!r} names no node feature"
        fix = f"the cluster has: {describe_partitions(spec.partition)}"
    elif "account" in low:
        why = f"cluster.account={spec.account!r} is not valid for you (or this partition)"
        fix = "set cluster.account to one of yours (`sacctmgr show assoc user=$USER`)"
    elif "qos" in low:
        why = f"cluster.qos={spec.qos!r} is not valid"
        fix = "set cluster.qos to one of yours (`sacctmgr show assoc user=$USER format=qos`)"
    elif "time" in low:
        why = f"cluster.time={spec.time!r} is not accepted"
        fix = "use Slurm's format (HH:MM:SS or D-HH:MM:SS) within the partition's limit"
    elif any(
        s in low
        for s in ("node configuration", "node count", "memory specification", "allocation failure")
    ):
        why = f"no set of nodes can satisfy the request ({_request(spec)})"
        fix = (
            f"the cluster has: {describe_partitions(spec.partition)}. Lower cluster.nodes / "
            "ntasks_per_node / cpus_per_task / mem, or pick another partition"
        )
    else:
        why, fix = "sbatch refused the job", "see Slurm's message above"
    return (
        f"Slurm rejected the job: {why}.\n  sbatch said: {text or '(nothing)'}\n  fix: {fix}\n"
        f"  script: {script}"
    )


# -- following a job -----------------------------------------------------------------------------
def job_status(job_id: str) -> JobStatus | None:
    """State of a job still known to slurmctld (``scontrol show job``); None when unknown."""
    out = _run(["scontrol", "show", "job", "-o", str(job_id)])
    if not out:
        return None

    def last(key: str) -> str | None:  # last match: a job name may contain "Key=" text
        found = re.findall(rf"(?:^|\s){key}=(\S*)", out)
        return found[-1] if found else None

    state = last("JobState") or "UNKNOWN"
    code = last("ExitCode")
    restarts = last("Restarts")
    done = state not in _ACTIVE
    return JobStatus(
        state=state,
        exit_code=int(code.split(":")[0]) if (done and code) else None,
        restarts=int(restarts) if restarts and restarts.isdigit() else 0,
        reason=last("Reason") or "",
    )


_ACTIVE = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESIZING",
    "SUSPENDED",
    "SIGNALING",
    "STAGE_OUT",
}


def wait(job_id: str, *, timeout_s: float, poll_s: float = 0.3) -> JobStatus:
    """Poll until the job has finished (faster than ``sbatch --wait``). Raises TimeoutError."""
    deadline = time.monotonic() + timeout_s
    status = None
    while time.monotonic() < deadline:
        status = job_status(job_id)
        if status is not None and status.state not in _ACTIVE:
            return status
        time.sleep(poll_s)
    raise TimeoutError(f"Slurm job {job_id} not finished after {timeout_s:.0f} s (last: {status})")
