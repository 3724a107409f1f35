"""The wheel ships recipes/ and configs/: ``pip install`` into a fresh venv, then run
``python -m rocmtrain recipe=...`` from another directory (no source checkout on the path).

The venv reuses the project venv's third-party packages through a ``.pth`` line (torch etc. are
not reinstalled); rocmtrain itself is built and installed for real (``--no-deps
--no-build-isolation``), and the editable install's hooks are not active in the new venv.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_wheel_install_runs_recipes_from_elsewhere(tmp_path):
    venv = tmp_path / "venv"
    assert (
        _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path).returncode == 0
    )
    py = venv / "bin" / "python"
    site = _run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path
    )
    Path(site.stdout.strip(), "_project_deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    pip = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            str(REPO),
        ],
        tmp_path,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run(
        [
            str(py),
            "-c",
            "import rocmtrain.config.schema as s; print(s.package_root()); "
            "print(s.available_recipes())",
        ],
        elsewhere,
    )
    root, recipes = where.stdout.strip().splitlines()
    assert root.startswith(str(venv)) and root.endswith("rocmtrain/_conf"), where.stdout
    assert "dlrm_mi300" in recipes and "dlrm_cpu" in recipes
    dry = _run(
        [
            str(py),
            "-m",
            "rocmtrain",
            "recipe=dlrm_cpu",
            "dry_run=true",
            "trainer.devices=4",
            f"run_dir={tmp_path}/run",
        ],
        elsewhere,
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "world size      4 =" in dry.stdout and "t_cat_7" in dry.stdout
