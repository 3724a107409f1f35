"""Registry of environment variables: real, legacy, fabricated and dead knobs, with their real replacement.

Migration guides for CUDA→ROCm recommend knobs that do not exist (``RCCL_PROTO``, ``RCCL_LL_THRESHOLD``,
``HIP_ENABLE_DOUBLE_BUFFER``...). rocmtrain never sets them; this registry lets the env writer
(:mod:`rocmtrain.comms.env`), the RCCL config validation (:mod:`rocmtrain.comms.rccl`) and the doctor
tell the user what the real knob is. Facts and sources: ``ROCM_FACTS.md`` §1-3 and §8.

    from rocmtrain.comms.registry import check_environment, lookup
    for finding in check_environment(os.environ, rccl_version=platform.nccl_version()):
        print(finding.severity, finding.message)
    lookup("RCCL_PROTO").replacement          # -> "NCCL_PROTO"

Statuses: ``real`` (read by the library named in ``component``), ``legacy`` (read only by old releases;
use ``replacement``), ``fabricated`` (never read by anything: invented by blog posts), ``dead``
(existed once, removed; silently ignored now).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Status = Literal["real", "legacy", "fabricated", "dead"]
Severity = Literal["error", "warning", "info"]
Version = tuple[int, ...]

_RCCL_DOC = "https://rocm.docs.amd.com/projects/rccl/en/latest/api-reference/env-variables.html"
_NCCL_DOC = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
_RCCL_LOG = "https://github.com/ROCm/rccl/blob/develop/CHANGELOG.md"
_RCCL_TUNE = "https://github.com/ROCm/rccl/blob/develop/src/graph/tuning.cc"
_PG_NCCL = (
    "https://github.com/pytorch/pytorch/blob/main/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"
)
_FR = "https://github.com/pytorch/pytorch/blob/main/torch/csrc/distributed/c10d/FlightRecorder.hpp"
_HIP_DBG = "https://rocm.docs.amd.com/projects/HIP/en/latest/how-to/debugging.html"
_HIP_ENV = "https://rocm.docs.amd.com/projects/HIP/en/latest/reference/env_variables.html"
_TORCH_HIP = "https://pytorch.org/docs/stable/notes/hip.html"
_TUNABLE = "https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/cuda/tunable/README.md"
_MI300 = "https://rocm.docs.amd.com/en/latest/how-to/system-optimization/mi300x.html"
_NCCL25 = "https://docs.nvidia.com/deeplearning/nccl/release-notes/rel_2-5-6.html"


@dataclass(frozen=True)
class EnvVar:
    """One environment variable and what is known about it."""

    name: str
    component: str
    """Who reads it: ``rccl``/``nccl`` (collectives), ``torch``, ``hip``, ``hsa``, ``rocblas``..."""
    status: Status
    replacement: str | None = None
    """The real knob to use instead (for legacy/fabricated/dead names), or a related real one."""
    note: str = ""
    source: str = ""
    min_version: Version | None = None
    """First RCCL version that reads it (RCCL knobs only; compared with platform.nccl_version())."""
    removed_in: Version | None = None
    """First RCCL version that no longer reads it."""
    alias_of: str | None = None
    """For an old spelling that is still read: the current name."""


@dataclass(frozen=True)
class Finding:
    """One problem found in an environment or a config."""

    name: str
    severity: Severity
    message: str
    replacement: str | None = None
    source: str = ""


def _v(text: str) -> Version:
    return tuple(int(p) for p in text.split("."))


_E = EnvVar
_ENTRIES: list[EnvVar] = [
    # -- invented / dead collective knobs (ROCM_FACTS §1) --
    _E("RCCL_PROTO", "rccl", "fabricated", "NCCL_PROTO", "RCCL reads the NCCL_* names", _RCCL_DOC),
    _E("RCCL_ALGO", "rccl", "fabricated", "NCCL_ALGO", "RCCL reads the NCCL_* names", _RCCL_DOC),
    _E(
        "RCCL_LL_THRESHOLD",
        "rccl",
        "fabricated",
        "NCCL_PROTO / RCCL_OVERRIDE_PROTO",
        "no LL threshold exists in RCCL; P2P only: NCCL_P2P_LL_THRESHOLD",
        _RCCL_TUNE,
    ),
    _E(
        "NCCL_LL_THRESHOLD",
        "nccl",
        "dead",
        "NCCL_PROTO / RCCL_OVERRIDE_PROTO",
        "removed from NCCL between 2.4.8 and 2.5.6; RCCL never reads it (silently ignored)",
        _NCCL25,
    ),
    _E(
        "NCCL_TREE_THRESHOLD",
        "nccl",
        "dead",
        "NCCL_ALGO / RCCL_OVERRIDE_ALGO",
        "removed from NCCL between 2.4.8 and 2.5.6; RCCL never reads it (silently ignored)",
        _NCCL25,
    ),
    _E(
        "NCCL_LL128_THRESHOLD",
        "nccl",
        "fabricated",
        "NCCL_PROTO",
        "never existed in NCCL or RCCL",
        _NCCL_DOC,
    ),
    _E(
        "RCCL_ENABLE_MSCCLPP",
        "rccl",
        "fabricated",
        "RCCL_MSCCLPP_ENABLE",
        "a misspelling in AMD's docs; RCCL reads RCCL_MSCCLPP_ENABLE",
        _RCCL_DOC,
    ),
    # -- invented HIP/PyTorch knobs --
    _E(
        "HIP_MATRIX_ACCUMULATE_PRECISION",
        "hip",
        "fabricated",
        "torch.set_float32_matmul_precision / compute type",
        "GEMM accumulation is chosen by the compute type (ROCM_FACTS §4)",
        _TORCH_HIP,
    ),
    _E(
        "TORCH_HIP_MEM_POOL_ENABLE",
        "torch",
        "fabricated",
        "PYTORCH_HIP_ALLOC_CONF",
        "allocator knobs: PYTORCH_HIP_ALLOC_CONF (= PYTORCH_CUDA_ALLOC_CONF), "
        "PYTORCH_NO_HIP_MEMORY_CACHING=1",
        _TORCH_HIP,
    ),
    _E("HIP_ENABLE_DOUBLE_BUFFER", "hip", "fabricated", None, "no equivalent exists", _HIP_ENV),
    # -- legacy HIP names --
    _E(
        "HIP_TRACE_API",
        "hip",
        "legacy",
        "AMD_LOG_LEVEL",
        "HCC era; use AMD_LOG_LEVEL (0-5) + AMD_LOG_MASK (0x1 API calls)",
        _HIP_DBG,
    ),
    _E(
        "HIP_DB",
        "hip",
        "legacy",
        "AMD_LOG_LEVEL",
        "HCC era; use AMD_LOG_LEVEL + AMD_LOG_MASK",
        _HIP_DBG,
    ),
    _E("HIP_COHERENT_HOST_ALLOC", "hip", "legacy", "HIP_HOST_COHERENT", "", _HIP_ENV),
    # -- real HIP / HSA / ROCm libraries --
    _E("AMD_LOG_LEVEL", "hip", "real", note="0-5", source=_HIP_DBG),
    _E("AMD_LOG_MASK", "hip", "real", note="0x1 = API calls", source=_HIP_DBG),
    _E("HIP_HOST_COHERENT", "hip", "real", source=_HIP_ENV),
    _E(
        "HIP_LAUNCH_BLOCKING",
        "hip",
        "real",
        "AMD_SERIALIZE_KERNEL",
        "same as AMD_SERIALIZE_KERNEL; for fault localisation AMD_SERIALIZE_KERNEL=3 "
        "AMD_SERIALIZE_COPY=3",
        _HIP_DBG,
    ),
    _E("AMD_SERIALIZE_KERNEL", "hip", "real", source=_HIP_DBG),
    _E("AMD_SERIALIZE_COPY", "hip", "real", source=_HIP_DBG),
    _E("HIP_VISIBLE_DEVICES", "hip", "real", source=_HIP_ENV),
    _E(
        "ROCR_VISIBLE_DEVICES",
        "hsa",
        "real",
        note="filters below HIP; accepts UUIDs",
        source=_HIP_ENV,
    ),
    _E("CUDA_VISIBLE_DEVICES", "hip", "real", source=_HIP_ENV),
    _E(
        "PYTORCH_ROCM_ARCH",
        "torch",
        "real",
        note="build time only (--offload-arch list); no effect on a run",
        source=_TORCH_HIP,
    ),
    _E(
        "HSA_OVERRIDE_GFX_VERSION",
        "hsa",
        "real",
        note="spoofs the ISA for unsupported GPUs; never set it on MI250/MI300",
        source=_HIP_ENV,
    ),
    _E(
        "PYTORCH_TUNABLEOP_ENABLED",
        "torch",
        "real",
        note="tune once, then ENABLED=1 TUNING=0",
        source=_TUNABLE,
    ),
    _E("PYTORCH_TUNABLEOP_TUNING", "torch", "real", source=_TUNABLE),
    _E("PYTORCH_TUNABLEOP_FILENAME", "torch", "real", source=_TUNABLE),
    _E("PYTORCH_TUNABLEOP_VERBOSE", "torch", "real", source=_TUNABLE),
    _E("PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS", "torch", "real", source=_TUNABLE),
    _E(
        "TORCH_BLAS_PREFER_HIPBLASLT",
        "torch",
        "real",
        note="alias of TORCH_BLAS_PREFER_CUBLASLT; =0 forces rocBLAS",
        source=_TORCH_HIP,
    ),
    _E(
        "HIPBLASLT_ALLOW_TF32",
        "torch",
        "real",
        note="XF32 gate on gfx942 (older PyTorch)",
        source=_TORCH_HIP,
    ),
    _E(
        "ROCBLAS_INTERNAL_FP16_ALT_IMPL",
        "rocblas",
        "real",
        note="MI200 fp16/bf16 denormal flush",
        source=_TORCH_HIP,
    ),
    _E("MIOPEN_DEBUG_CONVOLUTION_ATTRIB_FP16_ALT_IMPL", "miopen", "real", source=_TORCH_HIP),
    _E(
        "HSA_NO_SCRATCH_RECLAIM",
        "hsa",
        "real",
        note="needed on gfx90a with ROCm >= 7.13 for RCCL small-message latency",
        source=_RCCL_LOG,
    ),
    _E(
        "GPU_MAX_HW_QUEUES",
        "hip",
        "real",
        note="default 4; AMD: 2 with TORCH_NCCL_HIGH_PRIORITY=1",
        source=_MI300,
    ),
    _E("HIP_FORCE_DEV_KERNARG", "hip", "real", note="default on since ROCm 6.2", source=_HIP_ENV),
    _E("HSA_XNACK", "hsa", "real", note="page-fault retry; off by default", source=_HIP_ENV),
    _E("HSA_FORCE_FINE_GRAIN_PCIE", "hsa", "real", note="P2P between PCIe GPUs", source=_HIP_ENV),
    _E(
        "PYTORCH_HIP_ALLOC_CONF",
        "torch",
        "real",
        note="expandable_segments:True is a no-op on ROCm before PyTorch ~2.11 with ROCm >= 7.0",
        source=_TORCH_HIP,
    ),
    _E("PYTORCH_CUDA_ALLOC_CONF", "torch", "real", source=_TORCH_HIP),
    _E("PYTORCH_NO_HIP_MEMORY_CACHING", "torch", "real", source=_TORCH_HIP),
    # -- RCCL / NCCL (ROCM_FACTS §2) --
    _E(
        "NCCL_PROTO",
        "rccl",
        "real",
        note="LL, LL128, Simple (comma list, ^ = all except); setting "
        "it disables RCCL's own MI300 heuristic",
        source=_RCCL_TUNE,
    ),
    _E(
        "NCCL_ALGO",
        "rccl",
        "real",
        note="Ring, Tree on AMD; setting it disables RCCL's own MI300 heuristic",
        source=_RCCL_TUNE,
    ),
    _E("RCCL_OVERRIDE_PROTO", "rccl", "real", min_version=_v("2.26.6"), source=_RCCL_LOG),
    _E("RCCL_OVERRIDE_ALGO", "rccl", "real", min_version=_v("2.26.6"), source=_RCCL_LOG),
    _E("NCCL_P2P_LL_THRESHOLD", "rccl", "real", note="P2P only, default 16384", source=_RCCL_DOC),
    _E("RCCL_P2P_NET_THRESHOLD", "rccl", "real", note="default 131072", source=_RCCL_DOC),
    _E("RCCL_INTRANET_THRESHOLD", "rccl", "real", note="default 8388608", source=_RCCL_DOC),
    _E("NCCL_LL_BUFFSIZE", "rccl", "real", source=_NCCL_DOC),
    _E("NCCL_LL128_BUFFSIZE", "rccl", "real", source=_NCCL_DOC),
    _E("NCCL_BUFFSIZE", "rccl", "real", note="default 4 MiB", source=_NCCL_DOC),
    _E(
        "RCCL_LL128_FORCE_ENABLE",
        "rccl",
        "real",
        note="LL128 is on by default only on gfx90a in 2.21.5; gfx942 from ROCm 6.4.2",
        source=_RCCL_LOG,
    ),
    _E(
        "NCCL_MIN_NCHANNELS",
        "rccl",
        "real",
        note="AMD: 112 on MI300X end to end, 32 with < 8 GPUs; "
        "bypasses RCCL's MI300X channel model",
        source=_MI300,
    ),
    _E("NCCL_MAX_NCHANNELS", "rccl", "real", source=_NCCL_DOC),
    _E("NCCL_IB_TIMEOUT", "rccl", "real", note="18 in RCCL", source=_NCCL_DOC),
    _E("NCCL_IB_RETRY_CNT", "rccl", "real", note="default 7", source=_NCCL_DOC),
    _E("NCCL_IB_HCA", "rccl", "real", source=_NCCL_DOC),
    _E("NCCL_IB_GID_INDEX", "rccl", "real", note="3 on RoCE", source=_MI300),
    _E("NCCL_SOCKET_IFNAME", "rccl", "real", source=_NCCL_DOC),
    _E("NCCL_NET_GDR_LEVEL", "rccl", "real", source=_NCCL_DOC),
    _E("NCCL_CROSS_NIC", "rccl", "real", source=_NCCL_DOC),
    _E(
        "RCCL_MSCCL_ENABLE",
        "rccl",
        "real",
        note="AMD images set 0; removed in RCCL 2.28.3",
        removed_in=_v("2.28.3"),
        source=_RCCL_LOG,
    ),
    _E("RCCL_MSCCLPP_ENABLE", "rccl", "real", source=_RCCL_DOC),
    _E(
        "NCCL_CUMEM_ENABLE",
        "rccl",
        "real",
        note="ignored by 2.21.5; must be 1 on Broadcom Thor2 with ROCm >= 7.1",
        source=_RCCL_LOG,
    ),
    _E("NCCL_DEBUG", "rccl", "real", note="VERSION, WARN, INFO, TRACE", source=_NCCL_DOC),
    _E("NCCL_DEBUG_SUBSYS", "rccl", "real", source=_NCCL_DOC),
    _E("NCCL_DEBUG_FILE", "rccl", "real", source=_NCCL_DOC),
    _E("NCCL_NVLS_ENABLE", "nccl", "real", note="NVIDIA only (NVLink SHARP)", source=_NCCL_DOC),
    # -- PyTorch ProcessGroupNCCL (ROCM_FACTS §3) --
    _E(
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "torch",
        "real",
        note="3 (default): tear down without abort; flight-recorder dumps need 3",
        source=_PG_NCCL,
    ),
    _E("TORCH_NCCL_BLOCKING_WAIT", "torch", "real", source=_PG_NCCL),
    _E("TORCH_NCCL_ENABLE_MONITORING", "torch", "real", source=_PG_NCCL),
    _E("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "torch", "real", note="default 480 s", source=_PG_NCCL),
    _E("TORCH_FR_BUFFER_SIZE", "torch", "real", note="flight-recorder entries (2000)", source=_FR),
    _E(
        "TORCH_NCCL_TRACE_BUFFER_SIZE", "torch", "real", alias_of="TORCH_FR_BUFFER_SIZE", source=_FR
    ),
    _E("TORCH_NCCL_DUMP_ON_TIMEOUT", "torch", "real", source=_PG_NCCL),
    _E(
        "TORCH_FR_DUMP_TEMP_FILE",
        "torch",
        "real",
        note="dump prefix, one file per rank",
        source=_FR,
    ),
    _E(
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        "torch",
        "real",
        alias_of="TORCH_FR_DUMP_TEMP_FILE",
        source=_FR,
    ),
    _E("TORCH_NCCL_DESYNC_DEBUG", "torch", "real", source=_PG_NCCL),
    _E("TORCH_NCCL_HIGH_PRIORITY", "torch", "real", source=_PG_NCCL),
]
del _E

#: every known variable, by name
ENV_VARS: dict[str, EnvVar] = {e.name: e for e in _ENTRIES}

#: real NCCL_PROTO tokens (case-insensitive) and NCCL_ALGO tokens usable on AMD (+ NVIDIA-only ones)
PROTO_TOKENS = ("LL", "LL128", "Simple")
ALGO_TOKENS = ("Ring", "Tree")
ALGO_TOKENS_OTHER = ("CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
_BAD = ("fabricated", "dead")


def lookup(name: str) -> EnvVar | None:
    """The registry entry for ``name`` (exact, case-sensitive like the environment), or None."""
    return ENV_VARS.get(name)


def is_forbidden(name: str) -> bool:
    """True for names rocmtrain must never set (fabricated or dead)."""
    entry = ENV_VARS.get(name)
    return entry is not None and entry.status in _BAD


def describe(entry: EnvVar) -> str:
    """One sentence: what the name is and what to use instead."""
    what = {
        "fabricated": "does not exist (nothing reads it)",
        "dead": "is no longer read by anything (removed)",
        "legacy": "is a legacy name",
        "real": "is real",
    }[entry.status]
    text = f"{entry.name} {what}"
    if entry.note:
        text += f": {entry.note}"
    if entry.replacement and entry.status != "real":
        text += f"; use {entry.replacement} instead"
    return text + (f" (source: {entry.source})" if entry.source else "")


def parse_token_list(
    value: str, *, field: str, allowed: tuple[str, ...], allow_exclude: bool = True
) -> list[str]:
    """Validate an NCCL_PROTO / NCCL_ALGO style value; return canonical tokens.

    ``"ll,simple"`` → ``["LL", "Simple"]``; ``"^LL128"`` → ``["^", "LL128"]``. Raises ValueError naming
    ``field``, the bad value and the allowed set (RCCL 2.21.5 silently ignores unknown tokens; newer RCCL
    fails communicator init, so a typo must stop the run before launch).
    """
    text = str(value).strip()
    tokens: list[str] = []
    if allow_exclude and text.startswith("^"):
        tokens.append("^")
        text = text[1:]
    canon = {t.lower(): t for t in allowed}
    parts = [p.strip() for p in text.split(",")]
    if not text or any(not p for p in parts):
        raise ValueError(
            f"{field}={value!r}: empty token; give a comma list of {', '.join(allowed)}"
            + (" (a leading ^ means all except)" if allow_exclude else "")
        )
    for part in parts:
        if part.lower() not in canon:
            raise ValueError(
                f"{field}={value!r}: unknown token {part!r}; allowed (case-insensitive): "
                f"{', '.join(allowed)}" + (", with an optional leading ^" if allow_exclude else "")
            )
        tokens.append(canon[part.lower()])
    return tokens


def version_problem(name: str, version: Version | None) -> str | None:
    """Why ``name`` has no effect at RCCL ``version`` (None when fine or when unknown)."""
    entry = ENV_VARS.get(name)
    if entry is None or version is None:
        return None
    shown = ".".join(map(str, version))
    if entry.min_version and tuple(version) < entry.min_version:
        need = ".".join(map(str, entry.min_version))
        return f"{name} needs RCCL >= {need}; this RCCL is {shown}, which ignores it"
    if entry.removed_in and tuple(version) >= entry.removed_in:
        gone = ".".join(map(str, entry.removed_in))
        return f"{name} was removed in RCCL {gone}; this RCCL is {shown}, which ignores it"
    return None


def check_name(name: str, *, where: str = "environment") -> Finding | None:
    """A warning when ``name`` is fabricated, dead or legacy (``where`` says where it was found)."""
    entry = ENV_VARS.get(name)
    if entry is None or entry.status == "real":
        return None
    return Finding(
        name, "warning", f"{describe(entry)} [found in {where}]", entry.replacement, entry.source
    )


def _close_match(name: str) -> str | None:
    real = [n for n, e in ENV_VARS.items() if e.status == "real"]
    hits = difflib.get_close_matches(name, real, n=1, cutoff=0.85)
    return hits[0] if hits else None


def check_environment(
    environ: Mapping[str, str], *, rccl_version: Version | None = None, rocm: bool | None = None
) -> list[Finding]:
    """Inspect an environment (``os.environ`` or a dict): invented/legacy names, bad values, gates.

    ``rccl_version`` (``platform.nccl_version()`` on a ROCm build) enables the version gates; ``rocm``
    tells whether RCCL (True) or NVIDIA NCCL (False) reads the collective knobs (None: unknown).
    """
    findings: list[Finding] = []
    for name in sorted(environ):
        value = environ[name]
        bad = check_name(name)
        if bad is not None:
            findings.append(bad)
            continue
        entry = ENV_VARS.get(name)
        if entry is None:
            if name.startswith(("NCCL_", "RCCL_", "TORCH_NCCL_", "TORCH_FR_")):
                near = _close_match(name)
                if near:
                    findings.append(
                        Finding(
                            name,
                            "warning",
                            f"{name} is not a known knob; did you mean {near}?",
                            near,
                        )
                    )
            continue
        if entry.alias_of:
            findings.append(
                Finding(
                    name,
                    "info",
                    f"{name} is the old spelling of {entry.alias_of} (still read)",
                    entry.alias_of,
                    entry.source,
                )
            )
        if name in ("NCCL_PROTO", "NCCL_ALGO", "RCCL_OVERRIDE_PROTO", "RCCL_OVERRIDE_ALGO"):
            allowed = PROTO_TOKENS if name.endswith("PROTO") else ALGO_TOKENS + ALGO_TOKENS_OTHER
            try:
                parse_token_list(
                    value,
                    field=name,
                    allowed=allowed,
                    allow_exclude=not name.startswith("RCCL_OVERRIDE"),
                )
            except ValueError as exc:
                findings.append(Finding(name, "error", str(exc), None, entry.source))
        if rocm is not False:
            problem = version_problem(name, rccl_version)
            if problem:
                findings.append(Finding(name, "warning", problem, None, entry.source))
        if rocm is False and name.startswith("RCCL_"):
            findings.append(
                Finding(
                    name,
                    "info",
                    f"{name} is read only by RCCL (AMD); NVIDIA NCCL ignores it",
                    None,
                    entry.source,
                )
            )
        if name == "HSA_OVERRIDE_GFX_VERSION":
            findings.append(Finding(name, "warning", describe(entry), None, entry.source))
        if name == "PYTORCH_ROCM_ARCH":
            findings.append(Finding(name, "info", describe(entry), None, entry.source))
    return findings
