"""Version checks against the pairing table in :mod:`rocmtrain.compat`: warn outside it, never fail.

The table (torch minor ↔ stable ROCm, fbgemm-gpu ↔ torch minor, the ROCm builds of each
fbgemm-gpu minor, the pinned stack) and its sources live in ``rocmtrain/compat.py``, which the
README's Install pins and the container files follow too. A row no published matrix backs
(``verified=False``) is shown, not warned on.
"""

from __future__ import annotations

from pathlib import Path

from rocmtrain import compat
from rocmtrain.diagnostics.checks.base import Check, GpuFacts, Inputs, TorchBuild, read_text

# kept under their old names for callers that import them from here
TORCH_STABLE_ROCM = compat.TORCH_STABLE_ROCM
FBGEMM_ROCM = compat.FBGEMM_ROCM
FBGEMM_DISTS = ("fbgemm-gpu", "fbgemm-gpu-cpu", "fbgemm-gpu-nightly", "fbgemm-gpu-genai")
#: distributions that provide ``import triton``, ROCm ones first: PyTorch's ROCm wheel index ships
#: Triton as ``triton-rocm`` for torch >= 2.10 (torch's wheel metadata: ``Requires-Dist:
#: triton-rocm``; e.g. torch 2.10.0+rocm7.1 pulls triton-rocm 3.6.0, invoke-ai/InvokeAI PR #9297)
#: and as ``pytorch-triton-rocm`` before; CUDA and CPU installs have ``triton``.
TRITON_DISTS = ("triton-rocm", "pytorch-triton-rocm", "triton", "pytorch-triton")

_mm = compat.minor


def _fmt(v: tuple[int, ...] | None) -> str:
    return ".".join(map(str, v)) if v else "?"


def _torch_rocm_check(torch_v: tuple[int, ...], hip_v: tuple[int, ...]) -> Check:
    tv = _mm(torch_v)
    expected = compat.stable_rocm(tv)
    ev = f"torch {_fmt(torch_v)} built with ROCm {_fmt(hip_v)}"
    if expected is None:
        return Check(
            "versions.torch_rocm",
            "warn",
            ev + "; torch release not in table",
            "see pytorch RELEASE.md for the ROCm this torch was released with",
        )
    if _mm(hip_v) != expected:
        return Check(
            "versions.torch_rocm",
            "warn",
            ev + f"; torch {_fmt(tv)} was released against ROCm {_fmt(expected)}",
            f"prefer the ROCm {_fmt(expected)} wheel from "
            "PyTorch's per-ROCm index (works, but is the less tested pairing)",
        )
    return Check("versions.torch_rocm", "ok", ev + " (the stable pairing)")


def _fbgemm_rocm_check(ev: str, fv: compat.MM, hip_v: tuple[int, ...], archs: list[str]) -> Check:
    """fbgemm-gpu on ROCm: its published ROCm builds and archs (an unverified row never warns)."""
    row = compat.fbgemm_rocm(fv)
    if row is None or not row.verified:
        why = (
            f"FBGEMM publishes no ROCm matrix for {_fmt(fv)}"
            if row is None
            else f"the ROCm matrix of {_fmt(fv)} is unverified: {compat.SOURCES[row.source]}"
        )
        return Check(
            "versions.fbgemm_gpu",
            "ok",
            ev + f" on ROCm {_fmt(hip_v)} ({why}; ROCm pairing not checked)",
        )
    if _mm(hip_v) not in compat.rocm_minors(row):
        ok_rocm = ", ".join(_fmt(r) for r in row.rocm)
        return Check(
            "versions.fbgemm_gpu",
            "warn",
            ev + f" on ROCm {_fmt(hip_v)}",
            f"fbgemm-gpu {_fmt(fv)} is published for ROCm {ok_rocm} only "
            f"({compat.SOURCES[row.source]}); install torch and fbgemm-gpu from one of those "
            f"indexes, or the pinned stack (torch {compat.PINNED.torch}, ROCm "
            f"{compat.PINNED.rocm}, fbgemm-gpu {compat.PINNED.fbgemm_gpu})",
        )
    odd = [a for a in archs if a not in row.archs]
    if odd:
        return Check(
            "versions.fbgemm_gpu",
            "warn",
            ev + f"; GPU arch {archs}",
            f"fbgemm-gpu {_fmt(fv)} ROCm builds target {', '.join(row.archs)}",
        )
    return Check("versions.fbgemm_gpu", "ok", ev)


def _fbgemm_check(
    torch_v: tuple[int, ...],
    hip_v: tuple[int, ...] | None,
    fbgemm: tuple[str, str] | None,
    archs: list[str],
) -> Check:
    if fbgemm is None:
        return Check(
            "versions.fbgemm_gpu",
            "warn",
            "fbgemm-gpu not installed",
            "install fbgemm-gpu (ROCm/CUDA: PyTorch's wheel index; CPU: fbgemm-gpu-cpu)",
        )
    dist, ver = fbgemm
    fv = _mm(ver)
    want = compat.fbgemm_for_torch(_mm(torch_v))
    ev = f"{dist} {ver} with torch {_fmt(torch_v)}"
    if fv is None or fv != want:
        return Check(
            "versions.fbgemm_gpu",
            "warn",
            ev + f"; expected {_fmt(want)}.x",
            "install the fbgemm-gpu built for this torch minor (ABI is per torch minor)",
        )
    if hip_v is not None:
        return _fbgemm_rocm_check(ev, fv, hip_v, archs)
    return Check("versions.fbgemm_gpu", "ok", ev)


def _torchrec_check(torchrec: str | None, fbgemm: tuple[str, str] | None) -> Check:
    if torchrec is None:
        return Check(
            "versions.torchrec",
            "warn",
            "torchrec not installed",
            "install torchrec matching fbgemm-gpu (--no-deps on ROCm)",
        )
    rv, fv = _mm(torchrec), _mm(fbgemm[1]) if fbgemm else None
    ev = f"torchrec {torchrec} with fbgemm-gpu {fbgemm[1] if fbgemm else '(none)'}"
    if fv is not None and rv != fv:
        return Check(
            "versions.torchrec",
            "warn",
            ev,
            "torchrec and fbgemm-gpu minors must match (e.g. 1.8 ↔ 1.8)",
        )
    return Check("versions.torchrec", "ok", ev)


def compat_checks(
    torch_v: tuple[int, ...],
    *,
    hip_v: tuple[int, ...] | None,
    fbgemm: tuple[str, str] | None,
    torchrec: str | None,
    archs: list[str],
) -> list[Check]:
    """Pure table lookups; ``fbgemm`` = (distribution, version); ``hip_v`` is the ROCm release
    (:attr:`TorchBuild.rocm`), None off ROCm."""
    out = [_torch_rocm_check(torch_v, hip_v)] if hip_v is not None else []
    out.append(_fbgemm_check(torch_v, hip_v, fbgemm, archs))
    out.append(_torchrec_check(torchrec, fbgemm))
    return out


def _installed_rocm(inputs: Inputs) -> str | None:
    root = Path(inputs.environ.get("ROCM_PATH", "/opt/rocm"))
    text = read_text(root / ".info" / "version")
    return text.strip() if text else None


def check_versions(facts: GpuFacts, inputs: Inputs) -> list[Check]:
    build = inputs.torch_build or TorchBuild.live()
    pkg = inputs.package_version
    fb = next(((d, v) for d in FBGEMM_DISTS if (v := pkg(d))), None)
    archs = sorted({d.gfx_arch for d in facts.devices if d.gfx_arch})
    out = compat_checks(
        build.version, hip_v=build.rocm, fbgemm=fb, torchrec=pkg("torchrec"), archs=archs
    )
    if build.cuda is not None and not build.is_rocm:
        out.append(
            Check(
                "versions.torch_cuda",
                "ok",
                f"torch {_fmt(build.version)} built with CUDA {build.cuda}",
            )
        )
    tri = next(((d, v) for d in TRITON_DISTS if (v := pkg(d))), None)
    out.append(
        Check("versions.triton", "ok", f"{tri[0]} {tri[1]}")
        if tri
        else Check(
            "versions.triton",
            "warn",
            "triton not installed (looked for " + ", ".join(TRITON_DISTS) + ")",
            "kernel=triton needs triton (ROCm: triton-rocm for torch >= 2.10, "
            "pytorch-triton-rocm before, from PyTorch's per-ROCm wheel index)",
        )
    )
    nv = build.nccl
    lib = "RCCL" if build.is_rocm else "NCCL"
    if nv:
        out.append(
            Check(
                "versions.rccl" if build.is_rocm else "versions.nccl",
                "ok",
                f"{lib} {_fmt(nv)} (torch.cuda.nccl.version())",
            )
        )
    elif build.is_rocm or build.cuda is not None:
        out.append(
            Check(
                "versions.rccl",
                "warn",
                f"torch reports no {lib}",
                "multi-GPU runs need a torch build with RCCL/NCCL",
            )
        )
    else:
        out.append(Check("versions.rccl", "skip", "CPU build of torch: gloo only (no RCCL/NCCL)"))
    installed = _installed_rocm(inputs)
    rocm = build.rocm
    if installed and rocm and _mm(installed) != _mm(rocm):
        out.append(
            Check(
                "versions.rocm_install",
                "warn",
                f"system ROCm {installed}, torch built with ROCm {_fmt(rocm)}",
                "torch ships its own HIP user-space; keep the driver/ROCm ≥ the torch build",
            )
        )
    elif installed:
        out.append(Check("versions.rocm_install", "ok", f"system ROCm {installed}"))
    return out


CHECKS = (check_versions,)
