"""Per-rank device and CPU/NUMA binding inside a job (one process per GPU).

    from rocmtrain.launch.binding import bind_local_rank
    b = bind_local_rank(accelerator="gpu")     # in the strategy's setup_environment
    log.info("%s", b.describe())               # rank 3 -> cuda:3 = 0000:c1:00.0, NUMA 1, CPUs 48-95

Device: every rank sees all GPUs the job got on its node (Slurm's ``--gpus-per-node``), and
Lightning selects ``cuda:<local rank>`` (``torch.cuda.set_device``) from ``SLURMEnvironment``'s
``SLURM_LOCALID``. rocmtrain does *not* narrow ``ROCR_VISIBLE_DEVICES``/``HIP_VISIBLE_DEVICES``/
``CUDA_VISIBLE_DEVICES`` per rank: Lightning indexes devices by local rank (a rank that sees one GPU
would ask for ``cuda:3`` and fail), and RCCL/NCCL find intra-node peers (XGMI/NVLink P2P) best with
all node GPUs visible. Nothing here touches CUDA, so it can run before CUDA is initialised.

CPU/NUMA: the rank's GPU is found from the visible-device variables and sysfs (ROCm: KFD topology
order, which HIP uses; CUDA: PCI bus order), its NUMA node from
``/sys/bus/pci/devices/<bdf>/numa_node`` and that node's CPUs from
``/sys/devices/system/node/node<N>/cpulist``; ``os.sched_setaffinity`` pins the rank to them,
intersected with the CPUs Slurm allowed. Every function takes ``root`` so tests use a fake sysfs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

AMD_VENDOR = 0x1002
NVIDIA_VENDOR = 0x10DE
_DISPLAY_CLASS = 0x03  # PCI base class "display controller" (VGA 0x0300, 3D 0x0302, other 0x0380)


class BindingError(RuntimeError):
    """The rank cannot get a GPU of its own (e.g. per-task GPU binding); the message says the fix."""


@dataclass(frozen=True)
class Binding:
    """What a rank was bound to."""

    local_rank: int
    device_index: int | None
    """``cuda:<index>`` of this rank (None on CPU)."""
    pci_address: str | None
    """PCI address of the GPU (``0000:c1:00.0``), when sysfs shows it."""
    numa_node: int | None
    """NUMA node of the GPU (None: unknown or a single-node machine)."""
    cpus: tuple[int, ...] | None
    """CPUs the rank is pinned to (None: affinity left as Slurm set it)."""
    note: str = ""
    """Why the affinity was left alone, when it was."""

    def describe(self) -> str:
        dev = "cpu" if self.device_index is None else f"cuda:{self.device_index}"
        if self.pci_address:
            dev += f" = {self.pci_address}"
        numa = "?" if self.numa_node is None else str(self.numa_node)
        cpus = format_cpulist(self.cpus) if self.cpus else f"unchanged ({self.note})"
        return f"local rank {self.local_rank} -> {dev}, NUMA {numa}, CPUs {cpus}"


# -- pure helpers ------------------------------------------------------------------------------
def parse_cpulist(text: str) -> list[int]:
    """``"0-3,8,10-11"`` → ``[0, 1, 2, 3, 8, 10, 11]`` (the kernel's cpulist format)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(cpus))


def format_cpulist(cpus: Sequence[int]) -> str:
    """Inverse of :func:`parse_cpulist`: ``[0, 1, 2, 5]`` → ``"0-2,5"``."""
    out: list[str] = []
    items = sorted(set(cpus))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _kfd_gpus(root: Path) -> list[str]:
    """PCI addresses of AMD GPUs in KFD topology order (the order ROCr/HIP number them)."""
    nodes = root / "sys/class/kfd/kfd/topology/nodes"
    if not nodes.is_dir():
        return []
    found: list[str] = []
    for node in sorted((p for p in nodes.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        props: dict[str, int] = {}
        for line in (_read(node / "properties") or "").splitlines():
            key, _, value = line.partition(" ")
            if value.strip().lstrip("-").isdigit():
                props[key] = int(value)
        if not props.get("gpu_id") or not props.get("simd_count"):
            continue  # a CPU node
        loc, domain = props.get("location_id", 0), props.get("domain", 0)
        found.append(f"{domain:04x}:{loc >> 8:02x}:{(loc >> 3) & 0x1F:02x}.{loc & 0x7}")
    return found


def _pci_gpus(root: Path, vendor: int) -> list[str]:
    """PCI addresses of ``vendor``'s display devices in bus order (CUDA's PCI_BUS_ID order)."""
    devices = root / "sys/bus/pci/devices"
    if not devices.is_dir():
        return []
    found = []
    for dev in sorted(devices.iterdir(), key=lambda p: p.name):
        ven, cls = _read(dev / "vendor"), _read(dev / "class")
        if ven and cls and int(ven, 16) == vendor and int(cls, 16) >> 16 == _DISPLAY_CLASS:
            found.append(dev.name)
    return found


def gpu_pci_addresses(*, rocm: bool, root: Path = Path("/")) -> list[str]:
    """Physical GPUs of this node in the runtime's numbering (before any ``*_VISIBLE_DEVICES``)."""
    if rocm:
        return _kfd_gpus(root) or _pci_gpus(root, AMD_VENDOR)
    # CUDA's default FASTEST_FIRST order equals PCI bus order on a node of identical GPUs
    return _pci_gpus(root, NVIDIA_VENDOR)


def _select(ids: list[int], spec: str | None, *, var: str) -> list[int] | None:
    """Apply one ``*_VISIBLE_DEVICES`` value (indices) to ``ids``; None when it uses UUIDs."""
    if spec is None:
        return ids
    out: list[int] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        if not item.lstrip("-").isdigit():
            return None  # GPU-<uuid> / MIG-...: not resolvable from sysfs
        k = int(item)
        if k < 0:
            break  # CUDA/HIP stop at the first invalid index
        if k >= len(ids):
            raise BindingError(
                f"{var}={spec!r} names device {k}, but only {len(ids)} are visible at that level"
            )
        out.append(ids[k])
    return out


def visible_physical(count: int, environ: Mapping[str, str], *, rocm: bool) -> list[int] | None:
    """Physical index of each visible device ordinal (None when a variable uses UUIDs).

    ROCm: ``ROCR_VISIBLE_DEVICES`` filters first (empty: no GPU), then ``HIP_VISIBLE_DEVICES``
    (or, if unset or empty, ``CUDA_VISIBLE_DEVICES``) indexes what ROCr left; an empty list there
    filters nothing (clr ``rocdevice.cpp``, ``Device::init``). CUDA: ``CUDA_VISIBLE_DEVICES``
    (empty: no GPU).
    """
    ids: list[int] | None = list(range(count))
    if rocm:
        ids = _select(ids, environ.get("ROCR_VISIBLE_DEVICES"), var="ROCR_VISIBLE_DEVICES")
        hip_var = (
            "HIP_VISIBLE_DEVICES" if environ.get("HIP_VISIBLE_DEVICES") else "CUDA_VISIBLE_DEVICES"
        )
        if ids is not None and environ.get(hip_var):
            ids = _select(ids, environ[hip_var], var=hip_var)
        return ids
    return _select(ids, environ.get("CUDA_VISIBLE_DEVICES"), var="CUDA_VISIBLE_DEVICES")


def numa_node_of(pci_address: str, *, root: Path = Path("/")) -> int | None:
    """NUMA node of a PCI device (None when the kernel reports -1 or nothing)."""
    text = _read(root / "sys/bus/pci/devices" / pci_address / "numa_node")
    if text is None or not text.lstrip("-").isdigit() or int(text) < 0:
        return None
    return int(text)


def node_cpus(node: int, *, root: Path = Path("/")) -> list[int]:
    """CPUs of NUMA node ``node`` (empty when sysfs does not say)."""
    text = _read(root / f"sys/devices/system/node/node{node}/cpulist")
    return parse_cpulist(text) if text else []


def plan_binding(
    local_rank: int,
    *,
    accelerator: str,
    environ: Mapping[str, str],
    allowed_cpus: Sequence[int],
    rocm: bool,
    local_tasks: int | None = None,
    root: Path = Path("/"),
) -> Binding:
    """Decide the binding of ``local_rank`` (pure: reads only files under ``root``)."""
    if accelerator == "cpu":
        return Binding(local_rank, None, None, None, None, "CPU run: affinity left to Slurm")
    physical = gpu_pci_addresses(rocm=rocm, root=root)
    visible = visible_physical(len(physical), environ, rocm=rocm) if physical else None
    if visible is not None:
        need = max(local_rank + 1, local_tasks or 0)
        if need > len(visible):
            raise BindingError(
                f"local rank {local_rank} (of {local_tasks or '?'} ranks on this node) needs its "
                f"own GPU but this process sees {len(visible)} GPU(s) ({_visible_vars(environ)}). "
                "Each rank must see all GPUs of its node: request them per node "
                "(cluster.gpus_per_node, rendered as --gpus-per-node) and do not add "
                "--gpus-per-task or --gpu-bind to cluster.srun_args"
            )
    if not physical or visible is None:
        why = "no GPU in sysfs" if not physical else "visible devices given as UUIDs"
        return Binding(local_rank, local_rank, None, None, None, why)
    pci = physical[visible[local_rank]]
    node = numa_node_of(pci, root=root)
    if node is None:
        return Binding(local_rank, local_rank, pci, None, None, "GPU has no NUMA node")
    cpus = sorted(set(node_cpus(node, root=root)) & set(allowed_cpus))
    if not cpus:
        return Binding(local_rank, local_rank, pci, node, None, "no allowed CPU on the GPU's node")
    return Binding(local_rank, local_rank, pci, node, tuple(cpus))


def _visible_vars(environ: Mapping[str, str]) -> str:
    names = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    shown = [f"{n}={environ[n]}" for n in names if n in environ]
    return ", ".join(shown) or "no *_VISIBLE_DEVICES set"


# -- the call a rank makes -----------------------------------------------------------------------
def bind_local_rank(
    local_rank: int | None = None,
    *,
    accelerator: str = "gpu",
    numa: bool = True,
    rocm: bool | None = None,
    environ: Mapping[str, str] | None = None,
    root: Path = Path("/"),
    apply: bool = True,
) -> Binding:
    """Bind this rank's CPUs to its GPU's NUMA node; returns what was decided (and logs it).

    ``local_rank`` defaults to ``SLURM_LOCALID`` (then ``LOCAL_RANK``, then 0); ``rocm`` to
    ``rocmtrain.platform.is_rocm()``. Does not initialise CUDA; the device itself is selected by
    Lightning (``cuda:<local rank>``).
    """
    from rocmtrain import platform

    env = os.environ if environ is None else environ
    if local_rank is None:
        local_rank = int(env.get("SLURM_LOCALID", env.get("LOCAL_RANK", "0")))
    tasks = env.get("SLURM_NTASKS_PER_NODE", "").split("(")[0]
    binding = plan_binding(
        local_rank,
        accelerator=accelerator,
        environ=env,
        allowed_cpus=sorted(os.sched_getaffinity(0)),
        rocm=platform.is_rocm() if rocm is None else rocm,
        local_tasks=int(tasks) if tasks.isdigit() else None,
        root=root,
    )
    if not numa and binding.cpus:
        binding = Binding(
            local_rank, binding.device_index, binding.pci_address, binding.numa_node, None, "off"
        )
    if apply and binding.cpus:
        os.sched_setaffinity(0, binding.cpus)
    log.info("binding: %s", binding.describe())
    return binding
