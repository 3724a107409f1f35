"""Helpers of the Slurm job tests (submit a probe job, wait for files/log lines)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from rocmtrain.config.cluster import ClusterConfig
from rocmtrain.config.schema import RunConfig
from rocmtrain.launch import slurm


def run_config(tmp_path: Path, **cluster: object) -> RunConfig:
    """A RunConfig with ``cluster=slurm`` whose jobs run in ``tmp_path`` (logs + run folders)."""
    cfg = RunConfig()
    cfg.cluster = ClusterConfig(kind="slurm", chdir=str(tmp_path), **cluster)  # type: ignore[arg-type]
    return cfg


def submit_probe(tmp_path: Path, args: list[str], **cluster: object) -> slurm.SubmittedJob:
    """Submit ``python -m rocmtrain.launch.probe <args>`` as a 2-node x 1-task job."""
    cluster = {"nodes": 2, "ntasks_per_node": 1, **cluster}
    spec = slurm.build_spec(
        run_config(tmp_path, **cluster),
        args,
        program=[sys.executable, "-m", "rocmtrain.launch.probe"],
    )
    return slurm.submit(spec)


def wait_for_file(path: Path, *, timeout_s: float, job_id: str) -> None:
    """Wait until ``path`` exists (fail early if the job ended first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return
        status = slurm.job_status(job_id)
        if status is not None and status.exit_code is not None:
            pytest.fail(f"job {job_id} ended ({status}) before {path} appeared")
        time.sleep(0.3)
    pytest.fail(f"{path} did not appear within {timeout_s:.0f} s (job {job_id})")


def wait_for_text(path: Path, text: str, *, timeout_s: float, job_id: str) -> None:
    """Wait until the file ``path`` contains ``text``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        status = slurm.job_status(job_id)
        if status is not None and status.exit_code is not None:
            log = path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"
            pytest.fail(f"job {job_id} ended ({status}) before {text!r} appeared:\n{log}")
        time.sleep(0.3)
    pytest.fail(f"{text!r} not in {path} within {timeout_s:.0f} s (job {job_id})")
