"""Real Slurm + the real CPU recipe (``python -m rocmtrain cluster=slurm ...``), 2 gloo ranks on 2 nodes.

* the submitted job trains like the same run started locally (2 ranks on this machine, no
  Slurm): the same loss at every one of the first 10 steps (to 1e-5) and the same final metrics
  (to 1e-3), so rank wiring, sharding and data shards agree. Not bitwise: a 2-node job sums some
  gradient in another order than 2 ranks on one node (a 1-node x 2-rank job matches the local run
  exactly), so the curves part at the 1e-7 level from step 3 and 40 steps grow that to ~4e-4 on
  some CPUs (an AVX-512 machine, 2026-12-02); a wiring fault moves the first steps by far more;
* SIGUSR1 to the batch shell (what ``--signal=B:USR1@N`` does before the time limit) → ranks
  checkpoint and exit 75 → the script requeues → restart 1 resumes from that checkpoint and ends
  with the validation metrics of the uninterrupted job (same model);
* ``scancel`` stops a running job: cancelled, not requeued, no rank process left.
"""

from __future__ import annotations

import ast
import csv
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_helpers import run_config, wait_for_text

from rocmtrain.launch import slurm

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

#: short CPU recipe: 1 epoch of 40 steps per rank (long enough to be signalled mid-run)
SHORT = [
    "trainer.max_epochs=1",
    "data.num_train_batches=40",
    "data.num_val_batches=2",
    "trainer.progress_bar=false",
    "trainer.log_every_n_steps=1",
]
#: steps whose losses must agree to rounding (before rounding differences can compound)
EARLY_STEPS = 10
STEP1_DONE = "(steady state)"  # logged by every rank after step 1 (two-phase timeouts)


def final_metrics(text: str) -> dict[str, float]:
    """The ``final metrics: {...}`` line train(cfg) logs at the end (last one in ``text``)."""
    found = re.findall(r"final metrics: (\{.*\})", text)
    assert found, text[-3000:]
    return ast.literal_eval(found[-1])


def assert_same_training(
    a: dict[str, float],
    b: dict[str, float],
    keys: tuple[str, ...] = ("train_loss", "val_loss", "val_auc", "val_ne"),
    rel: float = 1e-5,
) -> None:
    for key in keys:
        assert a[key] == pytest.approx(b[key], rel=rel, abs=1e-6), (key, a, b)


def step_losses(run_dir: Path) -> dict[int, float]:
    """Training loss per step from the run's ``logs/metrics.csv`` (logged every step)."""
    with open(run_dir / "logs" / "metrics.csv") as f:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f) if r.get("loss")}


def _submit_cli(tmp_path: Path, extra: list[str]) -> tuple[str, Path, Path]:
    proc = subprocess.run(
        [sys.executable, "-m", "rocmtrain", "cluster=slurm", f"cluster.chdir={tmp_path}", *extra],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = re.search(r"submitted Slurm job (\d+)", proc.stdout).group(1)  # type: ignore[union-attr]
    log = Path(re.search(r"log: +(\S+)", proc.stdout).group(1))  # type: ignore[union-attr]
    run_dir = Path(re.search(r"run dir: +(\S+)", proc.stdout).group(1))  # type: ignore[union-attr]
    return job_id, log, run_dir


@pytest.fixture(scope="module")
def reference_runs(slurm_cluster, tmp_path_factory) -> dict[str, object]:
    """The short recipe as a Slurm job (through the CLI) and, meanwhile, locally (2 processes)."""
    tmp = tmp_path_factory.mktemp("recipe")
    shape = ["cluster.nodes=2", "cluster.ntasks_per_node=1"]
    job_id, log, run_dir = _submit_cli(tmp, [*shape, *SHORT])
    local = subprocess.run(
        [sys.executable, "-m", "rocmtrain", *SHORT, f"run_dir={tmp / 'local'}"],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert local.returncode == 0, local.stderr[-3000:]
    status = slurm.wait(job_id, timeout_s=300)
    return {
        "job_id": job_id,
        "status": status,
        "log": log.read_text(),
        "run_dir": run_dir,
        "local": final_metrics(local.stdout + local.stderr),
        "local_run_dir": tmp / "local",
    }


def test_cpu_recipe_job_trains_like_the_local_run(reference_runs) -> None:
    r = reference_runs
    log, run_dir = r["log"], r["run_dir"]
    assert r["status"].state == "COMPLETED" and r["status"].exit_code == 0, log[-3000:]
    assert run_dir.name == f"rocmtrain-dlrm_cpu-{r['job_id']}"
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in log and "GLOBAL_RANK: 1, MEMBER: 2/2" in log
    assert (run_dir / "logs" / "metrics.csv").is_file()
    assert any((p / "COMPLETE.json").is_file() for p in (run_dir / "checkpoints").iterdir())
    job, local = step_losses(run_dir), step_losses(r["local_run_dir"])
    assert len(job) == len(local) == 40, (len(job), len(local))
    for step in range(EARLY_STEPS):
        assert job[step] == pytest.approx(local[step], rel=1e-5), (step, job, local)
    assert_same_training(final_metrics(log), r["local"], rel=1e-3)


def test_requeued_job_resumes_from_its_checkpoint(reference_runs, tmp_path: Path) -> None:
    spec = slurm.build_spec(run_config(tmp_path, nodes=2, ntasks_per_node=1), SHORT)
    job = slurm.submit(spec)
    log = Path(job.log_path)
    wait_for_text(log, STEP1_DONE, timeout_s=240, job_id=job.job_id)
    # what Slurm does N seconds before the time limit with --signal=B:USR1@N
    subprocess.run(["scancel", "--signal=USR1", "--batch", job.job_id], check=True)
    status = slurm.wait(job.job_id, timeout_s=300)
    text = log.read_text()
    assert status.state == "COMPLETED" and status.exit_code == 0, text[-4000:]
    assert status.restarts == 1, text[-4000:]
    assert "batch shell got SIGUSR1, forwarding it to the ranks" in text
    step = int(re.search(r"preemption \(SIGUSR1\): checkpoint at step (\d+)", text).group(1))  # type: ignore[union-attr]
    assert 0 < step < 40
    assert f"job {job.job_id} (restart 1)" in text
    assert re.search(rf"resuming from \S*/checkpoints/step-0*{step}\b", text), text[-4000:]
    # the resumed job ends with the model of the uninterrupted one: identical validation metrics
    # (train_loss/train_auc are means over the steps this attempt ran, so they differ)
    assert_same_training(
        final_metrics(text), final_metrics(reference_runs["log"]), ("val_loss", "val_auc", "val_ne")
    )


def test_scancel_stops_a_running_job(slurm_cluster, tmp_path: Path) -> None:
    long = [a for a in SHORT if not a.startswith("data.num_train_batches")]
    spec = slurm.build_spec(
        run_config(tmp_path, nodes=2, ntasks_per_node=1), [*long, "data.num_train_batches=100000"]
    )
    job = slurm.submit(spec)
    log = Path(job.log_path)
    wait_for_text(log, STEP1_DONE, timeout_s=240, job_id=job.job_id)
    subprocess.run(["scancel", job.job_id], check=True)
    status = slurm.wait(job.job_id, timeout_s=60)
    assert status.state == "CANCELLED", status
    deadline = time.monotonic() + 30  # KillWait (5 s here) + slurmstepd clean-up
    while time.monotonic() < deadline and _ranks_of(job.run_dir):
        time.sleep(0.5)
    assert not _ranks_of(job.run_dir), "rank processes survived scancel"
    text = log.read_text()
    assert "scontrol requeue" not in text.split("batch shell got SIGTERM", 1)[-1], text[-3000:]
    status = slurm.job_status(job.job_id)
    assert status is not None and status.state == "CANCELLED" and status.restarts == 0, status


def _ranks_of(run_dir: str) -> list[int]:
    """Pids of processes whose command line names ``run_dir`` (the job's ranks)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"run_dir={run_dir}" in cmd:
            pids.append(int(proc.name))
    return pids
