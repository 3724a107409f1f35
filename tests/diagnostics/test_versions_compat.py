"""The doctor's version check reads rocmtrain/compat.py: verified rows warn, unverified ones do not."""

from __future__ import annotations

from rocmtrain import compat
from rocmtrain.diagnostics.checks import versions
from rocmtrain.diagnostics.checks.versions import compat_checks


def _fbgemm(torch_v, hip_v, fb, archs=()):
    checks = compat_checks(
        torch_v, hip_v=hip_v, fbgemm=("fbgemm-gpu", fb), torchrec=fb, archs=list(archs)
    )
    return next(c for c in checks if c.name == "versions.fbgemm_gpu")


def test_the_check_has_no_table_of_its_own() -> None:
    assert versions.TORCH_STABLE_ROCM is compat.TORCH_STABLE_ROCM
    assert versions.FBGEMM_ROCM is compat.FBGEMM_ROCM


def test_fbgemm_1_6_on_rocm_7_2_warns_with_the_source() -> None:
    """FBGEMM 1.6 has 1.5's matrix (ROCm 7.0/7.1): torch 2.11's ROCm 7.2 is outside it."""
    assert compat.fbgemm_rocm((1, 6)).verified
    c = _fbgemm((2, 11, 0), (7, 2), "1.6.0")
    assert c.status == "warn" and "ROCm 7.0, 7.1 only" in c.fix and "PR 5503" in c.fix
    assert _fbgemm((2, 11, 0), (7, 1), "1.6.0").status == "ok"


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
