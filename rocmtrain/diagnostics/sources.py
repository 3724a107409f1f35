"""Where GPU facts come from, in the doctor's order: torch → vendor library → vendor CLI.

Each reader returns ``list[DeviceRecord]`` (empty when the source is absent) and never raises for a
missing tool or library; the doctor and the monitor merge what they get with :func:`merge_devices`.

- :func:`torch_devices`: ``torch.cuda`` via :mod:`rocmtrain.platform` (arch, wave size, memory).
- :func:`amdsmi_devices`: the ``amdsmi`` Python library (ROCm), when installed.
- :func:`nvml_devices`: ``pynvml`` from ``nvidia-ml-py`` (NVIDIA), when installed.
- :func:`cli_devices`: ``rocminfo``, ``amd-smi static``, ``rocm-smi``, ``nvidia-smi --query-gpu`` run
  through a :data:`Runner` (tests pass a runner that returns recorded outputs).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import fields

from rocmtrain import platform
from rocmtrain.diagnostics.parsers import ParseError, parse
from rocmtrain.diagnostics.parsers._common import DeviceRecord, first_float, hex_id
from rocmtrain.diagnostics.parsers.nvidia_smi import QUERY_COMMAND

log = logging.getLogger(__name__)

#: ``run(argv) -> stdout`` or None when the program is missing / fails without output.
Runner = Callable[[Sequence[str]], "str | None"]

#: tool kind → the command that produces the output its parser reads.
CLI_COMMANDS: dict[str, tuple[str, ...]] = {
    "rocminfo": ("rocminfo",),
    "amd-smi": ("amd-smi", "static"),
    "rocm-smi": ("rocm-smi",),
    "nvidia-smi": QUERY_COMMAND,
}


def run_command(argv: Sequence[str], timeout: float = 30.0) -> str | None:
    """Run a tool and return its stdout; None when it is not on PATH, times out or prints nothing."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.debug("%s failed: %s", argv[0], e)
        return None
    return proc.stdout if proc.stdout.strip() else None


def torch_devices() -> list[DeviceRecord]:
    """Devices PyTorch sees (``torch.cuda`` API on CUDA and ROCm builds)."""
    import torch

    out = []
    for i in range(platform.device_count()):
        info = platform.device_info(i)
        rec = DeviceRecord(
            index=i,
            gfx_arch=info.arch if platform.is_rocm() else None,
            cuda_arch=None if platform.is_rocm() else info.arch,
            name=info.name,
            vram_total_bytes=info.total_memory_bytes,
            wave_size=info.warp_size,
            compute_units=info.multi_processor_count,
        )
        try:
            free, total = torch.cuda.mem_get_info(i)
            rec.vram_used_bytes, rec.vram_total_bytes = total - free, total
        except Exception as e:  # pragma: no cover - device busy/unsupported
            log.debug("mem_get_info(%d) failed: %s", i, e)
        out.append(rec)
    return out


def amdsmi_devices() -> list[DeviceRecord]:
    """Devices from the ``amdsmi`` library (empty if it is not installed or cannot initialise)."""
    try:
        import amdsmi  # type: ignore[import-not-found]
    except Exception as e:  # not installed, or installed without libamd_smi.so (raises KeyError)
        log.debug("amdsmi unavailable: %r", e)
        return []
    try:
        amdsmi.amdsmi_init()
        handles = amdsmi.amdsmi_get_processor_handles()
    except Exception as e:
        log.debug("amdsmi init failed: %s", e)
        return []
    out = []
    for i, h in enumerate(handles):
        rec = DeviceRecord(index=i)
        for reader in (_amdsmi_static, _amdsmi_dynamic):
            try:
                reader(amdsmi, h, rec)
            except Exception as e:  # one unsupported metric must not hide the others
                log.debug("amdsmi %s failed on GPU %d: %s", reader.__name__, i, e)
        out.append(rec)
    return out


def _amdsmi_static(amdsmi, h, rec: DeviceRecord) -> None:
    asic = amdsmi.amdsmi_get_gpu_asic_info(h)
    name = asic.get("market_name")
    rec.name = None if not name or str(name).upper() == "N/A" else str(name)
    did = asic.get("device_id")
    rec.device_id = hex(did) if isinstance(did, int) else hex_id(did)
    rec.gfx_arch = platform.normalize_gfx_arch(str(asic.get("target_graphics_version") or ""))


def _amdsmi_dynamic(amdsmi, h, rec: DeviceRecord) -> None:
    vram = amdsmi.amdsmi_get_gpu_vram_usage(h)  # MB (MiB)
    rec.vram_total_bytes = int(vram["vram_total"]) * 1024**2
    rec.vram_used_bytes = int(vram["vram_used"]) * 1024**2
    rec.util_pct = first_float(amdsmi.amdsmi_get_gpu_activity(h).get("gfx_activity"))
    power = amdsmi.amdsmi_get_power_info(h)
    for key in (
        "current_socket_power",
        "socket_power",
        "average_socket_power",
    ):  # by amdsmi version
        if first_float(power.get(key)) is not None:
            rec.power_w = first_float(power.get(key))
            break
    rec.temp_c = first_float(
        amdsmi.amdsmi_get_temp_metric(
            h, amdsmi.AmdSmiTemperatureType.HOTSPOT, amdsmi.AmdSmiTemperatureMetric.CURRENT
        )
    )


def nvml_devices() -> list[DeviceRecord]:
    """Devices from NVML (``pynvml``, package ``nvidia-ml-py``); empty without NVML."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except Exception as e:
        log.debug("pynvml unavailable: %r", e)
        return []
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as e:  # NVMLError_LibraryNotFound on machines without the driver
        log.debug("NVML init failed: %s", e)
        return []
    out = []
    for i in range(count):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        rec = DeviceRecord(index=i)
        try:
            name = pynvml.nvmlDeviceGetName(h)
            rec.name = name.decode() if isinstance(name, bytes) else name
            pci = pynvml.nvmlDeviceGetPciInfo(h).pciDeviceId  # 0x233510DE: device << 16 | vendor
            rec.device_id = f"0x{pci >> 16:04x}"
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            rec.vram_total_bytes, rec.vram_used_bytes = int(mem.total), int(mem.used)
            rec.util_pct = float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            rec.power_w = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
            rec.temp_c = float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
        except Exception as e:
            log.debug("NVML query failed on GPU %d: %s", i, e)
        out.append(rec)
    return out


def cli_devices(run: Runner, kinds: Sequence[str] = tuple(CLI_COMMANDS)) -> dict[str, list]:
    """``{kind: devices}`` for every CLI in ``kinds`` that ran and parsed."""
    found: dict[str, list[DeviceRecord]] = {}
    for kind in kinds:
        text = run(CLI_COMMANDS[kind])
        if not text:
            continue
        try:
            result = parse(kind, text)
        except ParseError as e:
            log.warning("could not parse `%s` output: %s", " ".join(CLI_COMMANDS[kind][:2]), e)
            continue
        found[kind] = result.devices
    return found


def merge_devices(*sources: list[DeviceRecord]) -> list[DeviceRecord]:
    """Index-aligned merge: the first source that has a device/field wins, later ones fill gaps."""
    merged: dict[int, DeviceRecord] = {}
    for devices in sources:
        for dev in devices:
            cur = merged.setdefault(dev.index, DeviceRecord(index=dev.index))
            for f in fields(DeviceRecord):
                if getattr(cur, f.name) is None and getattr(dev, f.name) is not None:
                    setattr(cur, f.name, getattr(dev, f.name))
    return [merged[i] for i in sorted(merged)]
