"""cluster.container in the batch script (no Slurm cluster needed): each runtime's line, its
quoting, the GPU flag, validation, and job names too long for a file name.

Real bash parses the rendered srun line (``srun`` is a shell function printing its argv as JSON);
the same lines run through a real Slurm in test_slurm_containers.py.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from rocmtrain.config import ConfigError
from rocmtrain.config.cluster import ClusterConfig, ContainerConfig
from rocmtrain.config.schema import RunConfig
from rocmtrain.launch.script import MAX_NAME_IN_FILE, file_slug, render
from rocmtrain.launch.slurm import build_spec

#: each would create a CANARY file if a shell evaluated it
HOSTILE_IMAGE = "/img/$(touch CANARY1) `touch CANARY2`;x 'q\" rocm.sif"
HOSTILE_MOUNT = "/data/$(touch CANARY3) a;b:/mnt/in'side:ro"
ARGS = ["$(touch CANARY4)", "x; touch CANARY5", "a b"]


def _cfg(tmp_path: Path, recipe: str = "dlrm_cpu", accelerator: str = "cpu", **container):
    cfg = RunConfig()
    cfg.recipe, cfg.trainer.accelerator = recipe, accelerator
    cfg.cluster = ClusterConfig(
        kind="slurm",
        chdir=str(tmp_path),
        nodes=2,
        ntasks_per_node=1,
        container=ContainerConfig(**container),
    )
    return cfg


def _srun_argv(srun_line: str, tmp_path: Path) -> list[str]:
    """argv srun gets from the rendered line, as bash parses it."""
    out = tmp_path / "argv.json"
    dump = "import json,sys; json.dump(sys.argv[2:], open(sys.argv[1], 'w'))"
    script = (
        f'srun() {{ {shlex.quote(sys.executable)} -c {shlex.quote(dump)} {shlex.quote(str(out))} "$@"; }}\n'
        f"RUN_DIR=/r/job-7\nREQUEUE_FLAG=/r/job-7/.requeue\n{srun_line}\n"
    )
    subprocess.run(["bash", "-c", script], cwd=tmp_path, check=True)
    return json.loads(out.read_text())


def _rank_argv(srun_argv: list[str]) -> list[str]:
    """What the per-rank wrapper runs: everything after ``bash -c <wrapper> rocmtrain-rank FLAG``."""
    i = srun_argv.index("rocmtrain-rank")
    assert srun_argv[i - 3 : i - 1] == ["bash", "-c"] and srun_argv[i + 1] == "/r/job-7/.requeue"
    return srun_argv[i + 2 :]


def test_apptainer_line_quoted_and_exact(tmp_path: Path) -> None:
    cfg = _cfg(
        tmp_path, image=HOSTILE_IMAGE, runtime="apptainer", mounts=[HOSTILE_MOUNT], gpu="rocm"
    )
    job = render(build_spec(cfg, ARGS, workdir=tmp_path))
    subprocess.run(["bash", "-n"], input=job.text, text=True, check=True)
    base = str(tmp_path.resolve())
    argv = _srun_argv(job.srun_line, tmp_path)
    assert argv[:1] == ["--kill-on-bad-exit=1"]  # no container options on srun itself
    assert _rank_argv(argv) == [
        "apptainer",
        "exec",
        "--rocm",
        "--bind",
        base,
        "--bind",
        HOSTILE_MOUNT,
        "--pwd",
        base,
        HOSTILE_IMAGE,
        "python",  # the image's python, not the submitting venv's
        "-m",
        "rocmtrain",
        *ARGS,
        "trainer.num_nodes=2",
        "trainer.devices=1",
        "run_dir=/r/job-7",
    ]
    assert not list(tmp_path.glob("CANARY*"))


def test_pyxis_options_quoted_and_exact(tmp_path: Path) -> None:
    image = "registry.example#team/rocmtrain:rocm7.2 $(touch CANARY6)"
    mount = "/data/`touch CANARY7`:/data:ro"
    cfg = _cfg(tmp_path, image=image, runtime="pyxis", mounts=[mount])
    cfg.cluster.srun_args = ["--label"]
    job = render(build_spec(cfg, ARGS, workdir=tmp_path))
    base = str(tmp_path.resolve())
    argv = _srun_argv(job.srun_line, tmp_path)
    assert argv[: argv.index("bash")] == [
        "--kill-on-bad-exit=1",
        "--label",
        f"--container-image={image}",
        f"--container-mounts={base}:{base},{mount}",
        f"--container-workdir={base}",
    ]
    assert _rank_argv(argv) == [
        "python",
        "-m",
        "rocmtrain",
        *ARGS,
        "trainer.num_nodes=2",
        "trainer.devices=1",
        "run_dir=/r/job-7",
    ]
    assert not list(tmp_path.glob("CANARY*"))


@pytest.mark.parametrize(
    ("recipe", "accelerator", "gpu", "flag"),
    [
        ("dlrm_cpu", "cpu", "auto", []),
        ("dlrm_mi300", "gpu", "auto", ["--rocm"]),
        ("dlrm_mi250", "auto", "auto", ["--rocm"]),
        ("dlrm_dcnv2_h200", "gpu", "auto", ["--nv"]),
        ("dlrm_mi300", "gpu", "nvidia", ["--nv"]),
        ("dlrm_mi300", "gpu", "none", []),
    ],
)
def test_apptainer_gpu_flag(tmp_path: Path, recipe, accelerator, gpu, flag) -> None:
    cfg = _cfg(tmp_path, recipe, accelerator, runtime="apptainer", image="/i.sif", gpu=gpu)
    argv = _rank_argv(_srun_argv(render(build_spec(cfg, [], workdir=tmp_path)).srun_line, tmp_path))
    assert argv[: 2 + len(flag) + 1] == ["apptainer", "exec", *flag, "--bind"]


def test_no_container_keeps_the_host_python_and_explicit_python_wins(tmp_path: Path) -> None:
    plain = _rank_argv(
        _srun_argv(render(build_spec(_cfg(tmp_path), [], workdir=tmp_path)).srun_line, tmp_path)
    )
    assert plain[0] == sys.executable
    cfg = _cfg(tmp_path, runtime="apptainer", image="/i.sif")
    cfg.cluster.python = "/opt/rocmtrain/venv/bin/python"
    argv = _rank_argv(_srun_argv(render(build_spec(cfg, [], workdir=tmp_path)).srun_line, tmp_path))
    assert argv[argv.index("/i.sif") + 1] == "/opt/rocmtrain/venv/bin/python"


def test_run_folder_outside_the_job_folder_is_mounted(tmp_path: Path) -> None:
    elsewhere = tmp_path.parent / f"{tmp_path.name}-runs"
    cfg = _cfg(tmp_path / "job", runtime="pyxis", image="img:1")
    cfg.cluster.run_root = str(elsewhere)
    spec = build_spec(cfg, [], workdir=tmp_path)
    assert spec.container is not None
    assert list(spec.container.mounts) == [
        str((tmp_path / "job").resolve()),
        str(elsewhere.resolve()),
    ]


def test_job_folder_a_mount_list_cannot_carry_is_refused(tmp_path: Path) -> None:
    odd = tmp_path / "a,b"
    odd.mkdir()
    with pytest.raises(ValueError, match="cluster.chdir"):
        build_spec(_cfg(odd, runtime="pyxis", image="img:1"), [], workdir=odd)


@pytest.mark.parametrize(
    ("container", "field", "match"),
    [
        ({"runtime": "docker"}, "cluster.container.runtime", "none, apptainer, pyxis"),
        ({"runtime": "apptainer"}, "cluster.container.image", "needs an image"),
        ({"runtime": "pyxis", "image": "  "}, "cluster.container.image", "needs an image"),
        ({"image": "/i.sif"}, "cluster.container.image", "runtime=apptainer or pyxis"),
        ({"runtime": "apptainer", "image": "a\nb"}, "cluster.container.image", "newline"),
        (
            {"runtime": "apptainer", "image": "/i", "mounts": ["data"]},
            "cluster.container.mounts",
            "absolute",
        ),
        (
            {"runtime": "apptainer", "image": "/i", "mounts": ["/d:rel"]},
            "cluster.container.mounts",
            "absolute",
        ),
        (
            {"runtime": "apptainer", "image": "/i", "mounts": ["/a:/b:ro:x"]},
            "cluster.container.mounts",
            "/data:/mnt/data",
        ),
        (
            {"runtime": "pyxis", "image": "i", "mounts": ["/a,/b"]},
            "cluster.container.mounts",
            "','",
        ),
        (
            {"runtime": "apptainer", "image": "/i", "gpu": "amd"},
            "cluster.container.gpu",
            "rocm, nvidia",
        ),
    ],
)
def test_container_config_errors_name_field_value_and_fix(container, field, match) -> None:
    with pytest.raises(ConfigError, match=match) as err:  # at construction
        ClusterConfig(kind="slurm", container=ContainerConfig(**container))
    assert err.value.field == field and str(err.value).startswith(f"{field}=")


def test_long_job_name_fits_file_names(tmp_path: Path) -> None:
    """A 300-character name: --job-name keeps it, the log/run-folder/script names are capped."""
    name = "n" * 300
    spec = build_spec(_named(tmp_path, name), [], workdir=tmp_path)
    job = render(spec)
    assert ("--job-name", name) in job.directives
    out_name = Path(spec.output).name
    run_name = Path(spec.run_dir_prefix).name + "-4294967295"
    assert len(out_name.replace("%j", "4294967295").encode()) <= 255
    assert len((run_name + "-20261201-140000-4194304.sbatch").encode()) <= 255
    # the file system takes them (this is where "File name too long" came from)
    (tmp_path / "runs" / run_name).mkdir(parents=True)
    (tmp_path / "runs" / out_name.replace("%j", "4294967295")).write_text("")
    # two long names with a common start still get different folders
    other = Path(build_spec(_named(tmp_path, name + "x"), [], workdir=tmp_path).run_dir_prefix)
    assert other.name != Path(spec.run_dir_prefix).name
    assert len(file_slug(name)) == MAX_NAME_IN_FILE and file_slug("short") == "short"


def _named(tmp_path: Path, name: str) -> RunConfig:
    cfg = _cfg(tmp_path)
    cfg.cluster.job_name = name
    return cfg


def test_dry_run_cli_prints_the_apptainer_line(tmp_path: Path) -> None:
    """The command of the README: prints `apptainer exec --rocm ...` in the srun line, exit 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PATH"] = "/usr/bin/nonexistent"  # nothing can be submitted
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocmtrain",
            "recipe=dlrm_mi300",
            "cluster=slurm",
            "cluster.container.runtime=apptainer",
            "cluster.container.image=/shared/rocmtrain.sif",
            "dry_run=true",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    srun = proc.stdout.split("srun line:\n", 1)[1].splitlines()[0].strip()
    base = str(tmp_path.resolve())
    assert (
        f'rocmtrain-rank "$REQUEUE_FLAG" apptainer exec --rocm --bind {base} --pwd {base} '
        "/shared/rocmtrain.sif python -m rocmtrain recipe=dlrm_mi300 "
    ) in srun
    assert "container: apptainer image '/shared/rocmtrain.sif'" in proc.stdout


def test_example_cluster_config_composes_to_the_apptainer_line(tmp_path: Path) -> None:
    """configs/cluster/mi300x_apptainer.yaml + an image: each rank is `apptainer exec --rocm`."""
    from hydra import compose, initialize_config_dir

    from rocmtrain.config.schema import configs_dir, register_configs, to_run_config

    register_configs()
    overrides = [
        "recipe=dlrm_mi300",
        "cluster=mi300x_apptainer",
        "cluster.container.image=/shared/rocmtrain.sif",
        "run_dir=r",
    ]
    with initialize_config_dir(config_dir=str(configs_dir()), version_base="1.3"):
        cfg = to_run_config(compose("rocmtrain", overrides=overrides))
    cfg.cluster.validate()
    argv = _rank_argv(_srun_argv(render(build_spec(cfg, [], workdir=tmp_path)).srun_line, tmp_path))
    base = str(tmp_path.resolve())
    assert argv[:8] == [
        "apptainer",
        "exec",
        "--rocm",
        "--bind",
        base,
        "--pwd",
        base,
        "/shared/rocmtrain.sif",
    ]
    assert argv[8:11] == ["python", "-m", "rocmtrain"]
