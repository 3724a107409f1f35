"""Batch-script rendering, dry run and ClusterConfig validation: no Slurm cluster needed.

The quoting is checked by real bash (``bash -n`` and executing the rendered srun line with
``srun`` defined as a shell function that prints its argv), not by re-reading our own output.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rocmtrain.config import ConfigError
from rocmtrain.config.cluster import ClusterConfig
from rocmtrain.config.schema import RunConfig
from rocmtrain.launch import in_slurm_step, maybe_submit
from rocmtrain.launch.script import render, sbatch_quote
from rocmtrain.launch.slurm import build_spec

REPO = Path(__file__).resolve().parents[2]
EVIL = [
    "a b",
    "$(touch CANARY1)",
    "`touch CANARY2`",
    "x;touch CANARY3",
    "q'\"\\",
    "nl\ntouch CANARY4",
    "${HOME}",
    "*",
]


def _cfg(**cluster: object) -> RunConfig:
    cfg = RunConfig()
    cfg.cluster = ClusterConfig(kind="slurm", **cluster)  # type: ignore[arg-type]
    return cfg


def _argv_of_srun_line(srun_line: str, tmp_path: Path, run_dir: str) -> list[str]:
    """Let bash parse the srun line (srun = a function printing its argv as JSON)."""
    out = tmp_path / "argv.json"
    script = (
        f"srun() {{ {shlex.quote(sys.executable)} -c 'import json,sys; "
        f'json.dump(sys.argv[1:], open(sys.argv[1], "w"))\' {shlex.quote(str(out))} "$@"; }}\n'
        f"RUN_DIR={shlex.quote(run_dir)}\nREQUEUE_FLAG=/nonexistent\n{srun_line}\n"
    )
    subprocess.run(["bash", "-c", script], cwd=tmp_path, check=True)
    return json.loads(out.read_text())[1:]


def test_render_shape_from_trainer_and_cluster(tmp_path: Path) -> None:
    cfg = _cfg(partition="mi300x", account="proj42", time="02:00:00", cpus_per_task=12, mem="0")
    cfg.trainer.accelerator, cfg.trainer.devices, cfg.trainer.num_nodes = "gpu", 8, 1
    cfg.cluster.nodes = 4
    spec = build_spec(
        cfg, ["recipe=dlrm_mi300", "cluster=slurm", "trainer.devices=8"], workdir=tmp_path
    )
    job = render(spec)
    lines = job.text.splitlines()
    for expected in (
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=12",
        "#SBATCH --partition=mi300x",
        "#SBATCH --account=proj42",
        "#SBATCH --time=02:00:00",
        "#SBATCH --mem=0",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@300",
        "#SBATCH --open-mode=append",
        "#SBATCH --job-name=rocmtrain-dlrm_cpu",
        "export OMP_NUM_THREADS=12",
    ):
        assert expected in lines, expected
    # srun repeats --cpus-per-task (Slurm >= 22.05 does not pass sbatch's value to srun)
    assert job.srun_line.startswith("srun --kill-on-bad-exit=1 --cpus-per-task=12 ")
    argv = _argv_of_srun_line(job.srun_line, tmp_path, "/runs/x-7")
    # the per-rank wrapper, then exactly: python -m rocmtrain <overrides> <shape> run_dir
    assert argv[argv.index(sys.executable) :] == [
        sys.executable,
        "-m",
        "rocmtrain",
        "recipe=dlrm_mi300",
        "cluster=slurm",
        "trainer.num_nodes=4",
        "trainer.devices=8",
        "run_dir=/runs/x-7",
    ]
    assert f'RUN_DIR={tmp_path.resolve()}/runs/rocmtrain-dlrm_cpu-"$SLURM_JOB_ID"' in lines
    subprocess.run(["bash", "-n"], input=job.text, text=True, check=True)


def test_cpu_run_requests_no_gpus_and_honours_explicit_run_dir(tmp_path: Path) -> None:
    cfg = _cfg(nodes=2, ntasks_per_node=1)
    cfg.run_dir = "my/run"
    job = render(build_spec(cfg, ["run_dir=my/run", "trainer.max_epochs=1"], workdir=tmp_path))
    assert not any("--gpus-per-node" in line for line in job.text.splitlines())
    assert f"RUN_DIR={tmp_path.resolve()}/my/run" in job.text.splitlines()
    argv = _argv_of_srun_line(job.srun_line, tmp_path, "/fixed")
    assert argv[-4:] == [
        "trainer.max_epochs=1",
        "trainer.num_nodes=2",
        "trainer.devices=1",
        "run_dir=/fixed",
    ]


def test_hostile_values_are_quoted_for_bash(tmp_path: Path) -> None:
    name = "j$(touch CANARY0) `touch CANARY5`;'\"\\#x"
    cfg = _cfg(job_name=name, env={"MY_VAR": "$(touch CANARY6);`x`'\""}, srun_args=["--label"])
    job = render(build_spec(cfg, EVIL, workdir=tmp_path))
    subprocess.run(["bash", "-n"], input=job.text, text=True, check=True)
    argv = _argv_of_srun_line(job.srun_line, tmp_path, "/r")
    assert argv[argv.index("rocmtrain") + 1 :][: len(EVIL)] == EVIL
    assert "--label" in argv
    # exports: let bash evaluate the export line only
    export = next(line for line in job.text.splitlines() if line.startswith("export MY_VAR="))
    got = subprocess.run(
        ["bash", "-c", f'{export}\nprintf %s "$MY_VAR"'],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert got.stdout == "$(touch CANARY6);`x`'\""
    # the newline inside an override did not end the header comment: all lines before the
    # first command are comments / #SBATCH lines
    head = job.text.split("\nset -uo pipefail\n", 1)[0].splitlines()
    assert all(line.startswith("#") for line in head), head
    assert not list(tmp_path.glob("CANARY*"))
    # output file name uses a file-system-safe form of the job name
    assert re.search(r"--output=\S+/j_touch_CANARY0_touch_CANARY5_x-%j\.out$", job.text, re.M)


def test_sbatch_quote_rules() -> None:
    assert sbatch_quote('a"b\\c') == '"a\\"b\\\\c"'
    with pytest.raises(ValueError, match="newline"):
        sbatch_quote("a\nb", option="--job-name")
    with pytest.raises(ValueError, match="cluster.job_name|--job-name"):
        render(build_spec(_cfg(job_name="two\nlines"), [], workdir="/tmp"))


def test_requeue_disabled_renders_no_scontrol(tmp_path: Path) -> None:
    job = render(build_spec(_cfg(requeue=False, signal=None), [], workdir=tmp_path))
    assert "#SBATCH --no-requeue" in job.text and "scontrol requeue" not in job.text
    assert "#SBATCH --signal" not in job.text


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("kind", "pbs", "local, slurm"),
        ("time", "2h", "HH:MM:SS"),
        ("time", "25:99:99", "HH:MM:SS"),
        ("time", "1-24:00:00", "HH:MM:SS"),
        ("time", "90:60", "HH:MM:SS"),
        ("signal", "USR1 @ 90", "B:USR1@300"),
        ("signal", "B:TERM@300", "TERM@300"),
        ("mem", "lots", "480G"),
        ("nodes", 0, "positive"),
        ("job_name", "bash", "Lightning"),
        ("env", {"BAD-NAME": "1"}, "letters"),
    ],
)
def test_cluster_config_errors_name_field_and_fix(field: str, value: object, match: str) -> None:
    c = ClusterConfig(kind="slurm")
    setattr(c, field, value)
    with pytest.raises(ConfigError, match=match) as err:
        c.validate()
    assert "cluster." in str(err.value)


@pytest.mark.parametrize("value", ["30", "90:30", "25:59:59", "100:00:00", "2-23:59:59", "1-0"])
def test_slurm_times_in_range_are_accepted(value: str) -> None:
    ClusterConfig(kind="slurm", time=value).validate()


def test_fabricated_env_var_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="RCCL_PROTO"):
        build_spec(_cfg(env={"RCCL_PROTO": "LL"}), [], workdir=tmp_path)


def test_maybe_submit_runs_here_when_local_or_inside_a_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert maybe_submit(RunConfig(), []) is None  # cluster=local
    for var, value in (("SLURM_JOB_ID", "5"), ("SLURM_STEP_ID", "0"), ("SLURM_PROCID", "1")):
        monkeypatch.setenv(var, value)
    assert in_slurm_step()
    assert maybe_submit(_cfg(), []) is None  # a rank inside the job trains


def test_dry_run_cli_prints_script_without_a_cluster(tmp_path: Path) -> None:
    """The real CLI, with no sbatch on PATH: prints the script and the srun line, exit 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = "/usr/bin/nonexistent"  # no sbatch/sinfo reachable: nothing can be submitted
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocmtrain",
            "recipe=dlrm_mi300",
            "cluster=slurm",
            "cluster.nodes=4",
            "cluster.partition=mi300x",
            "dry_run=true",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    script = out.split("----- 8< -----\n", 1)[1].split("----- >8 -----", 1)[0]
    assert script.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8"):
        assert line in script.splitlines()
    srun = out.split("srun line:\n", 1)[1].splitlines()[0].strip()
    assert srun in script and "trainer.num_nodes=4 trainer.devices=8" in srun
    assert "recipe=dlrm_mi300" in srun and "dry_run" not in srun
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert not list(tmp_path.glob("runs/*.sbatch"))  # nothing written, nothing submitted
