"""Real Slurm: rank wiring, quoting and exit-75 requeue (rank probe jobs), and bad submissions.

The probe (``rocmtrain.launch.probe``) is a real rocmtrain program: every rank reads its place
from Lightning's SLURMEnvironment, joins a gloo process group and all-reduces. The CPU recipe
itself runs in test_slurm_recipe.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_helpers import run_config, submit_probe

from rocmtrain import exit_codes
from rocmtrain.launch import maybe_submit, slurm

pytestmark = pytest.mark.slurm

#: each would create a CANARY file if a shell evaluated it
HOSTILE_ARGS = [
    "$(touch CANARY_A)",
    "`touch CANARY_B`",
    "x; touch CANARY_C",
    'it\'s "quoted" \\ back',
    "line1\ntouch CANARY_D",
    "a  b\t*",
]
HOSTILE_NAME = "probe $(touch CANARY_N) `touch CANARY_M`; 'q' \"d\" \\ #x"


def test_probe_job_ranks_quoting_and_requeue(slurm_cluster, tmp_path: Path) -> None:
    """2 ranks on 2 nodes; hostile job name/args arrive verbatim; exit 75 → requeue → restart 1."""
    job = submit_probe(tmp_path, [*HOSTILE_ARGS, "--requeue-once"], job_name=HOSTILE_NAME)
    status = slurm.wait(job.job_id, timeout_s=180)
    log = Path(job.log_path).read_text()
    assert status.state == "COMPLETED" and status.exit_code == 0, (status, log)
    assert status.restarts == 1, log  # requeued once by the batch script (SLURM_RESTART_COUNT=1)
    assert log.count("asked for a requeue (exit 75)") == 1, log
    run_dir = Path(job.run_dir)
    assert run_dir.name == f"probe_touch_CANARY_N_touch_CANARY_M_q_d_x-{job.job_id}"
    records = {
        (r["rank"], r["restart"]): r
        for r in (json.loads(p.read_text()) for p in run_dir.glob("probe-rank*-restart*.json"))
    }
    assert sorted(records) == [(0, 0), (0, 1), (1, 0), (1, 1)], sorted(records)
    for rec in records.values():
        assert rec["world_size"] == 2 and rec["allreduce"] == 3.0  # 1 + 2 over gloo
        assert rec["argv"] == [
            *HOSTILE_ARGS,
            "--requeue-once",
            "trainer.num_nodes=2",
            "trainer.devices=1",
            f"run_dir={run_dir}",
        ]
        assert rec["job_name"] == HOSTILE_NAME and rec["job_id"] == job.job_id
        assert rec["main_address"] == slurm_cluster.nodes[0]  # first node of the allocation
    # one rank per node, node rank = node index
    assert {records[(r, 0)]["node"] for r in (0, 1)} == set(slurm_cluster.nodes[:2])
    assert [records[(r, 1)]["node_rank"] for r in (0, 1)] == [0, 1]
    assert not list(tmp_path.rglob("CANARY*")) and not list(Path.cwd().glob("CANARY*"))


@pytest.mark.parametrize(
    ("cluster", "field", "hint"),
    [
        ({"partition": "no_such_partition"}, "cluster.partition", "set cluster.partition to one"),
        ({"nodes": 64}, "no set of nodes can satisfy", "Lower cluster.nodes"),
        ({"mem": "900T"}, "no set of nodes can satisfy", "Lower cluster.nodes"),
        ({"gpus_per_node": 8}, "cluster.gpus_per_node=8", "cluster.gpus_per_node=0"),
    ],
)
def test_bad_submission_gives_clear_error(
    slurm_cluster, tmp_path: Path, capsys, cluster: dict, field: str, hint: str
) -> None:
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    cfg = run_config(tmp_path, ntasks_per_node=1, **cluster)
    code = maybe_submit(cfg, ["cluster=slurm"])
    err = capsys.readouterr().err
    assert code == exit_codes.USAGE, err
    assert "Slurm rejected the job" in err and field in err and hint in err, err
    assert "sbatch said:" in err and slurm_cluster.partition in err  # Slurm's own words + sinfo
    after = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    assert after == before  # nothing left pending forever


def test_bad_submission_through_the_cli(slurm_cluster, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocmtrain",
            "cluster=slurm",
            "cluster.partition=no_such_partition",
            f"cluster.chdir={tmp_path}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode != 0
    assert "cluster.partition='no_such_partition' does not exist" in proc.stderr, proc.stderr
    assert "submitted Slurm job" not in proc.stdout
