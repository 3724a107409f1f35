"""Platform facts, asked in one place.

Everything that differs between CPU, CUDA and ROCm builds of PyTorch is decided here, so kernels,
precision policy, the doctor and RCCL gating never parse versions or device properties themselves.

ROCm PyTorch exposes the ``torch.cuda`` API; a ROCm build is recognised by ``torch.version.hip``
being a string. The GPU architecture comes from ``gcnArchName`` (``gfx942:sramecc+:xnack-`` →
``gfx942``) and the wavefront width from ``warp_size`` (64 on CDNA, 32 on RDNA and NVIDIA).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal

import torch

Runtime = Literal["cpu", "cuda", "rocm"]
#: the old name of :data:`Runtime` ("backend" also names the process-group backend: gloo/nccl)
Backend = Runtime

#: wavefront width by gfx family, used when a device cannot be queried (e.g. a recorded fixture).
CDNA_ARCHS = ("gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950")

#: Instinct device ids (PCI) → product, from amd-smi / rocminfo on real machines.
AMD_DEVICE_IDS = {
    "0x738c": "MI100",
    "0x7408": "MI250X",
    "0x740c": "MI250/MI250X",
    "0x740f": "MI210",
    "0x74a1": "MI300X",
    "0x74a5": "MI325X",
    "0x74b5": "MI300X VF",
    "0x74a0": "MI300A",
}


def is_rocm() -> bool:
    """True on a ROCm (HIP) build of PyTorch, whether or not a GPU is visible."""
    return getattr(torch.version, "hip", None) is not None


def is_cuda_build() -> bool:
    """True on an NVIDIA CUDA build of PyTorch."""
    return torch.version.cuda is not None and not is_rocm()


def has_gpu() -> bool:
    """True when at least one GPU (NVIDIA or AMD) is visible to PyTorch."""
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def runtime() -> Runtime:
    """``"rocm"`` or ``"cuda"`` when a GPU is visible, else ``"cpu"``: the GPU software stack."""
    if not has_gpu():
        return "cpu"
    return "rocm" if is_rocm() else "cuda"


#: the old name of :func:`runtime`, kept for users' code
backend = runtime


def is_gpu_run(accelerator: str, backend: str = "auto") -> bool:
    """The one "GPU run or not" decision: ``accelerator`` gpu, or auto with a GPU visible, or the
    nccl backend asked for (which needs GPUs)."""
    if accelerator == "gpu" or backend == "nccl":
        return True
    return accelerator == "auto" and has_gpu()


@dataclass(frozen=True)
class Placement:
    """Where a run's ranks compute, answered once per run and passed down.

    ``gpu``: the ranks train on GPUs; ``device``: the torch device type (``"cuda"`` on NVIDIA and
    ROCm alike, ``"cpu"``); ``process_group``: the torch.distributed backend (``"nccl"``, which
    is RCCL on ROCm, or ``"gloo"``).
    """

    gpu: bool
    device: Literal["cuda", "cpu"]
    process_group: Literal["nccl", "gloo"]


def placement(accelerator: str, process_group: str = "auto") -> Placement:
    """The :class:`Placement` of a run from ``trainer.accelerator`` and ``strategy.backend``
    (the process-group backend: ``auto``, ``gloo`` or ``nccl``); an explicit backend is kept,
    ``auto`` follows the device."""
    gpu = is_gpu_run(accelerator, process_group)
    if process_group not in ("nccl", "gloo"):
        process_group = "nccl" if gpu else "gloo"
    return Placement(gpu=gpu, device="cuda" if gpu else "cpu", process_group=process_group)


def device_count() -> int:
    """Number of visible GPUs (0 on a CPU-only machine)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def normalize_gfx_arch(name: str | None) -> str | None:
    """``"gfx942:sramecc+:xnack-"`` → ``"gfx942"``; ``None`` and empty stay ``None``."""
    if not name:
        return None
    m = re.match(r"\s*(gfx[0-9a-fA-F]+)", name)
    return m.group(1).lower() if m else None


@functools.cache
def gfx_arch(device: int = 0) -> str | None:
    """The AMD gfx architecture of ``device`` (``"gfx90a"``, ``"gfx942"``), or None if not ROCm."""
    if not (is_rocm() and has_gpu()):
        return None
    props = torch.cuda.get_device_properties(device)
    return normalize_gfx_arch(getattr(props, "gcnArchName", None))


@functools.cache
def compute_capability(device: int = 0) -> tuple[int, int] | None:
    """NVIDIA compute capability ``(major, minor)``, or None off CUDA."""
    if not (is_cuda_build() and has_gpu()):
        return None
    return torch.cuda.get_device_capability(device)


def warp_size_for_arch(arch: str | None) -> int:
    """Wavefront width for a gfx arch name (64 on CDNA/GCN, 32 on RDNA), 32 when unknown/NVIDIA."""
    arch = normalize_gfx_arch(arch)
    if arch is None:
        return 32
    # gfx10xx / gfx11xx / gfx12xx are RDNA (wave32 by default); gfx9xx and older are wave64.
    return 32 if re.match(r"gfx1[0-9]", arch) else 64


@functools.cache
def warp_size(device: int = 0) -> int:
    """Lanes per warp/wavefront of ``device``: the device's own ``warp_size`` where it reports one."""
    if not has_gpu():
        return 32
    props = torch.cuda.get_device_properties(device)
    ws = getattr(props, "warp_size", None)
    if ws:
        return int(ws)
    return warp_size_for_arch(gfx_arch(device)) if is_rocm() else 32


@dataclass(frozen=True)
class DeviceInfo:
    """What kernels and policies need to know about one GPU."""

    index: int
    name: str
    backend: Runtime  #: the GPU software stack (:func:`runtime`), not a process-group backend
    arch: str | None  #: gfx arch on ROCm (``gfx942``), ``sm_90`` style on CUDA, None on CPU
    warp_size: int
    multi_processor_count: int
    total_memory_bytes: int


def device_info(device: int = 0) -> DeviceInfo:
    """Describe ``device``; on a CPU-only machine a CPU pseudo-device."""
    if not has_gpu():
        return DeviceInfo(0, "cpu", "cpu", None, 32, 0, 0)
    props = torch.cuda.get_device_properties(device)
    if is_rocm():
        arch = gfx_arch(device)
    else:
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"sm_{major}{minor}"
    return DeviceInfo(
        index=device,
        name=props.name,
        backend=runtime(),
        arch=arch,
        warp_size=warp_size(device),
        multi_processor_count=props.multi_processor_count,
        total_memory_bytes=props.total_memory,
    )


def _parse_version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    nums = re.findall(r"\d+", text.split("+")[0])
    return tuple(int(n) for n in nums[:3]) if nums else None


def torch_version() -> tuple[int, ...]:
    """``torch.__version__`` as a tuple, local suffix dropped (``2.13.0+cpu`` → ``(2, 13, 0)``)."""
    return _parse_version(torch.__version__) or (0,)


def hip_version() -> tuple[int, ...] | None:
    """HIP version PyTorch was built with (``torch.version.hip``), or None off ROCm builds."""
    return _parse_version(getattr(torch.version, "hip", None))


def rocm_version() -> tuple[int, ...] | None:
    """ROCm release PyTorch was built with, or None off ROCm builds.

    ``torch.version.rocm`` where this torch has it, else ``torch.version.hip``: HIP and ROCm
    numbers were equal up to ROCm 7 but diverge from ROCm 10 (HIP 7.15), which is why PyTorch added
    ``torch.version.rocm`` (pytorch/pytorch PR #168097).
    """
    return _parse_version(getattr(torch.version, "rocm", None)) or hip_version()


def nccl_version() -> tuple[int, ...] | None:
    """NCCL version on CUDA builds, RCCL version on ROCm builds; None without the library."""
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # no NCCL/RCCL in this build (CPU wheels)
        return None
    if isinstance(v, tuple):
        return tuple(int(x) for x in v[:3])
    v = int(v)  # older torch: 2.21.5 → 22105
    return (v // 10000, (v // 100) % 100, v % 100)


def package_version(name: str) -> str | None:
    """Installed version of a distribution (``triton``, ``fbgemm-gpu``...), or None."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
