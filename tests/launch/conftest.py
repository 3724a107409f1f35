"""Fixtures of the Slurm tests: the cluster ``scripts/ci/start-slurm.sh`` started, and no other.

The tests marked ``slurm`` submit real jobs, so they run only against the cluster named by the
marker file start-slurm.sh writes once its nodes are idle (``/run/rocmtrain-ci-slurm/cluster.json``,
or ``$ROCMTRAIN_CI_SLURM_MARKER``; stop-slurm.sh removes it), and only while that cluster's
controller answers under that name. Any other cluster that happens to answer ``sinfo`` (a site's
real one, through ``/etc/slurm`` or ``SLURM_CONF``) is never given a job.

Without such a cluster the tests are skipped with the command that starts one; with ``CI`` set
(``.ci/run`` starts the cluster first) they fail instead. To run them locally (root):
``SLURM_NODES=2 bash scripts/ci/start-slurm.sh``, then ``pytest -m slurm tests/launch``.
"""

from __future__ import annotations

import os

import pytest
from slurm_helpers import Cluster, NotOurCluster, find_cluster


def _ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def slurm_cluster() -> Cluster:
    """The running cluster of start-slurm.sh; skip (fail under ``CI``) with the reason otherwise."""
    try:
        cluster = find_cluster()
    except NotOurCluster as why:
        if _ci():
            pytest.fail(f"CI is set: {why}")
        pytest.skip(str(why))
    # every sbatch/scontrol the tests run, and (sbatch exports the environment) every srun in
    # their jobs, reach this cluster even where /etc/slurm or SLURM_CONF lead to another one
    os.environ["SLURM_CONF"] = cluster.slurm_conf
    return cluster
