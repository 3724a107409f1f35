"""Real Slurm: each runtime's batch script runs 2 probe ranks on 2 nodes, and every rank gets the
exact argv; a job name too long for a file name still runs.

The runtimes themselves cannot be installed here: Debian 12 packages no Apptainer
(``apt-cache policy apptainer singularity-container``: no candidate) and this Slurm has no pyxis
plugin (srun refuses ``--container-image``). So, and only for that part:

* ``apptainer`` is a stand-in on PATH that records its argv per rank, refuses options rocmtrain
  does not use, checks the image and bind sources exist, and then does what ``apptainer exec``
  does with them on this host (``--pwd``, then exec the command after the image);
* ``srun`` is a wrapper on PATH that records its argv, takes pyxis's ``--container-*`` options
  off (checking the mount sources, ``--container-workdir`` becomes ``--chdir``) and execs the
  real srun with the rest.

Everything else (sbatch, the batch script, srun, the per-rank wrapper, the requeue, the probe's
process group) is the real thing.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from slurm_helpers import submit_probe

from rocmtrain.config.cluster import ContainerConfig
from rocmtrain.launch import slurm

pytestmark = pytest.mark.slurm

HOSTILE_ARGS = [
    "$(touch CANARY_A)",
    "`touch CANARY_B`",
    "x; touch CANARY_C",
    'it\'s "q" \\',
    "l1\nl2",
]

_APPTAINER = '''#!{python}
"""Stand-in for `apptainer exec` (see tests/launch/test_slurm_containers.py)."""
import json, os, sys
from pathlib import Path

argv = sys.argv[1:]
rank = os.environ.get("SLURM_PROCID", "?")
restart = os.environ.get("SLURM_RESTART_COUNT", "0") or "0"
Path({log!r}, f"apptainer-rank{{rank}}-restart{{restart}}.json").write_text(json.dumps(argv))
if not argv or argv[0] != "exec":
    sys.exit(f"apptainer stand-in: only 'exec' is used by rocmtrain, got {{argv[:1]}}")
i, pwd = 1, None
while argv[i].startswith("-"):
    opt = argv[i]
    if opt in ("--rocm", "--nv"):
        i += 1
    elif opt == "--bind":
        src = argv[i + 1].split(":")[0]
        if not os.path.exists(src):
            sys.exit(f"apptainer stand-in: bind source {{src!r}} does not exist")
        i += 2
    elif opt == "--pwd":
        pwd, i = argv[i + 1], i + 2
    else:
        sys.exit(f"apptainer stand-in: unknown option {{opt!r}}")
image, command = argv[i], argv[i + 1 :]
if not os.path.isfile(image):
    sys.exit(f"apptainer stand-in: image {{image!r}} not found")
if pwd:
    os.chdir(pwd)
os.execvp(command[0], command)
'''

_SRUN = '''#!{python}
"""Wrapper for srun without the pyxis plugin (see tests/launch/test_slurm_containers.py)."""
import json, os, shutil, sys
from pathlib import Path

argv = sys.argv[1:]
job = os.environ.get("SLURM_JOB_ID", "?")
restart = os.environ.get("SLURM_RESTART_COUNT", "0") or "0"
Path({log!r}, f"srun-{{job}}-restart{{restart}}.json").write_text(json.dumps(argv))
first = next((i for i, a in enumerate(argv) if not a.startswith("-")), len(argv))
rest = []
for a in argv[:first]:
    opt, _, value = a.partition("=")
    if opt == "--container-mounts":
        for m in value.split(","):
            src, _, dst = m.partition(":")
            if not os.path.exists(src) or not dst.startswith("/"):
                sys.exit(f"pyxis stand-in: mount {{m!r}} is not SRC:DST[:FLAGS] with SRC present")
    elif opt == "--container-workdir":
        rest.append(f"--chdir={{value}}")
    elif opt.startswith("--container-") and opt != "--container-image":
        sys.exit(f"pyxis stand-in: option {{opt}} is not used by rocmtrain")
    elif opt != "--container-image":
        rest.append(a)
here = os.path.dirname(os.path.abspath(__file__))
path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != here)
real = shutil.which("srun", path=path)
os.execv(real, [real, *rest, *argv[first:]])
'''


def _stand_in(tmp_path: Path, name: str, template: str) -> tuple[Path, Path]:
    """``tmp_path/bin/<name>`` from ``template``; returns (bin folder, its argv log folder)."""
    bindir, log = tmp_path / "bin", tmp_path / "standin-log"
    bindir.mkdir(exist_ok=True)
    log.mkdir(exist_ok=True)
    exe = bindir / name
    exe.write_text(template.format(python=sys.executable, log=str(log)))
    exe.chmod(0o755)
    return bindir, log


def _path_setup(bindir: Path) -> list[str]:
    return [f'export PATH={shlex.quote(str(bindir))}:"$PATH"']


def _probe_records(run_dir: Path) -> dict[tuple[int, int], dict]:
    return {
        (r["rank"], r["restart"]): r
        for r in (json.loads(p.read_text()) for p in run_dir.glob("probe-rank*-restart*.json"))
    }


def _assert_clean(tmp_path: Path) -> None:
    assert not list(tmp_path.rglob("CANARY*")) and not list(Path.cwd().glob("CANARY*"))


def test_apptainer_job_every_rank_gets_the_exact_argv(slurm_cluster, tmp_path: Path) -> None:
    """2 ranks; the hostile image path, mount and args arrive verbatim; exit 75 → requeue."""
    bindir, log = _stand_in(tmp_path, "apptainer", _APPTAINER)
    image = tmp_path / "img $(touch CANARY_I) `touch CANARY_J`; 'q\" rocm.sif"
    image.write_text("stand-in image")
    data = tmp_path / "data $(touch CANARY_D)"
    data.mkdir()
    mount = f"{data}:/data:ro"
    container = ContainerConfig(runtime="apptainer", image=str(image), mounts=[mount], gpu="rocm")
    job = submit_probe(
        tmp_path, [*HOSTILE_ARGS, "--requeue-once"], container=container, setup=_path_setup(bindir)
    )
    status = slurm.wait(job.job_id, timeout_s=240)
    out = Path(job.log_path).read_text()
    assert status.state == "COMPLETED" and status.exit_code == 0, (status, out)
    assert status.restarts == 1, out  # the rank's 75 came back through apptainer: requeued
    base, run_dir = str(tmp_path.resolve()), Path(job.run_dir)
    expected = [
        "exec",
        "--rocm",
        "--bind",
        base,
        "--bind",
        mount,
        "--pwd",
        base,
        str(image),
        sys.executable,
        "-m",
        "rocmtrain.launch.probe",
        *HOSTILE_ARGS,
        "--requeue-once",
        "trainer.num_nodes=2",
        "trainer.devices=1",
        f"run_dir={run_dir}",
    ]
    calls = sorted(p.name for p in log.glob("apptainer-*.json"))
    assert calls == [f"apptainer-rank{r}-restart{k}.json" for r in (0, 1) for k in (0, 1)], calls
    for name in calls:
        assert json.loads((log / name).read_text()) == expected, name
    records = _probe_records(run_dir)
    assert sorted(records) == [(0, 0), (0, 1), (1, 0), (1, 1)], sorted(records)
    for rec in records.values():
        assert rec["world_size"] == 2 and rec["allreduce"] == 3.0
        assert rec["argv"] == expected[expected.index("rocmtrain.launch.probe") + 1 :]
    _assert_clean(tmp_path)


def test_pyxis_job_srun_gets_the_container_options(slurm_cluster, tmp_path: Path) -> None:
    bindir, log = _stand_in(tmp_path, "srun", _SRUN)
    image = "registry.example#team/rocmtrain:rocm7.2 $(touch CANARY_P) `touch CANARY_Q`;'"
    data = tmp_path / "data `touch CANARY_E`"
    data.mkdir()
    mount = f"{data}:/data:ro"
    container = ContainerConfig(runtime="pyxis", image=image, mounts=[mount])
    job = submit_probe(tmp_path, HOSTILE_ARGS, container=container, setup=_path_setup(bindir))
    status = slurm.wait(job.job_id, timeout_s=240)
    out = Path(job.log_path).read_text()
    assert status.state == "COMPLETED" and status.exit_code == 0, (status, out)
    base, run_dir = str(tmp_path.resolve()), Path(job.run_dir)
    (call,) = log.glob("srun-*.json")
    srun_argv = json.loads(call.read_text())
    assert srun_argv[: srun_argv.index("bash")] == [
        "--kill-on-bad-exit=1",
        f"--container-image={image}",
        f"--container-mounts={base}:{base},{mount}",
        f"--container-workdir={base}",
    ]
    rank_command = [
        sys.executable,
        "-m",
        "rocmtrain.launch.probe",
        *HOSTILE_ARGS,
        "trainer.num_nodes=2",
        "trainer.devices=1",
        f"run_dir={run_dir}",
    ]
    assert srun_argv[-len(rank_command) :] == rank_command
    records = _probe_records(run_dir)
    assert sorted(records) == [(0, 0), (1, 0)], sorted(records)
    for rec in records.values():
        assert rec["world_size"] == 2 and rec["argv"] == rank_command[3:]
    _assert_clean(tmp_path)


def test_job_name_longer_than_a_file_name_runs(slurm_cluster, tmp_path: Path) -> None:
    """A 300-character cluster.job_name used to fail at job start with 'File name too long'."""
    name = "long-" + "x" * 295
    job = submit_probe(tmp_path, [], job_name=name)
    status = slurm.wait(job.job_id, timeout_s=180)
    log = Path(job.log_path)
    assert log.exists(), f"no log {log}: {status}"
    assert status.state == "COMPLETED" and status.exit_code == 0, (status, log.read_text())
    records = _probe_records(Path(job.run_dir))
    assert sorted(records) == [(0, 0), (1, 0)]
    assert all(rec["job_name"] == name for rec in records.values())  # Slurm kept the whole name
    assert len(Path(job.run_dir).name) <= 255 and len(log.name) <= 255
