"""The Slurm tests reach only the cluster scripts/ci/start-slurm.sh started: its marker must exist,
name a running slurmctld, and match the ClusterName of the controller that answers. Checked here
with fake ``sinfo``/``scontrol`` executables (real subprocesses) standing in for other clusters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_helpers import NotOurCluster, find_cluster

UP = "Slurmctld(primary) at localhost is UP"
DOWN = "Slurmctld(primary) at localhost is DOWN"


def _fake_clients(bin_dir: Path, *, ping: str, cluster: str) -> None:
    """``scontrol`` answering ``ping`` / ``show config`` and ``sinfo`` showing 2 idle nodes."""
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = ping ]; then echo "{ping}"; exit 0; fi\n'
        f'echo "ClusterName             = {cluster}"\n'
    )
    (bin_dir / "sinfo").write_text('#!/bin/sh\nprintf "n1 debug* idle\\nn2 debug* idle\\n"\n')
    for tool in ("scontrol", "sinfo"):
        (bin_dir / tool).chmod(0o755)


def _marker(path: Path, *, pid: int, cluster: str = "rocmtrain_ci") -> None:
    fields = {"cluster": cluster, "nodes": ["n1", "n2"], "slurmctld_pid": pid}
    path.write_text(json.dumps({**fields, "slurm_conf": str(path.parent / "slurm.conf")}))


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ROCMTRAIN_CI_SLURM_MARKER", str(tmp_path / "cluster.json"))
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def test_our_cluster_is_found(env: Path) -> None:
    _fake_clients(env / "bin", ping=UP, cluster="rocmtrain_ci")
    _marker(env / "cluster.json", pid=os.getpid())
    cluster = find_cluster()
    assert cluster.name == "rocmtrain_ci" and cluster.nodes == ["n1", "n2"]
    assert cluster.partition == "debug" and cluster.slurm_conf == str(env / "slurm.conf")


def test_a_cluster_that_answers_without_marker_gets_no_jobs(env: Path) -> None:
    _fake_clients(env / "bin", ping=UP, cluster="rocmtrain_ci")
    with pytest.raises(NotOurCluster, match=r"no marker .*cluster\.json.*start-slurm\.sh"):
        find_cluster()


def test_another_cluster_answering_is_refused(env: Path) -> None:
    _fake_clients(env / "bin", ping=UP, cluster="production")
    _marker(env / "cluster.json", pid=os.getpid())
    with pytest.raises(NotOurCluster, match=r"cluster 'production', not 'rocmtrain_ci'"):
        find_cluster()


def test_controller_down_is_a_reason_not_an_error(env: Path) -> None:
    _fake_clients(env / "bin", ping=DOWN, cluster="rocmtrain_ci")
    _marker(env / "cluster.json", pid=os.getpid())
    with pytest.raises(NotOurCluster, match=r"no Slurm controller answers.*is DOWN"):
        find_cluster()


def test_stale_marker_of_a_stopped_controller(env: Path) -> None:
    _fake_clients(env / "bin", ping=UP, cluster="rocmtrain_ci")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that just exited: not running
    _marker(env / "cluster.json", pid=gone.pid)
    with pytest.raises(NotOurCluster, match=rf"slurmctld pid {gone.pid}, which is not running"):
        find_cluster()


@pytest.mark.parametrize("ci, outcome", [("", "skipped"), ("true", "error")])
def test_fixture_skips_or_fails_under_ci(env: Path, ci: str, outcome: str) -> None:
    """A real pytest run of a test using the fixture, with no marker: skip, or fail under CI."""
    _fake_clients(env / "bin", ping=UP, cluster="rocmtrain_ci")
    here = Path(__file__).parent
    test = env / "test_uses_cluster.py"
    test.write_text("def test_job(slurm_cluster):\n    raise AssertionError('submitted')\n")
    (env / "conftest.py").write_text((here / "conftest.py").read_text())
    run_env = {**os.environ, "CI": ci, "PYTHONPATH": os.pathsep.join([str(here), *sys.path])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(test)],
        cwd=env,
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert f"1 {outcome}" in proc.stdout, proc.stdout[-2000:]
    assert "submitted" not in proc.stdout and "no marker" in proc.stdout, proc.stdout[-2000:]
