"""Shared pieces of the tool-output parsers: the device record, the error type, number helpers.

Every parser is a pure function ``parse_xxx(text: str) -> ParseResult`` of the tool's text output, so
it can be tested on recorded outputs. Leading ``#`` comment lines (the way a user pastes an output
with a note above it) are dropped; the content itself is never "cleaned".
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any


class ParseError(ValueError):
    """The text is not (or not enough of) the output the parser was asked to read."""


@dataclass
class DeviceRecord:
    """One GPU as a tool reports it. ``None`` = the tool did not report that field."""

    index: int
    gfx_arch: str | None = None
    device_id: str | None = None  #: PCI device id, lower-case hex ``0x74a1``
    name: str | None = None
    vram_total_bytes: int | None = None
    power_w: float | None = None
    temp_c: float | None = None
    util_pct: float | None = None
    # Extras the doctor and monitor use; not part of the ``doctor parse`` schema.
    wave_size: int | None = None
    cuda_arch: str | None = None  #: ``sm_90`` on NVIDIA (from torch)
    compute_units: int | None = None
    vram_used_bytes: int | None = None
    vram_used_pct: float | None = None

    SCHEMA_KEYS = (
        "index",
        "gfx_arch",
        "device_id",
        "name",
        "vram_total_bytes",
        "power_w",
        "temp_c",
        "util_pct",
    )

    def to_schema(self) -> dict[str, Any]:
        """The documented ``doctor parse`` device object (exactly these keys)."""
        d = asdict(self)
        return {k: d[k] for k in self.SCHEMA_KEYS}


@dataclass
class ParseResult:
    """Devices found plus human-readable warnings (N/A fields, truncated output...)."""

    devices: list[DeviceRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_schema(self) -> dict[str, Any]:
        return {"devices": [d.to_schema() for d in self.devices], "warnings": list(self.warnings)}


def strip_comment_header(text: str) -> str:
    """Drop the leading ``#`` lines (source notes); keep everything from the first other line on."""
    lines = text.splitlines()
    i = 0
    while i < len(lines) and lines[i].lstrip().startswith("#"):
        i += 1
    return "\n".join(lines[i:])


_NUM = re.compile(r"[-+]?\d+(?:\.\d+)?")
_HEX_ID = re.compile(r"0x[0-9a-fA-F]+")


def first_float(value: object) -> float | None:
    """``"35.0°C"`` → 35.0, ``"133.0W"`` → 133.0, ``"N/A"`` / ``None`` → None."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    m = _NUM.search(str(value))
    return float(m.group(0)) if m else None


def hex_id(value: object) -> str | None:
    """First ``0x...`` in ``value`` lower-cased (``"29857(0x74a1)"`` → ``"0x74a1"``)."""
    if value is None:
        return None
    m = _HEX_ID.search(str(value))
    return m.group(0).lower() if m else None


def is_na(value: object) -> bool:
    return value is None or str(value).strip().upper().startswith("N/A") or str(value).strip() == ""


_UNITS = {
    "B": 1,
    "KB": 1024,
    "KIB": 1024,
    "MB": 1024**2,  # amd-smi / rocm-smi / nvidia-smi "MB"/"MiB" are binary (196592 MB = 192 GiB)
    "MIB": 1024**2,
    "GB": 1024**3,
    "GIB": 1024**3,
}


def to_bytes(value: object, unit: str | None = None) -> int | None:
    """``"201310208(0xbffc000) KB"`` → bytes; ``(196592, "MB")`` → bytes; unknown unit → None."""
    if is_na(value):
        return None
    num = first_float(value)
    if num is None:
        return None
    if unit is None:
        m = re.search(r"([KMG]i?B|B)\s*$", str(value).strip(), re.IGNORECASE)
        unit = m.group(1) if m else "B"
    factor = _UNITS.get(unit.upper())
    return int(num * factor) if factor else None
