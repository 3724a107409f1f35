"""Helpers of the Slurm job tests: find the cluster start-slurm.sh started (its marker, checked
against the controller that answers), submit a probe job, wait for files/log lines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rocmtrain.config.cluster import ClusterConfig
from rocmtrain.config.schema import RunConfig
from rocmtrain.launch import slurm

START = "SLURM_NODES=2 bash scripts/ci/start-slurm.sh"
DEFAULT_MARKER = "/run/rocmtrain-ci-slurm/cluster.json"
#: seconds one Slurm client command may take (a controller that is down makes them retry)
CLIENT_TIMEOUT_S = 20


@dataclass(frozen=True)
class Cluster:
    name: str
    partition: str
    nodes: list[str]
    slurm_conf: str
    """The config of this cluster: ``SLURM_CONF`` of every client the tests start."""


class NotOurCluster(Exception):
    """No cluster started by start-slurm.sh answers; the message says why and what to run."""


def marker_path() -> Path:
    return Path(os.environ.get("ROCMTRAIN_CI_SLURM_MARKER") or DEFAULT_MARKER)


def read_marker(path: Path) -> dict[str, Any]:
    """The marker start-slurm.sh wrote, or :class:`NotOurCluster` naming what is wrong."""
    if not path.is_file():
        raise NotOurCluster(
            f"no cluster started by scripts/ci/start-slurm.sh (no marker {path}); "
            f"start one with `{START}` (as root)"
        )
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise NotOurCluster(f"marker {path} is unreadable ({err}); rerun `{START}`") from err
    for key in ("cluster", "nodes", "slurmctld_pid"):
        if key not in marker:
            raise NotOurCluster(f"marker {path} has no {key!r}; rerun `{START}`")
    return marker


def _client(args: list[str], conf: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLURM_CONF": conf}
    try:
        return subprocess.run(
            args, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, env=env
        )
    except subprocess.TimeoutExpired as err:
        raise NotOurCluster(
            f"`{' '.join(args)}` did not answer in {CLIENT_TIMEOUT_S} s: is slurmctld running? "
            f"(`{START}`)"
        ) from err


def _controller_pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user (tests not run as root)
        return True
    return True


def answering_cluster_name(conf: str) -> str:
    """``ClusterName`` of the controller ``conf`` leads to, once ``scontrol ping`` says UP."""
    ping = _client(["scontrol", "ping"], conf)
    if ping.returncode != 0 or " is UP" not in ping.stdout:
        said = (ping.stdout + ping.stderr).strip()
        raise NotOurCluster(f"no Slurm controller answers (scontrol ping: {said!r}); run `{START}`")
    config = _client(["scontrol", "show", "config"], conf)
    for line in config.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip()
    raise NotOurCluster(f"`scontrol show config` names no ClusterName; rerun `{START}`")


def check_our_cluster(marker: dict[str, Any], path: Path) -> None:
    """The controller that answers is the one the marker names, still running."""
    pid = int(marker["slurmctld_pid"])
    if not _controller_pid_alive(pid):
        raise NotOurCluster(
            f"marker {path} names slurmctld pid {pid}, which is not running (stopped without "
            f"scripts/ci/stop-slurm.sh?); rerun `{START}`"
        )
    name = answering_cluster_name(marker_conf(marker))
    if name != marker["cluster"]:
        raise NotOurCluster(
            f"the Slurm controller that answers is cluster {name!r}, not {marker['cluster']!r} "
            f"that scripts/ci/start-slurm.sh started (marker {path}); the tests submit jobs only "
            f"to that one: rerun `{START}`"
        )


def marker_conf(marker: dict[str, Any]) -> str:
    return str(marker.get("slurm_conf") or "/etc/slurm/slurm.conf")


def idle_nodes(conf: str) -> tuple[list[str], str]:
    """The cluster's nodes and default partition, as ``sinfo`` shows them."""
    out = _client(["sinfo", "-h", "-N", "-o", "%N %P %T"], conf)
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not rows:
        raise NotOurCluster(f"sinfo shows no nodes ({out.stderr.strip()!r}); rerun `{START}`")
    default = next((r[1] for r in rows if r[1].endswith("*")), rows[0][1])
    return sorted({r[0] for r in rows}), default.rstrip("*")


def find_cluster() -> Cluster:
    """The cluster start-slurm.sh started (>= 2 nodes), or :class:`NotOurCluster`."""
    if shutil.which("sinfo") is None or shutil.which("scontrol") is None:
        raise NotOurCluster(f"no Slurm here (sinfo/scontrol not found); start one with `{START}`")
    path = marker_path()
    marker = read_marker(path)
    check_our_cluster(marker, path)
    conf = marker_conf(marker)
    nodes, partition = idle_nodes(conf)
    if len(nodes) < 2:
        raise NotOurCluster(f"the Slurm tests need 2 nodes, sinfo shows {nodes}; run `{START}`")
    return Cluster(name=marker["cluster"], partition=partition, nodes=nodes, slurm_conf=conf)


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
