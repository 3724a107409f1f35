"""Parse ``amd-smi static`` / ``amd-smi metric`` output, as text or ``--json``.

Text form: one ``GPU: N`` section per device, then ``SECTION:`` headers and ``KEY: value`` lines nested
by indentation. Fields are found by section and key name (``ASIC.MARKET_NAME``, ``ASIC.DEVICE_ID``,
``ASIC.TARGET_GRAPHICS_VERSION``, ``VRAM.SIZE``, ``USAGE.GFX_ACTIVITY``, ``POWER.SOCKET_POWER``,
``TEMPERATURE.HOTSPOT``/``EDGE``, ``MEM_USAGE.TOTAL_VRAM``), so any subset of sections parses.
A ``[output truncated]`` line is reported as a warning, and so is a ``GPU: N`` section cut before any
field the parser reads; a JSON list cut mid-object keeps the per-GPU objects that are complete.

JSON form: a list of per-GPU objects (``[{"gpu": 0, "asic": {...}, "vram": {...}}]``), an object with
``"gpu_data"``, or a bare ``vram`` object as printed by ``amd-smi static --json | jq '.[0]["vram"]'``.
Values are either ``{"value": 196592, "unit": "MB"}`` or strings such as ``"196592 MB"``; amd-smi's
``MB`` is MiB (196592 MB = the 201310208 KB rocminfo reports for the same MI300X).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rocmtrain.diagnostics.parsers._common import (
    DeviceRecord,
    ParseError,
    ParseResult,
    first_float,
    hex_id,
    is_na,
    strip_comment_header,
    to_bytes,
)
from rocmtrain.platform import normalize_gfx_arch

_GPU = re.compile(r"^GPU:\s*(\d+)\s*$")
_KV = re.compile(r"^(\s*)([A-Za-z0-9_ ]+?):\s*(.*?)\s*$")


def _nest(lines: list[str]) -> dict[str, Any]:
    """Indentation-nested ``KEY: value`` lines → nested dict (keys lower-cased)."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for line in lines:
        m = _KV.match(line)
        if not m:
            continue
        indent, key, value = len(m.group(1)), m.group(2).strip().lower(), m.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        if value == "":
            child: dict[str, Any] = {}
            parent[key] = child
            stack.append((indent, child))
        else:
            parent[key] = value
    return root


def _get(d: dict[str, Any], *path: str) -> Any:
    cur: Any = d
    for p in path:
        if not isinstance(cur, dict):
            return None
        cur = {str(k).lower(): v for k, v in cur.items()}.get(p)
    return cur


def _value_unit(v: Any) -> tuple[Any, str | None]:
    if isinstance(v, dict) and "value" in v:
        return v.get("value"), v.get("unit")
    return v, None


def _fill(rec: DeviceRecord, data: dict[str, Any], warnings: list[str]) -> None:
    name = _get(data, "asic", "market_name")
    rec.name = None if is_na(name) else str(name)
    rec.device_id = hex_id(_get(data, "asic", "device_id"))
    arch = _get(data, "asic", "target_graphics_version")
    rec.gfx_arch = normalize_gfx_arch(str(arch)) if arch else None
    size, unit = _value_unit(_get(data, "vram", "size"))
    if size is None:
        size, unit = _value_unit(_get(data, "mem_usage", "total_vram"))
    rec.vram_total_bytes = to_bytes(size, unit) if size is not None else None
    used, unit = _value_unit(_get(data, "mem_usage", "used_vram"))
    rec.vram_used_bytes = to_bytes(used, unit) if used is not None else None
    for field, path in (
        ("util_pct", ("usage", "gfx_activity")),
        ("power_w", ("power", "socket_power")),
        ("temp_c", ("temperature", "hotspot")),
        ("temp_c", ("temperature", "edge")),
    ):
        raw, _ = _value_unit(_get(data, *path))
        if raw is None or getattr(rec, field) is not None:
            continue
        if is_na(raw):
            warnings.append(f"GPU {rec.index}: {'.'.join(path).upper()} is {raw}")
        else:
            setattr(rec, field, first_float(raw))


def _parse_text(lines: list[str]) -> ParseResult:
    result = ParseResult()
    sections: list[tuple[int, list[str]]] = []
    for line in lines:
        m = _GPU.match(line)
        if m:
            sections.append((int(m.group(1)), []))
        elif sections:
            if "output truncated" in line.lower():
                result.warnings.append(f"GPU {sections[-1][0]}: output truncated ({line.strip()})")
            sections[-1][1].append(line)
    if not sections:
        raise ParseError(
            "not amd-smi output: no 'GPU: N' sections and not JSON "
            "(save the output of `amd-smi static`, `amd-smi metric` or `amd-smi static --json`)"
        )
    for idx, body in sections:
        rec = DeviceRecord(index=idx)
        _fill(rec, _nest(body), result.warnings)
        if _is_empty(rec):
            result.warnings.append(
                f"GPU {idx}: no field read from its section (cut short, or a section the parser does "
                "not use); only its index is known"
            )
        result.devices.append(rec)
    return result


def _is_empty(rec: DeviceRecord) -> bool:
    """True when nothing but the index was read for ``rec``."""
    return all(v is None for k, v in vars(rec).items() if k != "index")


def _complete_items(text: str) -> list[Any]:
    """The complete ``{...}`` items at the start of a JSON list that was cut mid-way."""
    decoder = json.JSONDecoder()
    items: list[Any] = []
    pos = text.find("[") + 1
    while 0 < pos < len(text):
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        items.append(item)
    return items


def _parse_json(text: str) -> ParseResult:
    result = ParseResult()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        data = _complete_items(text) if text.lstrip().startswith("[") else []
        if not data or not all(isinstance(x, dict) for x in data):
            raise ParseError(f"amd-smi JSON is not valid JSON: {e}") from None
        result.warnings.append(
            f"amd-smi JSON is cut short ({e.msg} at char {e.pos}; truncated paste?): read the "
            f"{len(data)} complete GPU object(s)"
        )
    if isinstance(data, dict) and "gpu_data" in data:
        data = data["gpu_data"]
    if isinstance(data, dict) and "size" in data and ("type" in data or "vendor" in data):
        result.warnings.append(
            "bare VRAM object (e.g. `jq '.[0][\"vram\"]'`): one device, index 0 assumed"
        )
        data = [{"gpu": 0, "vram": data}]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(x, dict) for x in data):
        raise ParseError("amd-smi JSON must be a list of per-GPU objects or a 'vram' object")
    for pos, item in enumerate(data):
        idx = item.get("gpu", pos)
        rec = DeviceRecord(index=int(idx) if str(idx).isdigit() else pos)
        _fill(rec, item, result.warnings)
        result.devices.append(rec)
    if not result.devices:
        raise ParseError("amd-smi JSON lists no GPU")
    return result


def parse_amd_smi(text: str) -> ParseResult:
    """Devices in an ``amd-smi static``/``metric`` output (text or JSON)."""
    body = strip_comment_header(text)
    if body.lstrip()[:1] in ("{", "["):
        return _parse_json(body)
    return _parse_text(body.splitlines())
