"""Launching runs: Slurm submission and the per-rank setup inside a job.

Runbook (details, the rendered script and the requeue flow: ``rocmtrain/launch/LAUNCH.md``)::

    # print the batch script and the srun line, submit nothing (works without a cluster)
    python -m rocmtrain recipe=dlrm_mi300 cluster=slurm cluster.nodes=4 dry_run=true
    # submit: prints the job id, the log file and the run folder
    python -m rocmtrain recipe=dlrm_mi300 cluster=slurm cluster.nodes=4 \\
        cluster.partition=mi300x cluster.time=04:00:00

The CLI calls :func:`maybe_submit` after composing the config. Inside the job every Slurm task runs
the same command line again; :func:`in_slurm_step` is then true and the rank trains. Rank, world
size and master address come from Lightning's ``SLURMEnvironment`` (use
:func:`cluster_environment` for the Trainer's plugins); device and CPU/NUMA binding from
:func:`rocmtrain.launch.binding.bind_local_rank`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from rocmtrain import exit_codes


def in_slurm_step(environ: Mapping[str, str] | None = None) -> bool:
    """True inside an srun-launched task (a job step), where this process is one rank."""
    env = os.environ if environ is None else environ
    return "SLURM_JOB_ID" in env and "SLURM_STEP_ID" in env and "SLURM_PROCID" in env


def cluster_environment() -> Any | None:
    """Lightning's ``SLURMEnvironment`` for the Trainer's ``plugins`` when running as a Slurm task.

    ``auto_requeue=False``: rocmtrain's batch script requeues on exit code 75 (the watchdog's
    signal handler checkpoints and exits 75); Lightning's own USR1 handler must not requeue too.
    Returns None outside Slurm (Lightning then picks its default environment).
    """
    if not in_slurm_step():
        return None
    from lightning_fabric.plugins.environments import SLURMEnvironment

    return SLURMEnvironment(auto_requeue=False)


def maybe_submit(cfg: Any, overrides: list[str]) -> int | None:
    """Submit ``cfg`` to Slurm (or print the dry run) when ``cluster.kind == "slurm"``.

    Returns the exit code when it submitted or printed; None when this process should train here
    (``cluster.kind == "local"``, or already a rank inside the Slurm job).
    """
    if cfg.cluster.kind != "slurm" or in_slurm_step():
        return None
    from rocmtrain.launch import slurm

    try:
        spec = slurm.build_spec(cfg, overrides)
        if cfg.dry_run:
            return _print_dry_run(spec)
        job = slurm.submit(
            spec, submit_command=cfg.cluster.submit_command, precheck=cfg.cluster.precheck
        )
    except slurm.SubmitError as exc:
        print(f"rocmtrain: error: {exc}", file=sys.stderr)
        return exc.code
    except ValueError as exc:  # unquotable value (newline in an #SBATCH option), bad env name
        print(f"rocmtrain: error: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    print(
        f"rocmtrain: submitted Slurm job {job.job_id} ({spec.nodes} node(s) x "
        f"{spec.ntasks_per_node} rank(s))\n"
        f"  log:     {job.log_path}\n"
        f"  run dir: {job.run_dir}\n"
        f"  script:  {job.script_path}\n"
        f"  follow:  tail -f {job.log_path}    cancel: scancel {job.job_id}",
        flush=True,
    )
    return exit_codes.OK


def _print_dry_run(spec: Any) -> int:
    from rocmtrain.launch.script import render

    job = render(spec)
    c = spec.container
    where = ""
    if c is not None:
        gpu = f"apptainer gpu flag: {c.gpu}" if c.runtime == "apptainer" else "GPUs from Slurm"
        where = f"container: {c.runtime} image {c.image!r}, mounts {list(c.mounts)}, {gpu}\n"
    print(
        "rocmtrain dry run (cluster=slurm): this batch script would be submitted with sbatch:\n"
        "----- 8< -----\n"
        f"{job.text}"
        "----- >8 -----\n"
        f"srun line:\n  {job.srun_line}\n"
        f"{where}"
        f"log: {spec.output}   run dir: {spec.run_dir_prefix}"
        + ("" if spec.run_dir_fixed else "-<SLURM_JOB_ID>"),
        flush=True,
    )
    return exit_codes.OK
