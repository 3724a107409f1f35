"""What each GPU architecture can do natively, for the precision policy (atomics, TF32/XF32, flags).

    >>> from rocmtrain.precision.capabilities import capabilities_for, current_capabilities
    >>> capabilities_for("gfx90a").atomic_add["bf16"]
    'cas'
    >>> current_capabilities().arch        # this process's device (``cpu`` without a GPU)

``atomic_add[dtype]`` is ``"native"`` (a hardware atomic add instruction, possibly packed 2x16),
``"cas"`` (a compare-and-swap loop: correct but slow and contended) or ``"none"``. Even a native
fp16/bf16 atomic accumulates in 16 bits: it is fast, not accurate. rocmtrain never accumulates in
fp16/bf16 unless ``precision.atomics=native`` (see :mod:`rocmtrain.precision.atomics`).

Sources: ROCm_FACTS §4 (AMD CDNA2/CDNA3 ISA guides, pytorch PR #198199, FBGEMM PRs #5972/#6308),
CUDA's ``cuda_fp16.hpp``/``cuda_bf16.hpp`` (fp16 ``atomicAdd`` sm_70+, ``__half2`` sm_60+, bf16 native
only sm_90+, a CAS loop on sm_80).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rocmtrain import platform


@dataclass(frozen=True)
class ArchCapabilities:
    """Numerics-relevant facts about one architecture (a row of :data:`TABLE`)."""

    arch: str
    """``gfx90a`` / ``gfx942`` / ``sm_80`` / ``cpu`` ..."""
    vendor: str
    """``amd``, ``nvidia`` or ``cpu``."""
    atomic_add: dict[str, str] = field(default_factory=dict)
    """dtype (``fp32``, ``fp16``, ``bf16``) → ``native`` | ``cas`` | ``none``."""
    fine_grained_float_atomics: bool = True
    """False where *hardware* float atomics (what ``-munsafe-fp-atomics`` and ``unsafeAtomicAdd``
    emit) do not work on fine-grained / host-coherent memory (MI200; AMD's "Hardware atomics
    operation support" page, rocm.docs.amd.com/en/latest/reference/gpu-atomics-operation.html).
    HIP's default ``atomicAdd(float)`` is a CAS loop and works there; the guard stays because
    Triton's AMD backend has emitted hardware atomics (the ROCm Triton fork's HSACOTranslation.cpp
    marks every kernel ``amdgpu-unsafe-fp-atomics``), so never point an atomic kernel at pinned
    host or ``hipMallocManaged`` fine-grained memory there."""
    xf32: bool = False
    """Reduced-precision fp32 GEMMs exist (NVIDIA TF32, AMD gfx942 XF32, gfx950 TF32 emulated with bf16
    MFMAs in hipBLASLt): ``allow_tf32`` changes results there and is a no-op elsewhere."""
    tf32_impl: str = "none"
    """How ``allow_tf32`` GEMMs are computed: ``none`` (full fp32), ``tf32`` (NVIDIA tensor cores),
    ``xf32`` (gfx942 MFMA), ``bf16-emulated`` (gfx950: several bf16 MFMAs per product in hipBLASLt,
    ROCm/hipBLASLt PR #1806), so its error differs from TF32 and must be measured, not assumed."""
    reduced_precision_reduction_flags: str = "supported"
    """``allow_fp16/bf16_reduced_precision_reduction``: ``supported`` or ``unsupported`` (AMD's
    compatibility page marks them unsupported on ROCm: settable, no documented effect)."""
    fp16_mfma_flushes_denormals: bool = False
    """fp16/bf16 MFMA flush fp16 denormals (MI200); PyTorch uses the alternate kernels in backward."""
    min_rocm: tuple[int, ...] | None = None
    """First ROCm release supporting the arch (None off AMD)."""
    notes: str = ""


_AMD_NO_RPR = "unsupported"

TABLE: dict[str, ArchCapabilities] = {
    "gfx908": ArchCapabilities(
        "gfx908",
        "amd",
        {"fp32": "native", "fp16": "native", "bf16": "cas"},
        fine_grained_float_atomics=True,
        reduced_precision_reduction_flags=_AMD_NO_RPR,
        min_rocm=(4, 0),
        notes="MI100: no-return fp32 / packed-fp16 global atomics only.",
    ),
    "gfx90a": ArchCapabilities(
        "gfx90a",
        "amd",
        {"fp32": "native", "fp16": "native", "bf16": "cas"},
        fine_grained_float_atomics=False,
        reduced_precision_reduction_flags=_AMD_NO_RPR,
        fp16_mfma_flushes_denormals=True,
        min_rocm=(4, 5),
        notes="MI200: fp32 and packed-fp16 atomic add in L2, no bf16; hardware (unsafe) float "
        "atomics do not work on fine-grained/host memory (default atomicAdd(float) is a CAS loop "
        "and does); no XF32 (TF32 flags are no-ops).",
    ),
    "gfx942": ArchCapabilities(
        "gfx942",
        "amd",
        {"fp32": "native", "fp16": "native", "bf16": "native"},
        xf32=True,
        tf32_impl="xf32",
        reduced_precision_reduction_flags=_AMD_NO_RPR,
        min_rocm=(6, 0),
        notes="MI300: adds packed bf16 atomics; allow_tf32 maps to XF32 (error near bf16).",
    ),
    "gfx950": ArchCapabilities(
        "gfx950",
        "amd",
        {"fp32": "native", "fp16": "native", "bf16": "native"},
        xf32=True,
        tf32_impl="bf16-emulated",
        reduced_precision_reduction_flags=_AMD_NO_RPR,
        min_rocm=(7, 0),
        notes="MI350: packed fp16/bf16 atomics; CDNA4 has no XF32 MFMA, but hipBLASLt emulates TF32 "
        "with bf16 MFMAs (ROCm/hipBLASLt PR #1806), so allow_tf32 does change fp32 GEMMs.",
    ),
    "sm_70": ArchCapabilities(
        "sm_70", "nvidia", {"fp32": "native", "fp16": "native", "bf16": "cas"}, notes="V100"
    ),
    "sm_80": ArchCapabilities(
        "sm_80",
        "nvidia",
        {"fp32": "native", "fp16": "native", "bf16": "cas"},
        xf32=True,
        tf32_impl="tf32",
        notes="A100: TF32; bf16 atomicAdd is a CAS loop before sm_90.",
    ),
    "sm_90": ArchCapabilities(
        "sm_90",
        "nvidia",
        {"fp32": "native", "fp16": "native", "bf16": "native"},
        xf32=True,
        tf32_impl="tf32",
        notes="H100/H200: native bf16 atomics.",
    ),
    "cpu": ArchCapabilities(
        "cpu",
        "cpu",
        {"fp32": "native", "fp16": "native", "bf16": "native"},
        notes="CPU: index_add/scatter_add run serially in the tensor dtype (no atomics).",
    ),
}


def _nvidia_row(arch: str) -> str:
    """``sm_86`` → the nearest lower row (``sm_80``); ``sm_100``+ → ``sm_90``."""
    major = int(arch[3:]) // 10 if arch[3:].isdigit() else 0
    if major >= 9:
        return "sm_90"
    if major >= 8:
        return "sm_80"
    return "sm_70"


def capabilities_for(
    arch: str | None, *, rocm_version: tuple[int, ...] | None = None
) -> ArchCapabilities:
    """The row for ``arch`` (``gfx942:sramecc+`` and ``sm_86`` are normalised).

    Unknown AMD archs get a conservative row (fp32 atomics only, no XF32, no fine-grained atomics).
    ``rocm_version`` older than the arch's first ROCm raises: the stack cannot run it.
    """
    if arch is None or arch == "cpu":
        return TABLE["cpu"]
    if arch.startswith("sm_"):
        return TABLE[arch] if arch in TABLE else TABLE[_nvidia_row(arch)]
    gfx = platform.normalize_gfx_arch(arch)
    if gfx is None:
        raise ValueError(f"unknown architecture {arch!r}: expected gfx9xx, sm_XY or cpu")
    row = TABLE.get(gfx)
    if row is None:
        row = ArchCapabilities(
            gfx,
            "amd",
            {"fp32": "native", "fp16": "cas", "bf16": "cas"},
            fine_grained_float_atomics=False,
            reduced_precision_reduction_flags=_AMD_NO_RPR,
            notes="not in rocmtrain's table: assuming the conservative MI200 behaviour",
        )
    if rocm_version is not None and row.min_rocm is not None and rocm_version < row.min_rocm:
        need = ".".join(map(str, row.min_rocm))
        have = ".".join(map(str, rocm_version))
        raise RuntimeError(f"{gfx} needs ROCm >= {need}; this PyTorch was built for ROCm {have}")
    return row


def current_capabilities(device: int = 0) -> ArchCapabilities:
    """Capabilities of the visible ``device`` (the CPU row without a GPU)."""
    info = platform.device_info(device)
    if info.backend == "cpu":
        return TABLE["cpu"]
    return capabilities_for(info.arch, rocm_version=platform.rocm_version())
