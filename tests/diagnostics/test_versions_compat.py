"""The doctor's version check reads rocmtrain/compat.py: verified rows warn, unverified ones do not.

The fbgemm-gpu rows are compared with FBGEMM's own table (a recorded copy of ``Releases.rst``), and
the Triton / ROCm-version checks run on a recorded ``collect_env`` of a ROCm install.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from rocmtrain import compat, platform
from rocmtrain.comms import rccl
from rocmtrain.diagnostics.checks import versions
from rocmtrain.diagnostics.checks.base import GpuFacts, Inputs, TorchBuild
from rocmtrain.diagnostics.checks.versions import check_versions, compat_checks


def _fbgemm(torch_v, hip_v, fb, archs=()):
    checks = compat_checks(
        torch_v, hip_v=hip_v, fbgemm=("fbgemm-gpu", fb), torchrec=fb, archs=list(archs)
    )
    return next(c for c in checks if c.name == "versions.fbgemm_gpu")


def test_the_check_has_no_table_of_its_own() -> None:
    assert versions.TORCH_STABLE_ROCM is compat.TORCH_STABLE_ROCM
    assert versions.FBGEMM_ROCM is compat.FBGEMM_ROCM


def _releases_table(fixtures_dir: Path) -> dict[compat.MM, tuple[compat.MM, tuple, tuple]]:
    """FBGEMM's compatibility table: release minor -> (torch minor, ROCm releases, ROCm archs).

    Each row of the grid table spans several text lines; a ``+---`` line ends a row."""
    text = (fixtures_dir / "fbgemm" / "Releases_compatibility_table.rst").read_text()
    rows, cells = {}, None
    for line in text.splitlines():
        if line.startswith("|"):
            parts = [p.strip() for p in line.strip("|").split("|")]
            cells = (
                parts
                if cells is None
                else [f"{a} {b}".strip() for a, b in zip(cells, parts, strict=True)]
            )
        elif line.startswith("+") and cells is not None:
            if re.match(r"\d+\.\d+\.\d+$", cells[0]):
                rocm = tuple(tuple(map(int, v.split("."))) for v in re.findall(r"[\d.]+", cells[5]))
                archs = tuple(re.findall(r"gfx\w+", cells[6]))
                rows[compat.minor(cells[0])] = (compat.minor(cells[1].rstrip(".x")), rocm, archs)
            cells = None
    return rows


def test_fbgemm_rows_are_fbgemm_s_published_table(fixtures_dir: Path) -> None:
    """Every fbgemm-gpu >= 1.0 row of compat.py states what FBGEMM's Releases.rst states."""
    table = _releases_table(fixtures_dir)
    assert table[(1, 2)] == ((2, 7), ((6, 2, 4), (6, 3)), ("gfx908", "gfx90a", "gfx942"))
    for fb, (torch_mm, rocm, archs) in table.items():
        if fb < (1, 0):
            continue  # older than anything rocmtrain runs with
        row = compat.fbgemm_rocm(fb)
        assert row is not None, f"fbgemm-gpu {fb}: FBGEMM publishes a ROCm row, compat.py has none"
        assert (row.rocm, row.archs) == (rocm, archs), fb
        assert compat.FBGEMM_TORCH[fb] == torch_mm, fb


def test_fbgemm_1_2_is_rocm_6_2_4_and_6_3() -> None:
    assert _fbgemm((2, 7, 0), (6, 3), "1.2.0", ["gfx90a"]).status == "ok"
    c = _fbgemm((2, 7, 0), (6, 1), "1.2.0", ["gfx90a"])
    assert c.status == "warn" and "ROCm 6.2.4, 6.3 only" in c.fix


def test_fbgemm_1_3_has_a_row_torch_2_8_rocm_6_3_6_4() -> None:
    assert compat.fbgemm_for_torch((2, 8)) == (1, 3)
    c = _fbgemm((2, 8, 0), (6, 4), "1.3.0", ["gfx942"])
    assert c.status == "ok" and "not checked" not in c.evidence
    c = _fbgemm((2, 8, 0), (7, 0), "1.3.0", ["gfx942"])
    assert c.status == "warn" and "ROCm 6.3, 6.4 only" in c.fix
    c = _fbgemm((2, 8, 0), (6, 4), "1.3.0", ["gfx950"])
    assert c.status == "warn" and "gfx908, gfx90a, gfx942" in c.fix


def test_fbgemm_1_6_on_rocm_7_2_is_not_warned_on() -> None:
    """The docs say ROCm 7.0/7.1, the release pipeline built 7.1/7.2: the row is unverified."""
    assert not compat.fbgemm_rocm((1, 6)).verified
    c = _fbgemm((2, 11, 0), (7, 2), "1.6.0", ["gfx942"])
    assert c.status == "ok" and "not checked" in c.evidence
    checks = compat_checks(
        (2, 11, 0), hip_v=(7, 2), fbgemm=("fbgemm-gpu", "1.6.0"), torchrec="1.6.1", archs=[]
    )
    assert {c.status for c in checks} == {"ok"}


def test_unverified_or_missing_rows_do_not_warn() -> None:
    assert not compat.fbgemm_rocm((1, 7)).verified
    c = _fbgemm((2, 12, 0), (7, 2), "1.7.0", ["gfx942"])
    assert c.status == "ok" and "not checked" in c.evidence
    c = _fbgemm((2, 13, 0), (7, 2, 1), "1.8.0", ["gfx1100"])  # no published 1.8 ROCm matrix
    assert c.status == "ok" and "not checked" in c.evidence


def test_verified_row_checks_the_arch() -> None:
    assert _fbgemm((2, 10, 0), (7, 1), "1.5.0", ["gfx942"]).status == "ok"
    c = _fbgemm((2, 10, 0), (7, 1), "1.5.0", ["gfx1100"])
    assert c.status == "warn" and "gfx950" in c.fix


def test_fbgemm_for_torch_uses_the_table_then_the_pattern() -> None:
    assert compat.fbgemm_for_torch((2, 13)) == (1, 8)
    assert compat.fbgemm_for_torch((2, 16)) == (1, 11)  # 1.x <-> 2.(x+5)
    assert compat.fbgemm_for_torch((1, 13)) is None
    assert compat.minor("2.13.0+rocm7.2") == (2, 13) and compat.minor("x") is None


def _collect_env(fixtures_dir: Path) -> tuple[TorchBuild, dict[str, str]]:
    """torch build and pip list of a recorded ``python -m torch.utils.collect_env`` output."""
    text = (fixtures_dir / "rocm_env" / "rocm7.13_torch2.13_collect_env.txt").read_text()
    torch_v = re.search(r"^PyTorch version: (\S+)", text, re.M).group(1)
    hip = re.search(r"^ROCM used to build PyTorch: (\S+)", text, re.M).group(1)
    pip = dict(re.findall(r"^\[pip3\] ([\w.-]+)==(\S+)", text, re.M))
    hip_v = tuple(map(int, hip.split(".")[:3]))
    build = TorchBuild(
        compat.minor(torch_v) + (0,), hip=hip_v, rocm=hip_v
    )  # collect_env names no RCCL
    return build, pip


def _triton_check(build: TorchBuild, pip: dict[str, str], tmp_path: Path):
    facts = GpuFacts("rocm", [], [], None, {}, [])
    inputs = Inputs(
        environ={"ROCM_PATH": str(tmp_path)}, torch_build=build, package_version=pip.get, live=False
    )
    return {c.name: c for c in check_versions(facts, inputs)}["versions.triton"]


def test_doctor_reports_triton_rocm_ok_on_a_recorded_rocm_install(
    fixtures_dir: Path, tmp_path: Path
) -> None:
    build, pip = _collect_env(fixtures_dir)
    assert pip["triton-rocm"] == "3.7.0"
    c = _triton_check(build, pip, tmp_path)
    assert c.status == "ok" and c.evidence == "triton-rocm 3.7.0"
    # an install from PyTorch's index alone has triton-rocm and no `triton` distribution
    only_index = {k: v for k, v in pip.items() if k != "triton"}
    c = _triton_check(build, only_index, tmp_path)
    assert c.status == "ok" and c.evidence == "triton-rocm 3.7.0"
    no_triton = {k: v for k, v in only_index.items() if not k.startswith("triton")}
    c = _triton_check(build, no_triton, tmp_path)
    assert c.status == "warn" and "triton-rocm" in c.fix


@pytest.mark.parametrize("rocm_attr", [True, False], ids=["torch.version.rocm", "hip only"])
def test_rocm_version_comes_from_torch_version_rocm(monkeypatch, rocm_attr: bool) -> None:
    """From ROCm 10 the HIP number (7.15) is not the ROCm release: read torch.version.rocm first."""
    monkeypatch.setattr(torch.version, "hip", "7.15.60001-abcdef", raising=False)
    if rocm_attr:
        monkeypatch.setattr(torch.version, "rocm", "10.0.0", raising=False)
    else:
        monkeypatch.delattr(torch.version, "rocm", raising=False)
    want = (10, 0, 0) if rocm_attr else (7, 15, 60001)
    assert platform.hip_version() == (7, 15, 60001)
    assert platform.rocm_version() == want
    assert rccl._rocm_release() == want[:2]
    assert TorchBuild.live().rocm == want
