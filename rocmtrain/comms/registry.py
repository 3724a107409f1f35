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


def _v(text: str) -> Version | None:
    return tuple(int(p) for p in text.split(".")) if text else None


# name | component | status | replacement | note | source | first RCCL version | removed in | alias of
_TABLE = """
RCCL_PROTO | rccl | fabricated | NCCL_PROTO | RCCL reads the NCCL_* names | RCCL_DOC |  |  |
RCCL_ALGO | rccl | fabricated | NCCL_ALGO | RCCL reads the NCCL_* names | RCCL_DOC |  |  |
RCCL_LL_THRESHOLD | rccl | fabricated | NCCL_PROTO / RCCL_OVERRIDE_PROTO | no LL threshold exists in RCCL; P2P only: NCCL_P2P_LL_THRESHOLD | RCCL_TUNE |  |  |
NCCL_LL_THRESHOLD | nccl | dead | NCCL_PROTO / RCCL_OVERRIDE_PROTO | removed from NCCL between 2.4.8 and 2.5.6; RCCL never reads it (silently ignored) | NCCL25 |  |  |
NCCL_TREE_THRESHOLD | nccl | dead | NCCL_ALGO / RCCL_OVERRIDE_ALGO | removed from NCCL between 2.4.8 and 2.5.6; RCCL never reads it (silently ignored) | NCCL25 |  |  |
NCCL_LL128_THRESHOLD | nccl | fabricated | NCCL_PROTO | never existed in NCCL or RCCL | NCCL_DOC |  |  |
RCCL_ENABLE_MSCCLPP | rccl | fabricated | RCCL_MSCCLPP_ENABLE | a misspelling in AMD's docs; RCCL reads RCCL_MSCCLPP_ENABLE | RCCL_DOC |  |  |
HIP_MATRIX_ACCUMULATE_PRECISION | hip | fabricated | torch.set_float32_matmul_precision / compute type | GEMM accumulation is chosen by the compute type (ROCM_FACTS §4) | TORCH_HIP |  |  |
TORCH_HIP_MEM_POOL_ENABLE | torch | fabricated | PYTORCH_HIP_ALLOC_CONF | allocator knobs: PYTORCH_HIP_ALLOC_CONF (= PYTORCH_CUDA_ALLOC_CONF), PYTORCH_NO_HIP_MEMORY_CACHING=1 | TORCH_HIP |  |  |
HIP_ENABLE_DOUBLE_BUFFER | hip | fabricated |  | no equivalent exists | HIP_ENV |  |  |
HIP_TRACE_API | hip | legacy | AMD_LOG_LEVEL | HCC era; use AMD_LOG_LEVEL (0-5) + AMD_LOG_MASK (0x1 API calls) | HIP_DBG |  |  |
HIP_DB | hip | legacy | AMD_LOG_LEVEL | HCC era; use AMD_LOG_LEVEL + AMD_LOG_MASK | HIP_DBG |  |  |
HIP_COHERENT_HOST_ALLOC | hip | legacy | HIP_HOST_COHERENT |  | HIP_ENV |  |  |
AMD_LOG_LEVEL | hip | real |  | 0-5 | HIP_DBG |  |  |
AMD_LOG_MASK | hip | real |  | 0x1 = API calls | HIP_DBG |  |  |
HIP_HOST_COHERENT | hip | real |  |  | HIP_ENV |  |  |
HIP_LAUNCH_BLOCKING | hip | real | AMD_SERIALIZE_KERNEL | same as AMD_SERIALIZE_KERNEL; for fault localisation AMD_SERIALIZE_KERNEL=3 AMD_SERIALIZE_COPY=3 | HIP_DBG |  |  |
AMD_SERIALIZE_KERNEL | hip | real |  |  | HIP_DBG |  |  |
AMD_SERIALIZE_COPY | hip | real |  |  | HIP_DBG |  |  |
HIP_VISIBLE_DEVICES | hip | real |  |  | HIP_ENV |  |  |
ROCR_VISIBLE_DEVICES | hsa | real |  | filters below HIP; accepts UUIDs | HIP_ENV |  |  |
CUDA_VISIBLE_DEVICES | hip | real |  |  | HIP_ENV |  |  |
PYTORCH_ROCM_ARCH | torch | real |  | build time only (--offload-arch list); no effect on a run | TORCH_HIP |  |  |
HSA_OVERRIDE_GFX_VERSION | hsa | real |  | spoofs the ISA for unsupported GPUs; never set it on MI250/MI300 | HIP_ENV |  |  |
PYTORCH_TUNABLEOP_ENABLED | torch | real |  | tune once, then ENABLED=1 TUNING=0 | TUNABLE |  |  |
PYTORCH_TUNABLEOP_TUNING | torch | real |  |  | TUNABLE |  |  |
PYTORCH_TUNABLEOP_FILENAME | torch | real |  |  | TUNABLE |  |  |
PYTORCH_TUNABLEOP_VERBOSE | torch | real |  |  | TUNABLE |  |  |
PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS | torch | real |  |  | TUNABLE |  |  |
TORCH_BLAS_PREFER_HIPBLASLT | torch | real |  | alias of TORCH_BLAS_PREFER_CUBLASLT; =0 forces rocBLAS | TORCH_HIP |  |  |
HIPBLASLT_ALLOW_TF32 | torch | real |  | XF32 gate on gfx942 (older PyTorch) | TORCH_HIP |  |  |
ROCBLAS_INTERNAL_FP16_ALT_IMPL | rocblas | real |  | MI200 fp16/bf16 denormal flush | TORCH_HIP |  |  |
MIOPEN_DEBUG_CONVOLUTION_ATTRIB_FP16_ALT_IMPL | miopen | real |  |  | TORCH_HIP |  |  |
HSA_NO_SCRATCH_RECLAIM | hsa | real |  | needed on gfx90a with ROCm >= 7.13 for RCCL small-message latency | RCCL_LOG |  |  |
GPU_MAX_HW_QUEUES | hip | real |  | default 4; AMD: 2 with TORCH_NCCL_HIGH_PRIORITY=1 | MI300 |  |  |
HIP_FORCE_DEV_KERNARG | hip | real |  | default on since ROCm 6.2 | HIP_ENV |  |  |
HSA_XNACK | hsa | real |  | page-fault retry; off by default | HIP_ENV |  |  |
HSA_FORCE_FINE_GRAIN_PCIE | hsa | real |  | P2P between PCIe GPUs | HIP_ENV |  |  |
PYTORCH_HIP_ALLOC_CONF | torch | real |  | expandable_segments:True is a no-op on ROCm before PyTorch ~2.11 with ROCm >= 7.0 | TORCH_HIP |  |  |
PYTORCH_CUDA_ALLOC_CONF | torch | real |  |  | TORCH_HIP |  |  |
PYTORCH_NO_HIP_MEMORY_CACHING | torch | real |  |  | TORCH_HIP |  |  |
NCCL_PROTO | rccl | real |  | LL, LL128, Simple (comma list, ^ = all except); setting it disables RCCL's own MI300 heuristic | RCCL_TUNE |  |  |
NCCL_ALGO | rccl | real |  | Ring, Tree on AMD; setting it disables RCCL's own MI300 heuristic | RCCL_TUNE |  |  |
RCCL_OVERRIDE_PROTO | rccl | real |  |  | RCCL_LOG | 2.26.6 |  |
RCCL_OVERRIDE_ALGO | rccl | real |  |  | RCCL_LOG | 2.26.6 |  |
NCCL_P2P_LL_THRESHOLD | rccl | real |  | P2P only, default 16384 | RCCL_DOC |  |  |
RCCL_P2P_NET_THRESHOLD | rccl | real |  | default 131072 | RCCL_DOC |  |  |
RCCL_INTRANET_THRESHOLD | rccl | real |  | default 8388608 | RCCL_DOC |  |  |
NCCL_LL_BUFFSIZE | rccl | real |  |  | NCCL_DOC |  |  |
NCCL_LL128_BUFFSIZE | rccl | real |  |  | NCCL_DOC |  |  |
NCCL_BUFFSIZE | rccl | real |  | default 4 MiB | NCCL_DOC |  |  |
RCCL_LL128_FORCE_ENABLE | rccl | real |  | LL128 is on by default only on gfx90a in 2.21.5; gfx942 from ROCm 6.4.2 | RCCL_LOG |  |  |
NCCL_MIN_NCHANNELS | rccl | real |  | AMD: 112 on MI300X end to end, 32 with < 8 GPUs; bypasses RCCL's MI300X channel model | MI300 |  |  |
NCCL_MAX_NCHANNELS | rccl | real |  |  | NCCL_DOC |  |  |
NCCL_IB_TIMEOUT | rccl | real |  | 18 in RCCL | NCCL_DOC |  |  |
NCCL_IB_RETRY_CNT | rccl | real |  | default 7 | NCCL_DOC |  |  |
NCCL_IB_HCA | rccl | real |  |  | NCCL_DOC |  |  |
NCCL_IB_GID_INDEX | rccl | real |  | 3 on RoCE | MI300 |  |  |
NCCL_SOCKET_IFNAME | rccl | real |  |  | NCCL_DOC |  |  |
NCCL_NET_GDR_LEVEL | rccl | real |  |  | NCCL_DOC |  |  |
NCCL_CROSS_NIC | rccl | real |  |  | NCCL_DOC |  |  |
RCCL_MSCCL_ENABLE | rccl | real |  | AMD images set 0; removed in RCCL 2.28.3 | RCCL_LOG |  | 2.28.3 |
RCCL_MSCCLPP_ENABLE | rccl | real |  |  | RCCL_DOC |  |  |
NCCL_CUMEM_ENABLE | rccl | real |  | ignored by 2.21.5; must be 1 on Broadcom Thor2 with ROCm >= 7.1 | RCCL_LOG |  |  |
NCCL_DEBUG | rccl | real |  | VERSION, WARN, INFO, TRACE | NCCL_DOC |  |  |
NCCL_DEBUG_SUBSYS | rccl | real |  |  | NCCL_DOC |  |  |
NCCL_DEBUG_FILE | rccl | real |  |  | NCCL_DOC |  |  |
NCCL_NVLS_ENABLE | nccl | real |  | NVIDIA only (NVLink SHARP) | NCCL_DOC |  |  |
TORCH_NCCL_ASYNC_ERROR_HANDLING | torch | real |  | 3 (default): tear down without abort; flight-recorder dumps need 3 | PG_NCCL |  |  |
TORCH_NCCL_BLOCKING_WAIT | torch | real |  |  | PG_NCCL |  |  |
TORCH_NCCL_ENABLE_MONITORING | torch | real |  |  | PG_NCCL |  |  |
TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC | torch | real |  | default 480 s | PG_NCCL |  |  |
TORCH_FR_BUFFER_SIZE | torch | real |  | flight-recorder entries (2000) | FR |  |  |
TORCH_NCCL_TRACE_BUFFER_SIZE | torch | real |  |  | FR |  |  | TORCH_FR_BUFFER_SIZE
TORCH_NCCL_DUMP_ON_TIMEOUT | torch | real |  |  | PG_NCCL |  |  |
TORCH_FR_DUMP_TEMP_FILE | torch | real |  | dump prefix, one file per rank | FR |  |  |
TORCH_NCCL_DEBUG_INFO_TEMP_FILE | torch | real |  |  | FR |  |  | TORCH_FR_DUMP_TEMP_FILE
TORCH_NCCL_DESYNC_DEBUG | torch | real |  |  | PG_NCCL |  |  |
TORCH_NCCL_HIGH_PRIORITY | torch | real |  |  | PG_NCCL |  |  |
"""
_SOURCES = {
    "RCCL_DOC": _RCCL_DOC, "NCCL_DOC": _NCCL_DOC, "RCCL_LOG": _RCCL_LOG, "RCCL_TUNE": _RCCL_TUNE,
    "PG_NCCL": _PG_NCCL, "FR": _FR, "HIP_DBG": _HIP_DBG, "HIP_ENV": _HIP_ENV,
    "TORCH_HIP": _TORCH_HIP, "TUNABLE": _TUNABLE, "MI300": _MI300, "NCCL25": _NCCL25,
}  # fmt: skip


def _load(table: str) -> list[EnvVar]:
    out = []
    for line in table.strip().splitlines():
        name, comp, status, repl, note, src, first, gone, alias = (
            c.strip() for c in line.split("|")
        )
        out.append(EnvVar(name, comp, status, repl or None, note, _SOURCES[src], _v(first), _v(gone),
                          alias or None))  # type: ignore[arg-type]  # fmt: skip
    return out


_ENTRIES = _load(_TABLE)

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
