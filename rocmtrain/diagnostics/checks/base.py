"""Doctor building blocks: a check result, the inputs every check reads, and the gathered GPU facts.

Checks are pure functions of :class:`Inputs` (environment mapping, ``/proc`` root, home and ``/etc``
paths, a command runner) and :class:`GpuFacts`, so tests feed real files and recorded tool outputs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from rocmtrain import platform
from rocmtrain.diagnostics import sources
from rocmtrain.diagnostics.parsers._common import DeviceRecord

Status = Literal["ok", "warn", "error", "skip"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "error", "skip")


@dataclass
class Check:
    """One doctor verdict: ``status`` with the ``evidence`` it is based on and the ``fix``."""

    name: str
    status: Status
    evidence: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class TorchBuild:
    """What the version checks read about the installed torch (tests substitute a recorded one)."""

    version: tuple[int, ...]
    hip: tuple[int, ...] | None = None
    """``torch.version.hip`` (None off ROCm builds)."""
    rocm: tuple[int, ...] | None = None
    """The ROCm release: ``torch.version.rocm`` where it exists, else ``hip``."""
    cuda: str | None = None
    """``torch.version.cuda`` on NVIDIA builds."""
    nccl: tuple[int, ...] | None = None
    """RCCL (ROCm) or NCCL (CUDA) version; None without the library."""

    @classmethod
    def live(cls) -> TorchBuild:
        """This process's torch."""
        import torch

        return cls(
            platform.torch_version(),
            platform.hip_version(),
            platform.rocm_version(),
            torch.version.cuda if platform.is_cuda_build() else None,
            platform.nccl_version(),
        )

    @property
    def is_rocm(self) -> bool:
        return self.hip is not None


@dataclass
class Inputs:
    """Everything the checks read from the machine (tests substitute real files / outputs)."""

    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    proc: Path = Path("/proc")
    home: Path = field(default_factory=Path.home)
    etc: Path = Path("/etc")
    run: sources.Runner = sources.run_command
    headroom_fraction: float = 0.10
    live: bool = True
    """Probe torch / amdsmi / NVML in this process; False = only the runner's tool outputs."""
    torch_build: TorchBuild | None = None
    """The torch the version checks judge (None: this process's, :meth:`TorchBuild.live`)."""
    package_version: Callable[[str], str | None] = platform.package_version
    """Installed version of a distribution, or None (tests pass a recorded ``pip list``)."""


@dataclass
class GpuFacts:
    """GPU facts per source and merged (torch first, then library, then CLIs)."""

    backend: str  #: "rocm" | "cuda" | "cpu" as torch sees it (or inferred from tool outputs)
    torch: list[DeviceRecord]
    library: list[DeviceRecord]
    library_name: str | None
    cli: dict[str, list[DeviceRecord]]
    devices: list[DeviceRecord]

    @property
    def amd(self) -> bool:
        return any(_is_amd(d) for d in self.devices) or self.backend == "rocm"

    @property
    def instinct(self) -> list[DeviceRecord]:
        return [d for d in self.devices if _is_instinct(d)]

    def sources_used(self) -> list[str]:
        used = ["torch"] if self.torch else []
        used += [self.library_name] if self.library and self.library_name else []
        return used + sorted(self.cli)


def _is_amd(d: DeviceRecord) -> bool:
    return d.gfx_arch is not None or (d.device_id or "") in platform.AMD_DEVICE_IDS


def _is_instinct(d: DeviceRecord) -> bool:
    return d.gfx_arch in platform.CDNA_ARCHS or (d.device_id or "") in platform.AMD_DEVICE_IDS


def gather_gpu_facts(inputs: Inputs) -> GpuFacts:
    """Collect devices from every available source, in the documented order, and merge them."""
    torch_devs: list[DeviceRecord] = []
    library: list[DeviceRecord] = []
    library_name = None
    if inputs.live:
        torch_devs = sources.torch_devices()
        if platform.is_rocm():
            library, library_name = sources.amdsmi_devices(), "amdsmi"
        elif platform.is_cuda_build():
            library, library_name = sources.nvml_devices(), "pynvml"
    cli = sources.cli_devices(inputs.run)
    ordered = [cli[k] for k in ("rocminfo", "amd-smi", "rocm-smi", "nvidia-smi") if k in cli]
    devices = sources.merge_devices(torch_devs, library, *ordered)
    if inputs.live and platform.has_gpu():
        backend = platform.runtime()
    elif any(_is_amd(d) for d in devices):
        backend = "rocm"
    elif "nvidia-smi" in cli and cli["nvidia-smi"]:
        backend = "cuda"
    else:
        backend = "cpu"
    return GpuFacts(backend, torch_devs, library, library_name, cli, devices)


def read_text(path: Path) -> str | None:
    """File contents, or None when it does not exist / cannot be read."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None
