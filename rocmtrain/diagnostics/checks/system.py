"""Node and environment checks: env-var registry, NUMA balancing, IOMMU, RCCL config, Slurm.

AMD's MI300X guide asks for ``kernel.numa_balancing=0`` and ``iommu=pt`` on GPU nodes; RCCL reads
``~/.rccl.conf`` and ``/etc/rccl.conf`` (NCCL: ``~/.nccl.conf``, ``/etc/nccl.conf``,
``NCCL_CONF_FILE``). System items are reported, never changed.
"""

from __future__ import annotations

import re

from rocmtrain.diagnostics.checks.base import Check, GpuFacts, Inputs, TorchBuild, read_text


def check_env_registry(facts: GpuFacts, inputs: Inputs) -> Check:
    try:  # owned by the RCCL area; isolated so the doctor runs without it
        from rocmtrain.comms.registry import Versions, check_environment
    except ImportError as e:
        return Check("env.registry", "skip", f"env-var registry not available ({e})")
    rocm = True if facts.amd else (False if facts.backend == "cuda" else None)
    build = inputs.torch_build or TorchBuild.live()
    # the torch and ROCm versions arm the registry's version gates (expandable_segments, TORCH_FR_*)
    have = Versions(torch=build.version, rocm=build.rocm)
    findings = check_environment(inputs.environ, rccl_version=build.nccl, rocm=rocm, versions=have)
    bad = [f for f in findings if getattr(f, "severity", "warning") in ("error", "warning")]
    if not bad:
        notes = sorted({f.name for f in findings})
        extra = f" (notes on: {', '.join(notes)})" if notes else ""
        return Check("env.registry", "ok", "no invented, legacy or dead knobs" + extra)
    status = "error" if any(f.severity == "error" for f in bad) else "warn"
    evidence = "; ".join(f.message for f in bad)
    fixes = [f"{f.name} → {f.replacement}" for f in bad if getattr(f, "replacement", None)]
    fix = ("use the real knobs: " + ", ".join(fixes)) if fixes else "unset the listed variables"
    return Check("env.registry", status, evidence, fix)


def check_numa_balancing(facts: GpuFacts, inputs: Inputs) -> Check:
    raw = read_text(inputs.proc / "sys" / "kernel" / "numa_balancing")
    if raw is None:
        return Check("node.numa_balancing", "skip", "/proc/sys/kernel/numa_balancing not readable")
    value = raw.strip()
    if value == "0":
        return Check("node.numa_balancing", "ok", "kernel.numa_balancing=0")
    return Check(
        "node.numa_balancing",
        "warn" if facts.amd else "skip",
        f"kernel.numa_balancing={value}" + ("" if facts.amd else " (matters on AMD GPU nodes)"),
        "sudo sysctl kernel.numa_balancing=0 (AMD MI300X guide; page migration stalls GPU work)",
    )


def check_iommu(facts: GpuFacts, inputs: Inputs) -> Check:
    cmdline = read_text(inputs.proc / "cmdline")
    if cmdline is None:
        return Check("node.iommu", "skip", "/proc/cmdline not readable")
    tokens = cmdline.split()
    iommu = [t for t in tokens if t.startswith(("iommu=", "amd_iommu=", "intel_iommu="))]
    if "iommu=pt" in tokens:
        return Check("node.iommu", "ok", "iommu=pt on the kernel command line")
    ev = f"kernel command line has {' '.join(iommu) if iommu else 'no iommu= setting'}"
    return Check(
        "node.iommu",
        "warn" if facts.amd else "skip",
        ev + ("" if facts.amd else " (matters on AMD GPU nodes)"),
        "add iommu=pt to GRUB_CMDLINE_LINUX and reboot (AMD MI300X guide: DMA without IOMMU "
        "translation)",
    )


def check_rccl_conf(facts: GpuFacts, inputs: Inputs) -> Check:
    paths = [inputs.home / ".rccl.conf", inputs.etc / "rccl.conf"]
    paths += [inputs.home / ".nccl.conf", inputs.etc / "nccl.conf"]
    if inputs.environ.get("NCCL_CONF_FILE"):
        from pathlib import Path

        paths.append(Path(inputs.environ["NCCL_CONF_FILE"]))
    found = []
    for p in paths:
        text = read_text(p)
        if text is not None:
            keys = [
                ln.split("=")[0].strip()
                for ln in text.splitlines()
                if "=" in ln and not ln.lstrip().startswith("#")
            ]
            found.append(f"{p}: {', '.join(keys) or '(no settings)'}")
    if not found:
        return Check(
            "rccl.conf_files", "ok", "no ~/.rccl.conf, /etc/rccl.conf, ~/.nccl.conf, /etc/nccl.conf"
        )
    return Check(
        "rccl.conf_files",
        "warn",
        "; ".join(found),
        "these files set RCCL/NCCL knobs for every job on this node (environment variables "
        "override them); keep them consistent with the rccl.* config or remove them",
    )


_VIS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
_DEVICE = r"(-?\d+|GPU-[\w-]+|MIG-[\w/-]+)"  # index (-1 hides all), or a UUID
_DEVICE_LIST = re.compile(rf"{_DEVICE}(\s*,\s*{_DEVICE})*")
# What an empty value does. ROCm: HIP (clr rocclr/device/rocm/rocdevice.cpp, Device::init) takes
# HIP_VISIBLE_DEVICES only when non-empty, else CUDA_VISIBLE_DEVICES, and applies the list only
# when it is non-empty, so an empty HIP_/CUDA_VISIBLE_DEVICES filters nothing; ROCr
# (ROCR-Runtime amd_filter_device.h) treats an empty ROCR_VISIBLE_DEVICES as "no device". NVIDIA:
# an empty CUDA_VISIBLE_DEVICES hides every GPU.
_HIDES_ALL_WHEN_EMPTY = {True: ("ROCR_VISIBLE_DEVICES",), False: ("CUDA_VISIBLE_DEVICES",)}


def check_visible_devices(facts: GpuFacts, inputs: Inputs) -> Check:
    env = inputs.environ
    set_vars = {k: env[k] for k in _VIS if k in env}
    if not set_vars:
        return Check("cluster.visible_devices", "ok", "no *_VISIBLE_DEVICES set (all GPUs visible)")
    ev = ", ".join(f"{k}={v!r}" if v == "" else f"{k}={v}" for k, v in set_vars.items())
    amd = facts.amd
    hiding = [k for k in _HIDES_ALL_WHEN_EMPTY[amd] if set_vars.get(k) == ""]
    if hiding:
        return Check(
            "cluster.visible_devices",
            "warn",
            ev,
            f"an empty {hiding[0]} hides every GPU"
            + (" (ROCr filters below HIP)" if amd else "")
            + f"; unset it or list the GPUs ({hiding[0]}=0,1,...)",
        )
    # the runtimes stop at the first entry that is neither an index nor a GPU UUID: "abc" hides
    # every GPU, "0,x" all but GPU 0
    unreadable = [k for k, v in set_vars.items() if v and not _DEVICE_LIST.fullmatch(v.strip())]
    if unreadable:
        return Check(
            "cluster.visible_devices",
            "error",
            ev,
            f"{', '.join(unreadable)}: use GPU indices (0,1,2) or UUIDs (GPU-...), or unset it",
        )
    ignored = [k for k in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if set_vars.get(k) == ""]
    nonempty = {k: v for k, v in set_vars.items() if v != ""}
    if "ROCR_VISIBLE_DEVICES" in nonempty and len(nonempty) > 1 and len(set(nonempty.values())) > 1:
        return Check(
            "cluster.visible_devices",
            "warn",
            ev,
            "ROCR_VISIBLE_DEVICES filters first and HIP/CUDA_VISIBLE_DEVICES index into what is "
            "left; set only one of them (Slurm sets ROCR_VISIBLE_DEVICES with --gpus)",
        )
    if amd and ignored:
        ev += f" ({' and '.join(ignored)} empty: HIP ignores an empty list, no GPU is hidden by it)"
    return Check("cluster.visible_devices", "ok", ev)


def _tasks_per_node(env) -> int | None:
    if env.get("SLURM_NTASKS_PER_NODE", "").isdigit():
        return int(env["SLURM_NTASKS_PER_NODE"])
    m = re.match(r"(\d+)", env.get("SLURM_TASKS_PER_NODE", ""))
    return int(m.group(1)) if m else None


def check_slurm(facts: GpuFacts, inputs: Inputs) -> Check:
    env = inputs.environ
    if "SLURM_JOB_ID" not in env:
        return Check("cluster.slurm", "skip", "not inside a Slurm job")
    ev = [f"job {env['SLURM_JOB_ID']}"]
    if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return Check(
            "cluster.slurm",
            "warn",
            ev[0] + ": in an allocation but not in an srun step (no SLURM_PROCID/SLURM_NTASKS)",
            "launch one rank per GPU with srun (python -m rocmtrain cluster=slurm does this)",
        )
    ntasks, procid = int(env["SLURM_NTASKS"]), int(env["SLURM_PROCID"])
    ev.append(f"rank {procid}/{ntasks}, local {env.get('SLURM_LOCALID', '?')}")
    if procid >= ntasks:
        return Check(
            "cluster.slurm", "error", "; ".join(ev), "SLURM_PROCID ≥ SLURM_NTASKS: corrupt env"
        )
    per_node = _tasks_per_node(env)
    # GPUs allocated on this node (not the per-task visible count: --gpus-per-task=1 shows one)
    gpus = int(env["SLURM_GPUS_ON_NODE"]) if env.get("SLURM_GPUS_ON_NODE", "").isdigit() else 0
    if per_node is not None:
        ev.append(f"{per_node} task(s)/node, SLURM_GPUS_ON_NODE={gpus or 'unset'}")
        if gpus and per_node > gpus:
            return Check(
                "cluster.slurm",
                "error",
                "; ".join(ev),
                "more ranks than GPUs on a node: use --ntasks-per-node ≤ GPUs (one process per GPU)",
            )
        if gpus and per_node < gpus and per_node > 1:
            return Check("cluster.slurm", "warn", "; ".join(ev), "idle GPUs: one rank per GPU")
    return Check("cluster.slurm", "ok", "; ".join(ev))


CHECKS = (
    check_env_registry,
    check_numa_balancing,
    check_iommu,
    check_rccl_conf,
    check_visible_devices,
    check_slurm,
)
