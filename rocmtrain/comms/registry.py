"""Registry of environment variables: real, legacy, fabricated and dead knobs, with their real replacement.

Migration guides for CUDA→ROCm recommend knobs that do not exist (``RCCL_PROTO``, ``RCCL_LL_THRESHOLD``,
``HIP_ENABLE_DOUBLE_BUFFER``...). rocmtrain never sets them; this registry lets the env writer
(:mod:`rocmtrain.comms.env`), the RCCL config validation (:mod:`rocmtrain.comms.rccl`) and the doctor
tell the user what the real knob is. Facts and sources: each entry below names its source (file at a tag, or a doc URL).

    from rocmtrain.comms.registry import Versions, check_environment, lookup
    have = Versions.parse(torch="2.7.1+rocm6.3", rccl="2.21.5", arch="gfx942")
    for finding in check_environment(os.environ, versions=have, rocm=True):
        print(finding.severity, finding.message)
    lookup("RCCL_PROTO").replacement          # -> "NCCL_PROTO"

Statuses: ``real`` (read by the library named in ``component``), ``legacy`` (read only by old releases;
use ``replacement``), ``fabricated`` (never read by anything: invented by blog posts), ``dead``
(existed once, removed; silently ignored now).

Every entry names its ``source`` (a file at a release tag, or a documentation page) and its version
``gates``: which component's version (RCCL, ROCm or PyTorch) decides whether the knob is read, and from
or until which release; an entry without gates is read by every release rocmtrain supports. A claim
that no source backs is ``verified=False``: it is still reported, but no preset may set that knob.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Status = Literal["real", "legacy", "fabricated", "dead"]
Severity = Literal["error", "warning", "info"]
Version = tuple[int, ...]

_GH_RCCL = "https://github.com/ROCm/rccl/blob"
_RCCL_DOC = "https://rocm.docs.amd.com/projects/rccl/en/latest/api-reference/env-variables.html"
_NCCL_DOC = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
_RCCL_LOG = f"{_GH_RCCL}/develop/CHANGELOG.md"
# RCCL 2.21.5 is the RCCL of ROCm 6.3: tag rocm-6.3.0
_RCCL_TUNE = f"{_GH_RCCL}/rocm-6.3.0/src/graph/tuning.cc"
_RCCL_ENQ = f"{_GH_RCCL}/rocm-6.3.0/src/enqueue.cc + src/graph/rome_models.cc"
_RCCL_ROME = f"{_GH_RCCL}/rocm-6.3.0/src/graph/rome_models.cc"
_NCCL_2243 = "https://docs.nvidia.com/deeplearning/nccl/release-notes/rel_2-24-3.html"
_PG_NCCL = "https://github.com/pytorch/pytorch/blob/v2.7.1/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"
_FR = (
    "https://github.com/pytorch/pytorch/blob/v2.8.0/torch/csrc/distributed/c10d/FlightRecorder.hpp "
    "(pytorch PR #152563)"
)
_FR_OLD = (
    "https://github.com/pytorch/pytorch/blob/v2.7.1/torch/csrc/distributed/c10d/FlightRecorder.hpp"
)
_CLR_FLAGS = "https://github.com/ROCm/clr/blob/rocm-6.3.0/rocclr/utils/flags.hpp"
_CLR_KERNARG = "https://github.com/ROCm/clr/blob/rocm-6.1.0/rocclr/utils/flags.hpp"
_HIP_DBG = "https://rocm.docs.amd.com/projects/HIP/en/latest/how-to/debugging.html"
_HIP_ENV = "https://rocm.docs.amd.com/projects/HIP/en/latest/reference/env_variables.html"
_TORCH_HIP = "https://pytorch.org/docs/stable/notes/hip.html"
_TUNABLE = "https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/cuda/tunable/README.md"
_MI300 = "https://rocm.docs.amd.com/en/latest/how-to/system-optimization/mi300x.html"
_NCCL25 = "https://docs.nvidia.com/deeplearning/nccl/release-notes/rel_2-5-6.html"
_EXPSEG = (
    "https://github.com/pytorch/pytorch/pull/177974 + https://github.com/pytorch/pytorch/pull/179781 "
    "(PyTorch 2.12 release notes: expandable segments on ROCm >= 7.0)"
)
_XNACK = (
    "https://rocm.docs.amd.com/en/latest/conceptual/gpu-memory.html (XNACK) + "
    "https://github.com/torvalds/linux/blob/v6.8/drivers/gpu/drm/amd/amdgpu/amdgpu_drv.c "
    "(noretry: -1 auto (default))"
)
_IB_GID = (
    "https://github.com/ROCm/rccl/blob/ab2b89c4c339bd7f816fbc114a4b05d386b66290/src/transport/"
    "net_ib.cc (NCCL 2.21.5-1 in RCCL: IB_GID_INDEX default -1, ncclIbGetGidIndex picks the GID of "
    "IB_ROCE_VERSION_NUM=2) + https://github.com/ROCm/rccl/blob/rocm-6.2.0/src/transport/net_ib.cc "
    "(default 0)"
)

COMPONENT_NAMES = {"rccl": "RCCL", "rocm": "ROCm", "torch": "PyTorch"}


def _v(text: str) -> Version:
    return tuple(int(p) for p in text.split("."))


def _show(version: Version) -> str:
    return ".".join(map(str, version))


@dataclass(frozen=True)
class Gate:
    """One version condition for a knob to be read: ``rccl>=2.26.6``, ``rocm<7.13 (removed)``.

    ``>=`` names the first release that reads the knob, ``<`` the first one that no longer does (or
    where it stops having an effect; ``why`` says which). ``archs`` limits the gate to those GPU archs.
    """

    component: str
    """``rccl``, ``rocm`` or ``torch``: whose version decides."""
    op: Literal[">=", "<"]
    version: Version
    why: str = ""
    archs: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Gate:
        """``"gfx942:rocm>=6.4.2"``, ``"rocm<7.13 (removed)"`` → Gate (ValueError on anything else)."""
        m = re.fullmatch(
            r"\s*(?:([\w|]+):)?(rccl|rocm|torch)(>=|<)([\d.]+)\s*(?:\(([^)]*)\))?\s*", text
        )
        if not m:
            raise ValueError(f"registry gate {text!r}: expected [arch:]rccl|rocm|torch>=|<X.Y[.Z]")
        archs = tuple(m.group(1).split("|")) if m.group(1) else ()
        op: Literal[">=", "<"] = ">=" if m.group(3) == ">=" else "<"
        return cls(m.group(2), op, _v(m.group(4)), m.group(5) or "", archs)

    def text(self) -> str:
        """The gate as written in the table (without ``why``)."""
        where = "|".join(self.archs) + ":" if self.archs else ""
        return f"{where}{self.component}{self.op}{_show(self.version)}"

    def applies_to(self, arch: str | None) -> bool:
        """True when the gate concerns ``arch`` (unknown arch: only arch-independent gates)."""
        return not self.archs or (arch is not None and arch in self.archs)

    def problem(self, name: str, have: Version) -> str | None:
        """Why ``name`` is not read at version ``have`` of the gate's component (None when it is)."""
        comp = COMPONENT_NAMES[self.component]
        on = f" on {'/'.join(self.archs)}" if self.archs else ""
        need, shown = _show(self.version), _show(have)
        if self.op == ">=" and tuple(have) < self.version:
            why = f" ({self.why})" if self.why else ""
            return (
                f"{name} needs {comp} >= {need}{on}{why}; this {comp} is {shown}, which ignores it"
            )
        if self.op == "<" and tuple(have) >= self.version:
            what = "was removed in" if self.why == "removed" else "has no effect from"
            why = "" if self.why in ("", "removed") else f" ({self.why})"
            return f"{name} {what} {comp} {need}{on}{why}; this {comp} is {shown}, which ignores it"
        return None


@dataclass(frozen=True)
class Versions:
    """What the gates compare with: PyTorch, RCCL and ROCm versions and the GPU arch (None = unknown)."""

    torch: Version | None = None
    rccl: Version | None = None
    rocm: Version | None = None
    arch: str | None = None

    @classmethod
    def parse(
        cls,
        *,
        torch: str | None = None,
        rccl: str | None = None,
        rocm: str | None = None,
        arch: str | None = None,
    ) -> Versions:
        """From version strings: ``torch="2.7.1+rocm6.3"`` also gives ROCm 6.3 unless ``rocm`` is set."""
        torch_v = parse_version(torch)
        rocm_v = parse_version(rocm)
        if rocm_v is None and torch and (m := re.search(r"\+rocm(\d+(?:\.\d+)*)", torch)):
            rocm_v = _v(m.group(1))
        return cls(torch_v, parse_version(rccl), rocm_v, arch)

    def of(self, component: str) -> Version | None:
        """The version of ``component`` (``rccl``, ``rocm``, ``torch``)."""
        return {"rccl": self.rccl, "rocm": self.rocm, "torch": self.torch}[component]


def parse_version(text: str | None) -> Version | None:
    """``"2.7.1+rocm6.3"`` → (2, 7, 1); ``"7.13.0"`` → (7, 13, 0); None/empty → None."""
    if not text:
        return None
    nums = re.findall(r"\d+", str(text).split("+")[0])
    return tuple(int(n) for n in nums[:3]) if nums else None


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
    """Where the facts come from: a file at a release tag or a documentation URL."""
    gates: tuple[Gate, ...] = ()
    """Version conditions for the knob to be read (empty: every supported release reads it)."""
    alias_of: str | None = None
    """For an old spelling that is still read: the current name."""
    archs: tuple[str, ...] = ()
    """GPU archs where the knob has an effect (``nvidia`` for NVIDIA-only knobs; empty: all)."""
    verified: bool = True
    """False when the note's claim has no source: reported, never set by a preset."""

    def gate_text(self) -> str:
        """The gates as one string (``"always"`` when there is none)."""
        return " & ".join(g.text() for g in self.gates) or "always"


@dataclass(frozen=True)
class Finding:
    """One problem found in an environment or a config."""

    name: str
    severity: Severity
    message: str
    replacement: str | None = None
    source: str = ""


# name | component | status | replacement | note | source | gates (&-separated) | alias of | archs | verified
_TABLE = """
RCCL_PROTO | rccl | fabricated | NCCL_PROTO | RCCL reads the NCCL_* names | RCCL_DOC |  |  |  | yes
RCCL_ALGO | rccl | fabricated | NCCL_ALGO | RCCL reads the NCCL_* names | RCCL_DOC |  |  |  | yes
RCCL_LL_THRESHOLD | rccl | fabricated | NCCL_PROTO / RCCL_OVERRIDE_PROTO | no LL threshold exists in RCCL; P2P only: NCCL_P2P_LL_THRESHOLD | RCCL_TUNE |  |  |  | yes
NCCL_LL_THRESHOLD | nccl | dead | NCCL_PROTO / RCCL_OVERRIDE_PROTO | removed from NCCL between 2.4.8 and 2.5.6; old RCCL (2.5.0-3.1.0, ROCm <= 3.1) read it, no current RCCL does (silently ignored) | NCCL25 | rocm<3.2 (removed) |  |  | yes
NCCL_TREE_THRESHOLD | nccl | dead | NCCL_ALGO / RCCL_OVERRIDE_ALGO | removed from NCCL between 2.4.8 and 2.5.6; old RCCL (2.5.0-3.1.0, ROCm <= 3.1) read it, no current RCCL does (silently ignored) | NCCL25 | rocm<3.2 (removed) |  |  | yes
NCCL_LL128_THRESHOLD | nccl | fabricated | NCCL_PROTO | never existed in NCCL or RCCL | NCCL_DOC |  |  |  | yes
RCCL_ENABLE_MSCCLPP | rccl | fabricated | RCCL_MSCCLPP_ENABLE | a misspelling in AMD's docs; RCCL reads RCCL_MSCCLPP_ENABLE | RCCL_DOC |  |  |  | yes
HIP_MATRIX_ACCUMULATE_PRECISION | hip | fabricated | torch.set_float32_matmul_precision / compute type | GEMM accumulation is chosen by the compute type | TORCH_HIP |  |  |  | yes
TORCH_HIP_MEM_POOL_ENABLE | torch | fabricated | PYTORCH_HIP_ALLOC_CONF | allocator knobs: PYTORCH_HIP_ALLOC_CONF (= PYTORCH_CUDA_ALLOC_CONF), PYTORCH_NO_HIP_MEMORY_CACHING=1 | TORCH_HIP |  |  |  | yes
HIP_ENABLE_DOUBLE_BUFFER | hip | fabricated |  | no equivalent exists | HIP_ENV |  |  |  | yes
HIP_TRACE_API | hip | legacy | AMD_LOG_LEVEL | HCC era; use AMD_LOG_LEVEL (0-5) + AMD_LOG_MASK (0x1 API calls) | HIP_DBG |  |  |  | yes
HIP_DB | hip | legacy | AMD_LOG_LEVEL | HCC era; use AMD_LOG_LEVEL + AMD_LOG_MASK | HIP_DBG |  |  |  | yes
HIP_COHERENT_HOST_ALLOC | hip | legacy | HIP_HOST_COHERENT |  | HIP_ENV |  |  |  | yes
AMD_LOG_LEVEL | hip | real |  | 0-5 | HIP_DBG |  |  |  | yes
AMD_LOG_MASK | hip | real |  | 0x1 = API calls | HIP_DBG |  |  |  | yes
HIP_HOST_COHERENT | hip | real |  |  | HIP_ENV |  |  |  | yes
HIP_LAUNCH_BLOCKING | hip | real | AMD_SERIALIZE_KERNEL=2 | same as AMD_SERIALIZE_KERNEL=2 (serialise after each launch), not AMD_SERIALIZE_KERNEL in general; for fault localisation AMD_SERIALIZE_KERNEL=3 AMD_SERIALIZE_COPY=3 | CLR_FLAGS |  |  |  | yes
AMD_SERIALIZE_KERNEL | hip | real |  | 1 = wait before, 2 = wait after, 3 = both | CLR_FLAGS |  |  |  | yes
AMD_SERIALIZE_COPY | hip | real |  |  | CLR_FLAGS |  |  |  | yes
HIP_VISIBLE_DEVICES | hip | real |  |  | HIP_ENV |  |  |  | yes
ROCR_VISIBLE_DEVICES | hsa | real |  | filters below HIP; accepts UUIDs | HIP_ENV |  |  |  | yes
CUDA_VISIBLE_DEVICES | hip | real |  |  | HIP_ENV |  |  |  | yes
PYTORCH_ROCM_ARCH | torch | real |  | build time only (--offload-arch list); no effect on a run | TORCH_HIP |  |  |  | yes
HSA_OVERRIDE_GFX_VERSION | hsa | real |  | spoofs the ISA for unsupported GPUs; never set it on MI250/MI300 | HIP_ENV |  |  |  | yes
PYTORCH_TUNABLEOP_ENABLED | torch | real |  | tune once, then ENABLED=1 TUNING=0 | TUNABLE |  |  |  | yes
PYTORCH_TUNABLEOP_TUNING | torch | real |  |  | TUNABLE |  |  |  | yes
PYTORCH_TUNABLEOP_FILENAME | torch | real |  |  | TUNABLE |  |  |  | yes
PYTORCH_TUNABLEOP_VERBOSE | torch | real |  |  | TUNABLE |  |  |  | yes
PYTORCH_TUNABLEOP_MAX_TUNING_DURATION_MS | torch | real |  |  | TUNABLE |  |  |  | yes
TORCH_BLAS_PREFER_HIPBLASLT | torch | real |  | alias of TORCH_BLAS_PREFER_CUBLASLT; =0 forces rocBLAS | TORCH_HIP |  |  |  | yes
HIPBLASLT_ALLOW_TF32 | torch | real |  | XF32 gate on gfx942 (older PyTorch) | TORCH_HIP |  |  | gfx942 | yes
ROCBLAS_INTERNAL_FP16_ALT_IMPL | rocblas | real |  | MI200 fp16/bf16 denormal flush | TORCH_HIP |  |  | gfx90a | yes
MIOPEN_DEBUG_CONVOLUTION_ATTRIB_FP16_ALT_IMPL | miopen | real |  |  | TORCH_HIP |  |  | gfx90a | yes
HSA_NO_SCRATCH_RECLAIM | hsa | real |  | needed on gfx90a with ROCm >= 7.13 for RCCL small-message latency | RCCL_LOG |  |  |  | yes
GPU_MAX_HW_QUEUES | hip | real |  | default 4; AMD: 2 with TORCH_NCCL_HIGH_PRIORITY=1 | MI300 |  |  |  | yes
HIP_FORCE_DEV_KERNARG | hip | real |  | default on for gfx940/941/942 (MI300) from ROCm 6.1 in the CLR source (AMD's page says 6.2); not default on gfx90a | CLR_KERNARG |  |  |  | yes
HSA_XNACK | hsa | real |  | page-fault retry (XNACK); unset leaves the driver's mode (amdgpu module parameter noretry, default -1 = auto: arch and driver decide); 1/0 ask for it on/off for the process | XNACK |  |  |  | yes
HSA_FORCE_FINE_GRAIN_PCIE | hsa | real |  | P2P between PCIe GPUs | HIP_ENV |  |  |  | yes
PYTORCH_HIP_ALLOC_CONF | torch | real |  | expandable_segments:True is honoured on ROCm from PyTorch 2.12 with ROCm >= 7.0 (a no-op before; checked per value) | EXPSEG |  |  |  | yes
PYTORCH_CUDA_ALLOC_CONF | torch | real |  |  | TORCH_HIP |  |  |  | yes
PYTORCH_NO_HIP_MEMORY_CACHING | torch | real |  |  | TORCH_HIP |  |  |  | yes
NCCL_PROTO | rccl | real |  | LL, LL128, Simple (comma list, ^ = all except; per collective 'allreduce:LL;broadcast:Simple' from NCCL/RCCL 2.24.3); narrows the tuner's choices. RCCL 2.21.5 also skips its one hard-coded AllReduce rule when it is set, but that rule runs only on the 16-GCD MI250 topology model (pivotA2ANumBiRings == 3, rome_model_56), not on MI300X | RCCL_TUNE |  |  |  | yes
NCCL_ALGO | rccl | real |  | Ring, Tree on AMD (per collective 'allreduce:tree;broadcast:ring' from NCCL/RCCL 2.24.3); narrows the tuner's choices; the 16-GCD MI250 AllReduce rule of RCCL 2.21.5 is skipped when it is set (not used on MI300X) | RCCL_ENQ |  |  |  | yes
RCCL_OVERRIDE_PROTO | rccl | real |  | forces one protocol outright | RCCL_LOG | rccl>=2.26.6 |  |  | yes
RCCL_OVERRIDE_ALGO | rccl | real |  | forces one algorithm outright | RCCL_LOG | rccl>=2.26.6 |  |  | yes
NCCL_P2P_LL_THRESHOLD | rccl | real |  | P2P only, default 16384 | RCCL_DOC |  |  |  | yes
RCCL_P2P_NET_THRESHOLD | rccl | real |  | default 131072 | RCCL_DOC |  |  |  | yes
RCCL_INTRANET_THRESHOLD | rccl | real |  | default 8388608 | RCCL_DOC |  |  |  | yes
NCCL_LL_BUFFSIZE | rccl | real |  |  | NCCL_DOC |  |  |  | yes
NCCL_LL128_BUFFSIZE | rccl | real |  |  | NCCL_DOC |  |  |  | yes
NCCL_BUFFSIZE | rccl | real |  | default 4 MiB | NCCL_DOC |  |  |  | yes
RCCL_LL128_FORCE_ENABLE | rccl | real |  | RCCL 2.21.5 enables LL128 only on gfx90a nodes whose topology model does (16 GCDs + 8 NICs, rome models 59/65) or when forced; on gfx942 the flag does nothing before ROCm 6.4.2 | RCCL_ROME | gfx942:rocm>=6.4.2 (LL128 on gfx942) |  | gfx90a|gfx942 | yes
NCCL_MIN_NCHANNELS | rccl | real |  | AMD: 112 for MI300X end-to-end workloads on 8 GPUs; RCCL 2.21.5 applies its own MI300X minimums for 2 and 4 ranks (32 / 24); setting it bypasses RCCL's MI300X channel model (>= 2.26.6) | MI300 |  |  |  | yes
NCCL_MAX_NCHANNELS | rccl | real |  |  | NCCL_DOC |  |  |  | yes
NCCL_IB_TIMEOUT | rccl | real |  | 18 in RCCL | NCCL_DOC |  |  |  | yes
NCCL_IB_RETRY_CNT | rccl | real |  | default 7 | NCCL_DOC |  |  |  | yes
NCCL_IB_HCA | rccl | real |  |  | NCCL_DOC |  |  |  | yes
NCCL_IB_GID_INDEX | rccl | real |  | RCCL >= 2.21.5 (ROCm 6.3) defaults to -1 and picks the RoCE v2 GID itself: set it only when NCCL_DEBUG=INFO shows a wrong pick; RCCL <= 2.20 (ROCm <= 6.2) defaults to GID 0, so there set the RoCE v2 index of your fabric (show_gids); 3 is a common site convention, not a rule | IB_GID |  |  |  | yes
NCCL_SOCKET_IFNAME | rccl | real |  |  | NCCL_DOC |  |  |  | yes
NCCL_NET_GDR_LEVEL | rccl | real |  |  | NCCL_DOC |  |  |  | yes
NCCL_CROSS_NIC | rccl | real |  |  | NCCL_DOC |  |  |  | yes
RCCL_MSCCL_ENABLE | rccl | real |  | AMD images set 0; removed with MSCCL in RCCL 2.28.3, which the changelog lists under ROCm 7.13 although ROCm 7.11-7.13 all ship 2.28.3: gated on the ROCm version | RCCL_LOG | rocm<7.13 (removed) |  |  | yes
RCCL_MSCCLPP_ENABLE | rccl | real |  | MSCCL++ is off at build time since RCCL 2.27.7 (ROCm 7.1.0); the variable was removed with MSCCL in RCCL 2.28.3 (ROCm 7.13) | RCCL_LOG | rocm<7.1 (MSCCL++ off at build time; removed in ROCm 7.13) |  |  | yes
NCCL_CUMEM_ENABLE | rccl | real |  | ignored by 2.21.5; said to be required (=1) on Broadcom Thor2 NICs with ROCm >= 7.1 - unverified: no RCCL source or AMD doc found for the Thor2 requirement | RCCL_LOG |  |  |  | unverified
NCCL_DEBUG | rccl | real |  | NONE (documented since RCCL 2.27.7), VERSION, WARN, INFO, ABORT, TRACE | RCCL_DOC |  |  |  | yes
NCCL_DEBUG_SUBSYS | rccl | real |  |  | NCCL_DOC |  |  |  | yes
NCCL_DEBUG_FILE | rccl | real |  |  | NCCL_DOC |  |  |  | yes
NCCL_NVLS_ENABLE | nccl | real |  | NVIDIA only (NVLink SHARP) | NCCL_DOC |  |  | nvidia | yes
TORCH_NCCL_ASYNC_ERROR_HANDLING | torch | real |  | 3 (default): tear down without abort; flight-recorder dumps need 3 | PG_NCCL |  |  |  | yes
TORCH_NCCL_BLOCKING_WAIT | torch | real |  |  | PG_NCCL |  |  |  | yes
TORCH_NCCL_ENABLE_MONITORING | torch | real |  |  | PG_NCCL |  |  |  | yes
TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC | torch | real |  | default 480 s | PG_NCCL |  |  |  | yes
TORCH_FR_BUFFER_SIZE | torch | real |  | flight-recorder entries (2000); PyTorch 2.7 reads TORCH_NCCL_TRACE_BUFFER_SIZE instead | FR | torch>=2.8 |  |  | yes
TORCH_NCCL_TRACE_BUFFER_SIZE | torch | real |  | the name PyTorch <= 2.7 reads; still read from 2.8 as the old spelling | FR_OLD |  | TORCH_FR_BUFFER_SIZE |  | yes
TORCH_NCCL_DUMP_ON_TIMEOUT | torch | real |  |  | PG_NCCL |  |  |  | yes
TORCH_FR_DUMP_TEMP_FILE | torch | real |  | dump prefix, one file per rank; PyTorch 2.7 reads TORCH_NCCL_DEBUG_INFO_TEMP_FILE instead | FR | torch>=2.8 |  |  | yes
TORCH_NCCL_DEBUG_INFO_TEMP_FILE | torch | real |  | the name PyTorch <= 2.7 reads; still read from 2.8 as the old spelling | FR_OLD |  | TORCH_FR_DUMP_TEMP_FILE |  | yes
TORCH_NCCL_DESYNC_DEBUG | torch | real |  |  | PG_NCCL |  |  |  | yes
TORCH_NCCL_HIGH_PRIORITY | torch | real |  |  | PG_NCCL |  |  |  | yes
"""
_SOURCES = {
    "RCCL_DOC": _RCCL_DOC, "NCCL_DOC": _NCCL_DOC, "RCCL_LOG": _RCCL_LOG, "RCCL_TUNE": _RCCL_TUNE,
    "RCCL_ENQ": _RCCL_ENQ, "RCCL_ROME": _RCCL_ROME, "PG_NCCL": _PG_NCCL, "FR": _FR,
    "FR_OLD": _FR_OLD, "CLR_FLAGS": _CLR_FLAGS, "CLR_KERNARG": _CLR_KERNARG, "HIP_DBG": _HIP_DBG,
    "HIP_ENV": _HIP_ENV, "TORCH_HIP": _TORCH_HIP, "TUNABLE": _TUNABLE, "MI300": _MI300,
    "NCCL25": _NCCL25, "EXPSEG": _EXPSEG, "XNACK": _XNACK, "IB_GID": _IB_GID,
}  # fmt: skip

#: value-level gate: the per-collective NCCL_PROTO / NCCL_ALGO syntax (``allreduce:tree;broadcast:ring``)
PER_COLLECTIVE_GATE = Gate("rccl", ">=", (2, 24, 3), "per-collective syntax")
PER_COLLECTIVE_SOURCE = _NCCL_2243
#: value-level gates: ``expandable_segments:True`` in the allocator config is honoured on ROCm only
#: from PyTorch 2.12 built with ROCm >= 7.0 (a no-op before)
EXPANDABLE_SEGMENTS_GATES = (
    Gate("torch", ">=", (2, 12), "expandable segments on ROCm"),
    Gate("rocm", ">=", (7, 0), "expandable segments on ROCm"),
)
EXPANDABLE_SEGMENTS_SOURCE = _EXPSEG
_ALLOC_CONF = ("PYTORCH_HIP_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
#: knobs that are already on by default where the gate holds (setting them =1 there changes nothing)
DEFAULT_ON: dict[str, Gate] = {
    "HIP_FORCE_DEV_KERNARG": Gate("rocm", ">=", (6, 1), "", ("gfx940", "gfx941", "gfx942")),
}


def _gates(text: str) -> tuple[Gate, ...]:
    return tuple(Gate.parse(part) for part in text.split("&") if part.strip())


def _load(table: str) -> list[EnvVar]:
    """Rows of ``_TABLE`` → entries (a malformed row fails at import, naming the row)."""
    out = []
    for line in table.strip().splitlines():
        cols = [c.strip() for c in line.split(" | ")]
        if len(cols) != 10:
            raise ValueError(f"registry row {line[:40]!r}: {len(cols)} columns, expected 10")
        name, comp, status, repl, note, src, gates, alias, archs, verified = cols
        out.append(EnvVar(name, comp, status, repl or None, note, _SOURCES[src], _gates(gates),
                          alias or None, tuple(a for a in archs.split("|") if a),
                          verified == "yes"))  # type: ignore[arg-type]  # fmt: skip
    return out


_ENTRIES = _load(_TABLE)

#: every known variable, by name
ENV_VARS: dict[str, EnvVar] = {e.name: e for e in _ENTRIES}

#: real NCCL_PROTO tokens (case-insensitive) and NCCL_ALGO tokens usable on AMD (+ NVIDIA-only ones)
PROTO_TOKENS = ("LL", "LL128", "Simple")
ALGO_TOKENS = ("Ring", "Tree")
ALGO_TOKENS_OTHER = ("CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
#: collective names of the per-collective syntax (NCCL's ncclFuncStr, case-insensitive)
COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
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


def _simple_list(
    text: str, value: str, *, field: str, allowed: tuple[str, ...], allow_exclude: bool
) -> list[str]:
    """``"^ll,simple"`` → ``["^", "LL", "Simple"]`` (the comma-list form, one collective or all)."""
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


def _per_collective(text: str, value: str, *, field: str, allowed: tuple[str, ...]) -> list[str]:
    """``"allreduce:tree;broadcast:ring"`` → ``["allreduce:Tree", "broadcast:Ring"]``.

    NCCL >= 2.24.3 takes ``coll:list`` groups separated by ``;`` (each list may start with ``^``); a
    group without ``coll:`` is the default for the other collectives.
    """
    out: list[str] = []
    for group in (g.strip() for g in text.split(";")):
        if not group:
            raise ValueError(
                f"{field}={value!r}: empty group between ';'; write e.g. 'allreduce:tree;broadcast:ring'"
            )
        coll, sep, rest = group.partition(":")
        if not sep:
            toks = _simple_list(group, value, field=field, allowed=allowed, allow_exclude=True)
            out.append(_join(toks))
            continue
        if coll.strip().lower() not in COLLECTIVES:
            raise ValueError(
                f"{field}={value!r}: unknown collective {coll.strip()!r}; allowed (case-insensitive): "
                f"{', '.join(COLLECTIVES)}"
            )
        toks = _simple_list(rest.strip(), value, field=field, allowed=allowed, allow_exclude=True)
        out.append(f"{coll.strip().lower()}:{_join(toks)}")
    return out


def _join(tokens: list[str]) -> str:
    return ("^" if tokens and tokens[0] == "^" else "") + ",".join(t for t in tokens if t != "^")


def is_per_collective(value: str) -> bool:
    """True for the ``coll:list;coll:list`` form of NCCL_PROTO / NCCL_ALGO."""
    return ":" in str(value) or ";" in str(value)


def parse_token_list(
    value: str,
    *,
    field: str,
    allowed: tuple[str, ...],
    allow_exclude: bool = True,
    per_collective: bool | None = None,
) -> list[str]:
    """Validate an NCCL_PROTO / NCCL_ALGO style value; return canonical tokens.

    ``"ll,simple"`` → ``["LL", "Simple"]``; ``"^LL128"`` → ``["^", "LL128"]``;
    ``"allreduce:tree;broadcast:ring"`` → ``["allreduce:Tree", "broadcast:Ring"]`` (per-collective form,
    allowed where ``per_collective``, by default wherever ``^`` is). Raises ValueError naming ``field``,
    the bad value and the allowed set (RCCL 2.21.5 silently ignores unknown tokens; newer RCCL fails
    communicator init, so a typo must stop the run before launch).
    """
    text = str(value).strip()
    if per_collective is None:
        per_collective = allow_exclude
    if per_collective and is_per_collective(text):
        return _per_collective(text, value, field=field, allowed=allowed)
    return _simple_list(text, value, field=field, allowed=allowed, allow_exclude=allow_exclude)


def gate_problems(name: str, versions: Versions) -> list[str]:
    """Why ``name`` is not read with ``versions`` (one line per failing gate; unknown versions pass)."""
    entry = ENV_VARS.get(name)
    if entry is None:
        return []
    out = []
    for gate in entry.gates:
        have = versions.of(gate.component)
        if have is None or not gate.applies_to(versions.arch):
            continue
        problem = gate.problem(name, have)
        if problem:
            out.append(problem)
    return out


def version_problem(
    name: str, version: Version | None = None, *, versions: Versions | None = None
) -> str | None:
    """Why ``name`` has no effect (None when fine or when unknown); ``version`` is the RCCL version."""
    have = versions or Versions()
    if version is not None:
        have = Versions(have.torch, tuple(version), have.rocm, have.arch)
    problems = gate_problems(name, have)
    return problems[0] if problems else None


def is_gated(name: str) -> bool:
    """True when some release of RCCL, ROCm or PyTorch does not read ``name``."""
    entry = ENV_VARS.get(name)
    return entry is not None and bool(entry.gates)


def gate_components(name: str) -> set[str]:
    """The components whose version ``name``'s gates compare (``{"rocm"}`` for RCCL_MSCCL_ENABLE)."""
    entry = ENV_VARS.get(name)
    return {g.component for g in entry.gates} if entry else set()


def is_default_on(name: str, versions: Versions) -> bool:
    """True when ``name`` is already on by default for ``versions`` (arch and version known)."""
    gate = DEFAULT_ON.get(name)
    if gate is None or not gate.archs or versions.arch not in gate.archs:
        return False
    have = versions.of(gate.component)
    return have is not None and gate.problem(name, have) is None


def valid_for_arch(name: str, arch: str | None, versions: Versions | None = None) -> str | None:
    """Why a preset for ``arch`` must not set ``name`` (None when it may).

    Unknown names, invented/dead names, unverified claims, knobs without effect on ``arch`` and knobs
    whose arch-specific gate fails at ``versions`` are refused.
    """
    entry = ENV_VARS.get(name)
    if entry is None:
        return f"{name} is not in the registry (no source for it)"
    if entry.status in _BAD:
        return f"{name} is {entry.status}"
    if not entry.verified:
        return f"{name} is unverified: {entry.note}"
    if arch is not None and entry.archs:
        family = "nvidia" if arch.startswith("sm_") else arch
        if family not in entry.archs:
            return f"{name} has an effect only on {', '.join(entry.archs)}, not on {arch}"
    have = versions or Versions(arch=arch)
    have = Versions(have.torch, have.rccl, have.rocm, arch)
    for gate in entry.gates:
        if gate.archs and gate.applies_to(arch):
            comp_v = have.of(gate.component)
            if comp_v is None or gate.problem(name, comp_v):
                return f"{name} on {arch} needs {gate.text()} ({gate.why or 'version gate'})"
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


def _unknown_name(name: str) -> list[Finding]:
    """A "did you mean" warning for an unknown collective/PG name close to a real one."""
    if not name.startswith(("NCCL_", "RCCL_", "TORCH_NCCL_", "TORCH_FR_")):
        return []
    near = _close_match(name)
    if not near:
        return []
    return [Finding(name, "warning", f"{name} is not a known knob; did you mean {near}?", near)]


def _value_findings(name: str, value: str, entry: EnvVar, versions: Versions) -> list[Finding]:
    """Bad NCCL_PROTO/NCCL_ALGO/RCCL_OVERRIDE_* values, and the per-collective form on old RCCL."""
    if name not in ("NCCL_PROTO", "NCCL_ALGO", "RCCL_OVERRIDE_PROTO", "RCCL_OVERRIDE_ALGO"):
        return []
    allowed = PROTO_TOKENS if name.endswith("PROTO") else ALGO_TOKENS + ALGO_TOKENS_OTHER
    override = name.startswith("RCCL_OVERRIDE")
    try:
        parse_token_list(value, field=name, allowed=allowed, allow_exclude=not override)
    except ValueError as exc:
        return [Finding(name, "error", str(exc), None, entry.source)]
    if not override and is_per_collective(value) and versions.rccl is not None:
        problem = PER_COLLECTIVE_GATE.problem(f"{name}={value!r}", versions.rccl)
        if problem:
            return [Finding(name, "warning", problem, None, PER_COLLECTIVE_SOURCE)]
    return []


def _asks_expandable_segments(value: str) -> bool:
    """True when an allocator config (``key:value,key:value``) turns expandable_segments on."""
    for part in value.split(","):
        key, _, val = part.partition(":")
        if key.strip() == "expandable_segments" and val.strip().lower() in ("true", "1"):
            return True
    return False


def _real_findings(
    name: str, value: str, entry: EnvVar, versions: Versions, rocm: bool | None
) -> list[Finding]:
    """Findings for a real (or still-read alias) name found in the environment."""
    out: list[Finding] = []
    if entry.alias_of:
        msg = f"{name} is the old spelling of {entry.alias_of} (still read)"
        out.append(Finding(name, "info", msg, entry.alias_of, entry.source))
    out += _value_findings(name, value, entry, versions)
    is_collective = entry.component in ("rccl", "nccl")
    if rocm is not False or not is_collective:
        out += [
            Finding(name, "warning", p, None, entry.source) for p in gate_problems(name, versions)
        ]
    if rocm is False and name.startswith("RCCL_"):
        msg = f"{name} is read only by RCCL (AMD); NVIDIA NCCL ignores it"
        out.append(Finding(name, "info", msg, None, entry.source))
    if value.strip() == "1" and is_default_on(name, versions):
        gate = DEFAULT_ON[name]
        msg = (
            f"{name}=1 is already the default on {versions.arch} with "
            f"{COMPONENT_NAMES[gate.component]} >= {_show(gate.version)}"
        )
        out.append(Finding(name, "info", msg, None, entry.source))
    if name in _ALLOC_CONF and rocm and _asks_expandable_segments(value):
        for gate in EXPANDABLE_SEGMENTS_GATES:
            have = versions.of(gate.component)
            problem = gate.problem(f"{name}=expandable_segments:True", have) if have else None
            if problem:
                out.append(Finding(name, "warning", problem, None, EXPANDABLE_SEGMENTS_SOURCE))
    if name == "HSA_OVERRIDE_GFX_VERSION":
        out.append(Finding(name, "warning", describe(entry), None, entry.source))
    if name == "PYTORCH_ROCM_ARCH":
        out.append(Finding(name, "info", describe(entry), None, entry.source))
    return out


def check_environment(
    environ: Mapping[str, str],
    *,
    rccl_version: Version | None = None,
    rocm: bool | None = None,
    versions: Versions | None = None,
) -> list[Finding]:
    """Inspect an environment (``os.environ`` or a dict): invented/legacy names, bad values, gates.

    ``versions`` (PyTorch, RCCL, ROCm, arch) enables the version gates; ``rccl_version`` is the
    short form for the RCCL version alone (``platform.nccl_version()`` on a ROCm build). ``rocm``
    tells whether RCCL (True) or NVIDIA NCCL (False) reads the collective knobs (None: unknown).
    """
    have = versions or Versions()
    if rccl_version is not None:
        have = Versions(have.torch, tuple(rccl_version), have.rocm, have.arch)
    findings: list[Finding] = []
    for name in sorted(environ):
        bad = check_name(name)
        if bad is not None:
            findings.append(bad)
            continue
        entry = ENV_VARS.get(name)
        if entry is None:
            findings += _unknown_name(name)
            continue
        findings += _real_findings(name, environ[name], entry, have, rocm)
    return findings
