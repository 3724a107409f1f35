"""GPU checks: visibility, arch + device id, wave size, PYTORCH_ROCM_ARCH, HSA override, headroom."""

from __future__ import annotations

import re

from rocmtrain import platform
from rocmtrain.diagnostics.checks.base import Check, GpuFacts, Inputs


def _describe(d) -> str:
    product = platform.AMD_DEVICE_IDS.get(d.device_id or "")
    bits = [
        f"GPU {d.index}",
        d.name or "?",
        f"arch={d.gfx_arch or d.cuda_arch or '?'}",
        f"id={d.device_id or '?'}",
    ]
    if product:
        bits.append(f"({product})")
    return " ".join(bits)


def check_visible(facts: GpuFacts, inputs: Inputs) -> Check:
    n_torch, n_any = len(facts.torch), len(facts.devices)
    srcs = ", ".join(facts.sources_used()) or "none"
    if inputs.live and n_torch == 0 and n_any > 0:
        return Check(
            "gpu.visible",
            "error",
            f"torch sees 0 GPUs but {', '.join(sorted(facts.cli)) or facts.library_name} "
            f"list {n_any} (torch {platform.torch_version()}, hip={platform.hip_version()})",
            "install the ROCm (or CUDA) build of torch from PyTorch's wheel index, check "
            "HIP_VISIBLE_DEVICES/ROCR_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES and membership of the "
            "video/render groups (/dev/kfd, /dev/dri)",
        )
    if n_any == 0:
        if inputs.live and platform.is_rocm():
            return Check(
                "gpu.visible",
                "error",
                "ROCm build of torch but no GPU visible and no tool lists one",
                "check `rocminfo`, /dev/kfd permissions (video/render groups) and *_VISIBLE_DEVICES",
            )
        return Check("gpu.visible", "warn", "no GPU visible (CPU-only run)", "")
    return Check("gpu.visible", "ok", f"{n_any} GPU(s), backend={facts.backend}, sources: {srcs}")


def check_arch(facts: GpuFacts, inputs: Inputs) -> Check:
    if not facts.devices:
        return Check("gpu.arch", "skip", "no GPU")
    lines = [_describe(d) for d in facts.devices]
    unknown = [d.index for d in facts.devices if facts.amd and d.gfx_arch is None]
    if unknown:
        return Check(
            "gpu.arch",
            "warn",
            "; ".join(lines),
            "gfx arch unknown for GPU(s) " + ", ".join(map(str, unknown)) + ": run `rocminfo`",
        )
    return Check("gpu.arch", "ok", "; ".join(_compact(lines)))


def _compact(lines: list[str]) -> list[str]:
    """Collapse identical per-GPU descriptions: 'GPU 0-3 AMD Instinct MI300X arch=gfx942 ...'."""
    bodies = [re.sub(r"^GPU \d+ ", "", line) for line in lines]
    if len(set(bodies)) == 1 and len(bodies) > 1:
        return [f"GPU 0-{len(bodies) - 1} {bodies[0]}"]
    return lines


def check_wave_size(facts: GpuFacts, inputs: Inputs) -> Check:
    if not facts.devices:
        return Check("gpu.wave_size", "skip", "no GPU")
    bad, parts = [], []
    for d in facts.devices:
        expected = platform.warp_size_for_arch(d.gfx_arch) if d.gfx_arch else None
        got = d.wave_size or expected
        parts.append(f"GPU {d.index}: {got if got else '?'}")
        if d.wave_size and expected and d.wave_size != expected:
            bad.append(f"GPU {d.index} reports {d.wave_size}, {d.gfx_arch} is wave{expected}")
    if bad:
        return Check(
            "gpu.wave_size",
            "warn",
            "; ".join(bad),
            "a spoofed ISA (HSA_OVERRIDE_GFX_VERSION) or a mismatched runtime; size kernels from "
            "props.warp_size, never 32",
        )
    sizes = {p.split(": ")[1] for p in parts}
    evidence = f"wave{sizes.pop()} on all GPUs" if len(sizes) == 1 else "; ".join(parts)
    return Check("gpu.wave_size", "ok", evidence + " (kernels size blocks from warp_size)")


def _arch_list(value: str) -> list[str]:
    return [a for a in re.split(r"[;,\s]+", value.strip()) if a]


def check_pytorch_rocm_arch(facts: GpuFacts, inputs: Inputs) -> Check:
    value = inputs.environ.get("PYTORCH_ROCM_ARCH")
    archs = sorted({d.gfx_arch for d in facts.devices if d.gfx_arch})
    if value is None:
        ev = "not set (build-time only: --offload-arch list for torch / cpp extensions)"
        return Check("env.PYTORCH_ROCM_ARCH", "ok" if facts.amd else "skip", ev)
    listed = {platform.normalize_gfx_arch(a) or a for a in _arch_list(value)}
    if not facts.amd:
        return Check(
            "env.PYTORCH_ROCM_ARCH",
            "warn",
            f"PYTORCH_ROCM_ARCH={value} but no AMD GPU here",
            "it only affects ROCm builds of extensions; unset it on this machine",
        )
    missing = [a for a in archs if a not in listed]
    if missing:
        return Check(
            "env.PYTORCH_ROCM_ARCH",
            "warn",
            f"PYTORCH_ROCM_ARCH={value} does not include this node's {', '.join(missing)}",
            f"extensions built here will fail with hipErrorNoBinaryForGpu; set "
            f"PYTORCH_ROCM_ARCH={';'.join(sorted(listed | set(missing)))} before building",
        )
    return Check("env.PYTORCH_ROCM_ARCH", "ok", f"PYTORCH_ROCM_ARCH={value} covers {archs}")


def check_hsa_override(facts: GpuFacts, inputs: Inputs) -> Check:
    value = inputs.environ.get("HSA_OVERRIDE_GFX_VERSION")
    if value is None:
        return Check("env.HSA_OVERRIDE_GFX_VERSION", "ok", "not set")
    if facts.instinct:
        gpus = ", ".join(_describe(d) for d in facts.instinct[:2])
        return Check(
            "env.HSA_OVERRIDE_GFX_VERSION",
            "error",
            f"HSA_OVERRIDE_GFX_VERSION={value} on an Instinct GPU ({gpus})",
            "unset HSA_OVERRIDE_GFX_VERSION: it spoofs the ISA for unsupported consumer GPUs and "
            "makes MI200/MI300 load kernels built for the wrong target",
        )
    return Check(
        "env.HSA_OVERRIDE_GFX_VERSION",
        "warn",
        f"HSA_OVERRIDE_GFX_VERSION={value} (no Instinct GPU detected)",
        "only for unsupported consumer GPUs; never on MI250/MI300",
    )


def check_memory_headroom(facts: GpuFacts, inputs: Inputs) -> Check:
    frac = inputs.headroom_fraction
    rows, low = [], []
    for d in facts.devices:
        if not d.vram_total_bytes or d.vram_used_bytes is None:
            continue
        free = 1.0 - d.vram_used_bytes / d.vram_total_bytes
        rows.append(
            f"GPU {d.index}: {d.vram_used_bytes / 2**30:.1f}/{d.vram_total_bytes / 2**30:.1f} GiB "
            f"used ({free:.0%} free)"
        )
        if free < frac:
            low.append(d.index)
    if not rows:
        return Check("gpu.memory_headroom", "skip", "no device memory usage available")
    if low:
        return Check(
            "gpu.memory_headroom",
            "warn",
            "; ".join(rows) + f"; below the {frac:.0%} headroom on GPU(s) {low}",
            "other processes hold device memory: check `rocm-smi --showpids` / `nvidia-smi`, or "
            "lower batch size / monitor.memory_headroom_fraction",
        )
    return Check("gpu.memory_headroom", "ok", "; ".join(rows) + f" (headroom ≥ {frac:.0%})")


CHECKS = (
    check_visible,
    check_arch,
    check_wave_size,
    check_pytorch_rocm_arch,
    check_hsa_override,
    check_memory_headroom,
)
