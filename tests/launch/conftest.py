"""Fixtures of the Slurm tests: a real cluster (CI starts one: scripts/ci/start-slurm.sh).

Tests marked ``slurm`` FAIL when ``CI`` is set and no cluster answers; they are skipped (with the
reason) only on a machine without Slurm's client tools and with ``CI`` unset. To run them locally:
``SLURM_NODES=2 bash scripts/ci/start-slurm.sh`` (root), then ``pytest -m slurm tests/launch``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

import pytest

START = "SLURM_NODES=2 bash scripts/ci/start-slurm.sh"


@dataclass(frozen=True)
class Cluster:
    partition: str
    nodes: list[str]


def _ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def slurm_cluster() -> Cluster:
    """The running Slurm cluster (>= 2 idle nodes), or fail/skip with the reason."""
    if shutil.which("sinfo") is None:
        if _ci():
            pytest.fail(f"CI is set but Slurm's sinfo is not installed: run `{START}` first")
        pytest.skip(f"no Slurm here (sinfo not found); start one with `{START}` (as root)")
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %P %T"], capture_output=True, text=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"sinfo did not answer in 20 s: is slurmctld running? (`{START}`)")
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or not rows:
        pytest.fail(f"no Slurm cluster answers (sinfo: {out.stderr.strip()!r}); run `{START}`")
    nodes = sorted({r[0] for r in rows})
    if len(nodes) < 2:
        pytest.fail(f"the Slurm tests need 2 nodes, sinfo shows {nodes}; run `{START}`")
    default = next((r[1] for r in rows if r[1].endswith("*")), rows[0][1])
    return Cluster(partition=default.rstrip("*"), nodes=nodes)
