"""Live per-device samples for the monitor: amdsmi (ROCm), NVML or nvidia-smi (NVIDIA).

    sampler = make_sampler()          # None on a CPU-only machine
    for s in sampler.sample():        # one Sample per GPU
        print(s.index, s.util_pct, s.mem_used_bytes, s.power_w, s.temp_c, s.pcie_tx_bytes_per_s)

Throughput fields (PCIe, XGMI) are None where the library does not expose them; XGMI comes from the
accumulating counters in amdsmi's GPU metrics, differentiated between two samples.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from rocmtrain import platform
from rocmtrain.diagnostics import sources
from rocmtrain.diagnostics.parsers import ParseError
from rocmtrain.diagnostics.parsers.nvidia_smi import parse_nvidia_smi_csv

log = logging.getLogger(__name__)


@dataclass
class Sample:
    """One device at one time (``t`` = ``time.monotonic()``)."""

    t: float
    index: int
    util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    temp_c: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    xgmi_bytes_per_s: float | None = None


class AmdSmiSampler:
    name = "amdsmi"

    def __init__(self) -> None:
        import amdsmi  # type: ignore[import-not-found]

        amdsmi.amdsmi_init()
        self._lib = amdsmi
        self._handles = amdsmi.amdsmi_get_processor_handles()
        self._xgmi_prev: dict[int, tuple[float, float]] = {}
        if not self._handles:
            raise RuntimeError("amdsmi lists no GPU")

    def sample(self) -> list[Sample]:
        out = []
        now = time.monotonic()
        for i, h in enumerate(self._handles):
            rec = sources.DeviceRecord(index=i)
            try:
                sources._amdsmi_dynamic(self._lib, h, rec)
            except Exception as e:
                log.debug("amdsmi sample GPU %d: %s", i, e)
            s = Sample(now, i, rec.util_pct, rec.vram_used_bytes, rec.vram_total_bytes)
            s.power_w, s.temp_c = rec.power_w, rec.temp_c
            s.pcie_tx_bytes_per_s, s.xgmi_bytes_per_s = self._throughput(i, h, now)
            out.append(s)
        return out

    def _throughput(self, i: int, h, now: float) -> tuple[float | None, float | None]:
        pcie = xgmi = None
        try:
            m = self._lib.amdsmi_get_gpu_metrics_info(h)
            inst = m.get("pcie_bandwidth_inst")  # GB/s, instantaneous (N/A on some parts)
            pcie = float(inst) * 1e9 if isinstance(inst, (int, float)) else None
            total_kb = sum(
                v
                for key in ("xgmi_read_data_acc", "xgmi_write_data_acc")
                for v in (m.get(key) if isinstance(m.get(key), list) else [])
                if isinstance(v, (int, float))
            )
            prev = self._xgmi_prev.get(i)
            self._xgmi_prev[i] = (now, float(total_kb))
            if prev and now > prev[0] and total_kb:
                xgmi = (total_kb - prev[1]) * 1024 / (now - prev[0])
        except Exception as e:
            log.debug("amdsmi gpu metrics GPU %d: %s", i, e)
        return pcie, xgmi

    def close(self) -> None:
        try:
            self._lib.amdsmi_shut_down()
        except Exception:
            pass


class NvmlSampler:
    name = "pynvml"

    def __init__(self) -> None:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        self._nv = pynvml
        self._handles = [
            pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
        ]
        if not self._handles:
            raise RuntimeError("NVML lists no GPU")

    def sample(self) -> list[Sample]:
        nv, now, out = self._nv, time.monotonic(), []
        for i, h in enumerate(self._handles):
            s = Sample(now, i)
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                s.mem_used_bytes, s.mem_total_bytes = int(mem.used), int(mem.total)
                s.util_pct = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
                s.power_w = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
                s.temp_c = float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
                # KB/s over the driver's last 20 ms window
                s.pcie_tx_bytes_per_s = 1024.0 * nv.nvmlDeviceGetPcieThroughput(
                    h, nv.NVML_PCIE_UTIL_TX_BYTES
                )
                s.pcie_rx_bytes_per_s = 1024.0 * nv.nvmlDeviceGetPcieThroughput(
                    h, nv.NVML_PCIE_UTIL_RX_BYTES
                )
            except Exception as e:
                log.debug("NVML sample GPU %d: %s", i, e)
            out.append(s)
        return out

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception:
            pass


class NvidiaSmiSampler:
    """Fallback without nvidia-ml-py: one ``nvidia-smi --query-gpu`` call per sample (~50 ms)."""

    name = "nvidia-smi"

    def __init__(self, run: sources.Runner = sources.run_command) -> None:
        self._run = run
        if not self.sample():
            raise RuntimeError("nvidia-smi returned no GPU")

    def sample(self) -> list[Sample]:
        text = self._run(sources.CLI_COMMANDS["nvidia-smi"])
        if not text:
            return []
        try:
            devices = parse_nvidia_smi_csv(text).devices
        except ParseError:
            return []
        now = time.monotonic()
        return [
            Sample(
                now, d.index, d.util_pct, d.vram_used_bytes, d.vram_total_bytes, d.power_w, d.temp_c
            )
            for d in devices
        ]

    def close(self) -> None:
        pass


class TorchMemorySampler:
    """Last resort (no amdsmi / NVML / nvidia-smi): memory of the current device only."""

    name = "torch.cuda.mem_get_info"

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._dev = torch.cuda.current_device()

    def sample(self) -> list[Sample]:
        free, total = self._torch.cuda.mem_get_info(self._dev)
        return [
            Sample(time.monotonic(), self._dev, mem_used_bytes=total - free, mem_total_bytes=total)
        ]

    def close(self) -> None:
        pass


AnySampler = AmdSmiSampler | NvmlSampler | NvidiaSmiSampler | TorchMemorySampler


def make_sampler() -> AnySampler | None:
    """The best sampler for this machine, or None (no GPU, or no library/CLI that can read it)."""
    if not platform.has_gpu():
        return None
    candidates = (
        (AmdSmiSampler, TorchMemorySampler)
        if platform.is_rocm()
        else (NvmlSampler, NvidiaSmiSampler, TorchMemorySampler)
    )
    for cls in candidates:
        try:
            return cls()
        except Exception as e:  # library missing or cannot initialise: try the next source
            log.debug("%s unavailable: %s", cls.name, e)
    return None
