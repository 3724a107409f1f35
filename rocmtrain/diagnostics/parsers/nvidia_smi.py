"""Parse ``nvidia-smi --query-gpu=... --format=csv`` output (with or without ``nounits``).

Columns are read by header name, in any order; units come from the header (``memory.total [MiB]``)
or from the value (``143771 MiB``). :data:`QUERY_FIELDS` is what the doctor and the monitor ask for::

    nvidia-smi --query-gpu=index,name,pci.device_id,memory.total,memory.used,power.draw,\
temperature.gpu,utilization.gpu --format=csv

``pci.device_id`` is ``0x<device><vendor>`` (``0x233510DE``); the device part is returned as
``device_id`` (``0x2335``).
"""

from __future__ import annotations

import csv
import io
import re

from rocmtrain.diagnostics.parsers._common import (
    DeviceRecord,
    ParseError,
    ParseResult,
    first_float,
    is_na,
    strip_comment_header,
    to_bytes,
)

QUERY_FIELDS = (
    "index",
    "name",
    "pci.device_id",
    "memory.total",
    "memory.used",
    "power.draw",
    "temperature.gpu",
    "utilization.gpu",
)

QUERY_COMMAND = (
    "nvidia-smi",
    "--query-gpu=" + ",".join(QUERY_FIELDS),
    "--format=csv",
)


def parse_nvidia_smi_csv(text: str) -> ParseResult:
    """Devices in an ``nvidia-smi --query-gpu`` CSV; :class:`ParseError` without an ``index`` column."""
    body = strip_comment_header(text).strip()
    rows = list(csv.reader(io.StringIO(body), skipinitialspace=True))
    if not rows:
        raise ParseError("empty nvidia-smi output")
    header = []
    units: list[str | None] = []
    for col in rows[0]:
        m = re.match(r"\s*([\w.]+)\s*(?:\[(.+?)\])?\s*$", col)
        header.append(m.group(1).lower() if m else col.strip().lower())
        units.append(m.group(2) if m else None)
    if "index" not in header:
        raise ParseError(
            "not nvidia-smi --query-gpu CSV: header has no 'index' column "
            "(run nvidia-smi --query-gpu=index,name,... --format=csv)"
        )
    result = ParseResult()
    for row in rows[1:]:
        if not row or not row[0].strip():
            continue
        cells = dict(zip(header, row, strict=False))
        unit_of = dict(zip(header, units, strict=True))
        rec = DeviceRecord(index=int(cells["index"]))
        for key, value in cells.items():
            if is_na(value) or "not supported" in value.lower():
                if key in ("power.draw", "temperature.gpu", "utilization.gpu"):
                    result.warnings.append(f"GPU {rec.index}: {key} is {value.strip()}")
                continue
            if key == "name":
                rec.name = value.strip()
            elif key == "pci.device_id":
                m = re.match(r"0x([0-9a-fA-F]{4})([0-9a-fA-F]{4})$", value.strip())
                rec.device_id = f"0x{m.group(1).lower()}" if m else value.strip().lower()
            elif key in ("memory.total", "memory.used"):
                unit = unit_of[key] or (value.split()[-1] if len(value.split()) > 1 else "MiB")
                nbytes = to_bytes(value.split()[0], unit)
                if key == "memory.total":
                    rec.vram_total_bytes = nbytes
                else:
                    rec.vram_used_bytes = nbytes
            elif key == "power.draw":
                rec.power_w = first_float(value)
            elif key == "temperature.gpu":
                rec.temp_c = first_float(value)
            elif key == "utilization.gpu":
                rec.util_pct = first_float(value)
        result.devices.append(rec)
    return result
