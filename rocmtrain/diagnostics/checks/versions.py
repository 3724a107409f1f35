"""Version checks against the compatibility table (ROCM_FACTS §7): warn outside it, never fail.

Table (pytorch RELEASE.md, FBGEMM release notes):

- torch minor → the stable ROCm of its release: 2.6→6.2, 2.7→6.3, 2.8→6.4, 2.9→6.4, 2.10→7.1,
  2.11–2.13→7.2, 2.14→7.14.
- fbgemm-gpu(-cpu) and torchrec minors follow the torch minor: torch 2.13 ↔ fbgemm-gpu 1.8 ↔
  torchrec 1.8; torch 2.11 ↔ 1.6 ↔ 1.6.1 (fbgemm 1.x pairs with torch 2.(x+5)).
- FBGEMM 1.5/1.6 on ROCm: ROCm 7.0/7.1, archs gfx908/gfx90a/gfx942/gfx950.
"""

from __future__ import annotations

from pathlib import Path

from rocmtrain import platform
from rocmtrain.diagnostics.checks.base import Check, GpuFacts, Inputs, read_text

TORCH_STABLE_ROCM: dict[tuple[int, int], tuple[int, int]] = {
    (2, 6): (6, 2),
    (2, 7): (6, 3),
    (2, 8): (6, 4),
    (2, 9): (6, 4),
    (2, 10): (7, 1),
    (2, 11): (7, 2),
    (2, 12): (7, 2),
    (2, 13): (7, 2),
    (2, 14): (7, 14),
}
FBGEMM_ROCM: dict[tuple[int, int], set[tuple[int, int]]] = {
    (1, 5): {(7, 0), (7, 1)},
    (1, 6): {(7, 0), (7, 1)},
}
FBGEMM_ROCM_ARCHS = ("gfx908", "gfx90a", "gfx942", "gfx950")
FBGEMM_DISTS = ("fbgemm-gpu", "fbgemm-gpu-cpu", "fbgemm-gpu-nightly", "fbgemm-gpu-genai")
TRITON_DISTS = ("pytorch-triton-rocm", "triton", "pytorch-triton")


def _mm(version: str | tuple[int, ...] | None) -> tuple[int, int] | None:
    if version is None:
        return None
    if isinstance(version, str):
        parts = version.split("+")[0].split(".")
        try:
            return int(parts[0]), int(parts[1])
        except (IndexError, ValueError):
            return None
    return (version[0], version[1]) if len(version) >= 2 else None


def _fmt(v: tuple[int, ...] | None) -> str:
    return ".".join(map(str, v)) if v else "?"


def compat_checks(
    torch_v: tuple[int, ...],
    *,
    hip_v: tuple[int, ...] | None,
    fbgemm: tuple[str, str] | None,
    torchrec: str | None,
    archs: list[str],
) -> list[Check]:
    """Pure table lookups; ``fbgemm`` = (distribution, version)."""
    out: list[Check] = []
    tv = _mm(torch_v)
    if hip_v is not None:
        expected = TORCH_STABLE_ROCM.get(tv) if tv else None
        ev = f"torch {_fmt(torch_v)} built with ROCm/HIP {_fmt(hip_v)}"
        if expected is None:
            out.append(
                Check(
                    "versions.torch_rocm",
                    "warn",
                    ev + "; torch release not in table",
                    "see pytorch RELEASE.md for the ROCm this torch was released with",
                )
            )
        elif _mm(hip_v) != expected:
            out.append(
                Check(
                    "versions.torch_rocm",
                    "warn",
                    ev + f"; torch {tv[0]}.{tv[1]} was released against ROCm {_fmt(expected)}",
                    f"prefer the ROCm {_fmt(expected)} wheel from "
                    "PyTorch's per-ROCm index (works, but is the less tested pairing)",
                )
            )
        else:
            out.append(Check("versions.torch_rocm", "ok", ev + " (the stable pairing)"))
    if fbgemm is None:
        out.append(
            Check(
                "versions.fbgemm_gpu",
                "warn",
                "fbgemm-gpu not installed",
                "install fbgemm-gpu (ROCm/CUDA: PyTorch's wheel index; CPU: fbgemm-gpu-cpu)",
            )
        )
    else:
        dist, ver = fbgemm
        fv = _mm(ver)
        want = (1, tv[1] - 5) if tv and tv[0] == 2 else None
        ev = f"{dist} {ver} with torch {_fmt(torch_v)}"
        if fv != want:
            out.append(
                Check(
                    "versions.fbgemm_gpu",
                    "warn",
                    ev + f"; expected 1.{want[1] if want else '?'}.x",
                    "install the fbgemm-gpu built for this torch minor (ABI is per torch minor)",
                )
            )
        elif hip_v is not None and fv in FBGEMM_ROCM and _mm(hip_v) not in FBGEMM_ROCM[fv]:
            ok_rocm = ", ".join(_fmt(r) for r in sorted(FBGEMM_ROCM[fv]))
            out.append(
                Check(
                    "versions.fbgemm_gpu",
                    "warn",
                    ev + f" on ROCm {_fmt(hip_v)}",
                    f"fbgemm-gpu {_fmt(fv)} is released for ROCm {ok_rocm}",
                )
            )
        elif hip_v is not None and any(a not in FBGEMM_ROCM_ARCHS for a in archs):
            out.append(
                Check(
                    "versions.fbgemm_gpu",
                    "warn",
                    ev + f"; GPU arch {archs}",
                    f"fbgemm-gpu ROCm builds target {', '.join(FBGEMM_ROCM_ARCHS)}",
                )
            )
        else:
            out.append(Check("versions.fbgemm_gpu", "ok", ev))
    if torchrec is None:
        out.append(
            Check(
                "versions.torchrec",
                "warn",
                "torchrec not installed",
                "install torchrec matching fbgemm-gpu (--no-deps on ROCm)",
            )
        )
    else:
        rv, fv = _mm(torchrec), _mm(fbgemm[1]) if fbgemm else None
        ev = f"torchrec {torchrec} with fbgemm-gpu {fbgemm[1] if fbgemm else '(none)'}"
        if fv is not None and rv != fv:
            out.append(
                Check(
                    "versions.torchrec",
                    "warn",
                    ev,
                    "torchrec and fbgemm-gpu minors must match (e.g. 1.8 ↔ 1.8)",
                )
            )
        else:
            out.append(Check("versions.torchrec", "ok", ev))
    return out


def _installed_rocm(inputs: Inputs) -> str | None:
    root = Path(inputs.environ.get("ROCM_PATH", "/opt/rocm"))
    text = read_text(root / ".info" / "version")
    return text.strip() if text else None


def check_versions(facts: GpuFacts, inputs: Inputs) -> list[Check]:
    fb = next(((d, v) for d in FBGEMM_DISTS if (v := platform.package_version(d))), None)
    archs = sorted({d.gfx_arch for d in facts.devices if d.gfx_arch})
    out = compat_checks(
        platform.torch_version(),
        hip_v=platform.hip_version(),
        fbgemm=fb,
        torchrec=platform.package_version("torchrec"),
        archs=archs,
    )
    if platform.is_cuda_build():
        import torch

        out.append(
            Check(
                "versions.torch_cuda",
                "ok",
                f"torch {_fmt(platform.torch_version())} built with CUDA {torch.version.cuda}",
            )
        )
    tri = next(((d, v) for d in TRITON_DISTS if (v := platform.package_version(d))), None)
    out.append(
        Check("versions.triton", "ok", f"{tri[0]} {tri[1]}")
        if tri
        else Check(
            "versions.triton",
            "warn",
            "triton not installed",
            "kernel=triton needs triton (ROCm: pytorch-triton-rocm from PyTorch's index)",
        )
    )
    nv = platform.nccl_version()
    lib = "RCCL" if platform.is_rocm() else "NCCL"
    if nv:
        out.append(
            Check(
                "versions.rccl" if platform.is_rocm() else "versions.nccl",
                "ok",
                f"{lib} {_fmt(nv)} (torch.cuda.nccl.version())",
            )
        )
    elif platform.is_rocm() or platform.is_cuda_build():
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
    hip = platform.hip_version()
    if installed and hip and _mm(installed) != _mm(hip):
        out.append(
            Check(
                "versions.rocm_install",
                "warn",
                f"system ROCm {installed}, torch built with HIP {_fmt(hip)}",
                "torch ships its own HIP user-space; keep the driver/ROCm ≥ the torch build",
            )
        )
    elif installed:
        out.append(Check("versions.rocm_install", "ok", f"system ROCm {installed}"))
    return out


CHECKS = (check_versions,)
