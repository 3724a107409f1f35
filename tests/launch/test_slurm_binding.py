"""Device and CPU/NUMA binding on synthetic sysfs trees written here (an MI300X-like node).

The trees follow the kernel's layouts: KFD topology ``properties`` files (``location_id`` =
bus << 8 | device << 3 | function), ``/sys/bus/pci/devices/<bdf>/{vendor,class,numa_node}`` and
``/sys/devices/system/node/node<N>/cpulist``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rocmtrain.launch.binding import (
    BindingError,
    bind_local_rank,
    format_cpulist,
    gpu_pci_addresses,
    parse_cpulist,
    plan_binding,
    visible_physical,
)

# 8 GPUs: KFD enumerates them in this (non-bus) order, as on real MI300X nodes
BUSES = [0x05, 0x26, 0x46, 0x65, 0x85, 0xA5, 0xC5, 0xE5]
KFD_ORDER = [0x85, 0x05, 0xA5, 0x26, 0xC5, 0x46, 0xE5, 0x65]
ALL_CPUS = list(range(0, 16))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_node(root: Path, *, vendor: int = 0x1002, kfd: bool = True, numa_of_bus=None) -> Path:
    numa_of_bus = numa_of_bus or (lambda bus: 0 if bus < 0x80 else 1)
    _write(root / "sys/devices/system/node/node0/cpulist", "0-7\n")
    _write(root / "sys/devices/system/node/node1/cpulist", "8-15\n")
    for bus in BUSES:
        dev = root / f"sys/bus/pci/devices/0000:{bus:02x}:00.0"
        _write(dev / "vendor", f"0x{vendor:04x}\n")
        _write(dev / "class", "0x038000\n" if vendor == 0x1002 else "0x030200\n")
        _write(dev / "numa_node", f"{numa_of_bus(bus)}\n")
    # a NIC and the host bridge: not GPUs
    _write(root / "sys/bus/pci/devices/0000:01:00.0/vendor", "0x15b3\n")
    _write(root / "sys/bus/pci/devices/0000:01:00.0/class", "0x020000\n")
    _write(root / "sys/bus/pci/devices/0000:00:00.0/vendor", f"0x{vendor:04x}\n")
    _write(root / "sys/bus/pci/devices/0000:00:00.0/class", "0x060000\n")
    if kfd:
        nodes = root / "sys/class/kfd/kfd/topology/nodes"
        _write(nodes / "0/properties", "cpu_cores_count 96\nsimd_count 0\ngpu_id 0\n")
        _write(nodes / "1/properties", "cpu_cores_count 96\nsimd_count 0\ngpu_id 0\n")
        for i, bus in enumerate(KFD_ORDER, start=2):
            loc = bus << 8
            _write(
                nodes / f"{i}/properties",
                f"simd_count 1216\nlocation_id {loc}\ndomain 0\ngpu_id {4000 + i}\n",
            )
    return root


def test_cpulist_roundtrip() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert parse_cpulist(format_cpulist([5])) == [5]


def test_rocm_order_is_kfd_topology_order(tmp_path: Path) -> None:
    root = make_node(tmp_path)
    assert gpu_pci_addresses(rocm=True, root=root) == [f"0000:{b:02x}:00.0" for b in KFD_ORDER]
    # without KFD (e.g. container without /sys/class/kfd) fall back to PCI bus order
    assert gpu_pci_addresses(rocm=True, root=make_node(tmp_path / "nokfd", kfd=False)) == [
        f"0000:{b:02x}:00.0" for b in BUSES
    ]


def test_cuda_order_is_pci_bus_order(tmp_path: Path) -> None:
    root = make_node(tmp_path, vendor=0x10DE, kfd=False)
    assert gpu_pci_addresses(rocm=False, root=root) == [f"0000:{b:02x}:00.0" for b in BUSES]
    assert gpu_pci_addresses(rocm=True, root=root) == []  # no AMD GPU there


def test_visible_devices_layering() -> None:
    # ROCR filters physical GPUs, then HIP indexes what ROCR left
    env = {"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "1,3"}
    assert visible_physical(8, env, rocm=True) == [5, 7]
    assert visible_physical(8, {"CUDA_VISIBLE_DEVICES": "2,0"}, rocm=True) == [2, 0]
    assert visible_physical(8, {"CUDA_VISIBLE_DEVICES": "3,-1,4"}, rocm=False) == [3]
    assert visible_physical(8, {"CUDA_VISIBLE_DEVICES": "GPU-1234"}, rocm=False) is None
    with pytest.raises(BindingError, match="HIP_VISIBLE_DEVICES"):
        visible_physical(8, {"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "2"}, rocm=True)


def test_empty_visible_devices_as_hip_and_rocr_read_them() -> None:
    """HIP uses HIP_VISIBLE_DEVICES only when non-empty, else CUDA_VISIBLE_DEVICES, and an empty
    list filters nothing (clr rocdevice.cpp); an empty ROCR_VISIBLE_DEVICES leaves no GPU, and on
    NVIDIA an empty CUDA_VISIBLE_DEVICES does."""
    env = {"HIP_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "2,0"}
    assert visible_physical(8, env, rocm=True) == [2, 0]
    assert visible_physical(8, {"HIP_VISIBLE_DEVICES": ""}, rocm=True) == list(range(8))
    assert visible_physical(8, {"CUDA_VISIBLE_DEVICES": ""}, rocm=True) == list(range(8))
    env = {
        "ROCR_VISIBLE_DEVICES": "4,5,6,7",
        "HIP_VISIBLE_DEVICES": "",
        "CUDA_VISIBLE_DEVICES": "1",
    }
    assert visible_physical(8, env, rocm=True) == [5]
    assert visible_physical(8, {"ROCR_VISIBLE_DEVICES": ""}, rocm=True) == []
    assert visible_physical(8, {"CUDA_VISIBLE_DEVICES": ""}, rocm=False) == []


@pytest.mark.parametrize("local_rank", range(8))
def test_each_rank_gets_its_gpus_numa_node(tmp_path: Path, local_rank: int) -> None:
    root = make_node(tmp_path)
    b = plan_binding(
        local_rank, accelerator="gpu", environ={}, allowed_cpus=ALL_CPUS, rocm=True, root=root
    )
    bus = KFD_ORDER[local_rank]
    assert b.device_index == local_rank and b.pci_address == f"0000:{bus:02x}:00.0"
    expected = list(range(8)) if bus < 0x80 else list(range(8, 16))
    assert b.numa_node == (0 if bus < 0x80 else 1) and list(b.cpus or ()) == expected


def test_slurm_visible_subset_and_allowed_cpus(tmp_path: Path) -> None:
    # Slurm gave this job physical GPUs 4-7 (KFD order) and CPUs 6-11 only
    root = make_node(tmp_path)
    env = {"ROCR_VISIBLE_DEVICES": "4,5,6,7"}
    b = plan_binding(
        0, accelerator="gpu", environ=env, allowed_cpus=range(6, 12), rocm=True, root=root
    )
    assert b.pci_address == "0000:c5:00.0" and b.numa_node == 1 and b.cpus == (8, 9, 10, 11)
    b = plan_binding(
        1, accelerator="gpu", environ=env, allowed_cpus=range(6, 12), rocm=True, root=root
    )
    assert b.pci_address == "0000:46:00.0" and b.numa_node == 0 and b.cpus == (6, 7)
    # no allowed CPU on the GPU's node: leave the affinity alone, and say why
    b = plan_binding(1, accelerator="gpu", environ=env, allowed_cpus=[12], rocm=True, root=root)
    assert b.cpus is None and "no allowed CPU" in b.note


def test_per_task_gpu_binding_is_refused_with_the_fix(tmp_path: Path) -> None:
    root = make_node(tmp_path)
    with pytest.raises(BindingError, match="--gpus-per-task") as err:
        plan_binding(
            3,
            accelerator="gpu",
            environ={"ROCR_VISIBLE_DEVICES": "3"},  # what --gpus-per-task=1 / --gpu-bind does
            allowed_cpus=ALL_CPUS,
            rocm=True,
            local_tasks=8,
            root=root,
        )
    assert "ROCR_VISIBLE_DEVICES=3" in str(err.value)


def test_unknown_numa_and_cpu_runs_leave_affinity(tmp_path: Path) -> None:
    root = make_node(tmp_path, numa_of_bus=lambda bus: -1)
    b = plan_binding(0, accelerator="gpu", environ={}, allowed_cpus=ALL_CPUS, rocm=True, root=root)
    assert b.numa_node is None and b.cpus is None and b.pci_address
    b = plan_binding(0, accelerator="cpu", environ={}, allowed_cpus=ALL_CPUS, rocm=True, root=root)
    assert b.device_index is None and b.cpus is None
    b = plan_binding(
        2, accelerator="gpu", environ={}, allowed_cpus=ALL_CPUS, rocm=True, root=tmp_path / "empty"
    )
    assert b.device_index == 2 and b.cpus is None and "no GPU" in b.note


def test_bind_local_rank_applies_affinity(tmp_path: Path) -> None:
    """Real sched_setaffinity on this process (restored afterwards)."""
    allowed = sorted(os.sched_getaffinity(0))
    first = allowed[0]
    root = make_node(tmp_path, numa_of_bus=lambda bus: 0)
    _write(root / "sys/devices/system/node/node0/cpulist", f"{first}\n")
    try:
        b = bind_local_rank(accelerator="gpu", rocm=True, environ={"SLURM_LOCALID": "2"}, root=root)
        assert b.local_rank == 2 and b.cpus == (first,)
        assert os.sched_getaffinity(0) == {first}
        b = bind_local_rank(0, accelerator="gpu", rocm=True, environ={}, root=root, numa=False)
        assert b.cpus is None
    finally:
        os.sched_setaffinity(0, allowed)


@pytest.mark.gpu
def test_binding_matches_the_driver_on_this_gpu_node() -> None:
    """On a real NVIDIA node: our sysfs order = CUDA's device order (checked via GPU UUIDs)."""
    import shutil
    import subprocess

    import torch

    from rocmtrain import platform

    if platform.is_rocm() or shutil.which("nvidia-smi") is None:
        pytest.skip("checks CUDA device order against nvidia-smi (NVIDIA node)")
    rows = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,pci.bus_id", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()

    def norm_bdf(text: str) -> str:
        dom, rest = text.strip().lower().split(":", 1)
        return f"{int(dom, 16):04x}:{rest}"

    bdf_of_uuid = {
        u.strip().lower().removeprefix("gpu-"): norm_bdf(b) for u, b in (r.split(",") for r in rows)
    }
    env = {k: v for k, v in os.environ.items() if k.endswith("VISIBLE_DEVICES")}
    for i in range(torch.cuda.device_count()):
        uuid = str(torch.cuda.get_device_properties(i).uuid).lower().removeprefix("gpu-")
        b = plan_binding(
            i,
            accelerator="gpu",
            environ=env,
            allowed_cpus=sorted(os.sched_getaffinity(0)),
            rocm=False,
            root=Path("/"),
        )
        assert b.pci_address == bdf_of_uuid[uuid], (i, b, bdf_of_uuid)
        numa = Path(f"/sys/bus/pci/devices/{b.pci_address}/numa_node").read_text().strip()
        assert b.numa_node == (None if int(numa) < 0 else int(numa))
