"""Parse ``rocm-smi`` output in its three shapes: concise table, ``GPU[i] : key: value``, ``--json``.

Concise table (plain ``rocm-smi``): the header row names the columns and an optional second header
row adds units / sub-labels. Columns are located **by header**, never by position: each value is
assigned to the header column its text overlaps most, so the pre-6.x layout
(``GPU  Temp (DieEdge)  AvgPwr ...``), the 6.x layout (``Device  [Model : Revision]  Temp  Power
Partitions ...`` with the product name on a continuation line), the ``Node  IDs (DID, GUID)`` layout,
reordered columns and CPX-partitioned nodes with 64 rows all read the same way.

Key/value form (``rocm-smi --showpower``, ``--showtemp``, ``--showproductname``, ...)::

    GPU[1]          : Average Graphics Package Power (W): N/A (Secondary die)

JSON form (``rocm-smi ... --json``): ``{"card0": {"Card series": ..., ...}}``; key names are matched
case-insensitively ("Card series" and "Card Series" both occur in the wild).

Pasted outputs are often cut: a table without its closing ``====`` line, a row cut short (terminal
width), a ``GPU[i]`` line cut mid-key, JSON cut mid-object. Those give the devices that were complete
enough to read plus a warning saying what is missing; only text with nothing to read is an error.
"""

from __future__ import annotations

import json
import re

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

_KV_LINE = re.compile(r"^\s*GPU\[(\d+)\]\s*:\s*(.+?)\s*:\s*(.*?)\s*$")
_SPLIT = re.compile(r"\S+(?: \S+)*")  # tokens separated by 2+ spaces


def _columns(line: str) -> list[tuple[int, int, str]]:
    return [(m.start(), m.end(), m.group(0)) for m in _SPLIT.finditer(line)]


def _assign(tokens: list[tuple[int, int, str]], starts: list[int], width: int) -> list[list[str]]:
    """Put each token into the header column whose span [start_i, start_i+1) it overlaps most."""
    bounds = [*starts[1:], max(width, starts[-1] + 1)]
    cells: list[list[str]] = [[] for _ in starts]
    for a, b, text in tokens:
        best, best_ov = 0, -1
        for i, (lo, hi) in enumerate(zip(starts, bounds, strict=True)):
            ov = min(b, hi) - max(a, lo)
            if ov > best_ov:
                best, best_ov = i, ov
        cells[best].append(text)
    return cells


def _header_index(lines: list[str]) -> int | None:
    for i, line in enumerate(lines):
        cols = [c[2] for c in _columns(line)]
        if cols and cols[0] in ("GPU", "Device") and len(cols) >= 3:
            return i
    return None


def _label_role(label: str) -> str | None:
    low = label.lower()
    if low.startswith("temp"):
        return "temp"
    if low in ("power", "avgpwr") or low.startswith("power (") or low.startswith("avgpwr"):
        return "power"
    if low.startswith("vram%"):
        return "vram_pct"
    if low.startswith("gpu%"):
        return "util"
    if low.startswith("[model") or low.startswith("ids") or "did" in low:
        return "device_id"
    return None


def _cut_row_warning(
    rec: DeviceRecord, line: str, starts: list[int], labels: list[str]
) -> str | None:
    """A warning when a table row ends before the header's last column (cut at the terminal width)."""
    end = len(line.rstrip())
    missing = [lab for start, lab in zip(starts, labels, strict=True) if start >= end]
    if not missing:
        return None
    return (
        f"GPU {rec.index}: row cut short (truncated paste?): no value for {', '.join(missing)}; "
        "the last value read may be incomplete"
    )


def _parse_concise(lines: list[str], hi: int) -> ParseResult:
    header = _columns(lines[hi])
    starts = [c[0] for c in header]
    labels = [c[2] for c in header]
    first = hi + 1
    # optional sub-header row (units, "(Junction)", "Name (20 chars)"): no leading integer
    if first < len(lines) and lines[first].strip() and not lines[first].lstrip()[0].isdigit():
        if not lines[first].lstrip().startswith("="):
            sub = _assign(_columns(lines[first]), starts, len(lines[first]))
            labels = [f"{lab} {' '.join(s)}".strip() for lab, s in zip(labels, sub, strict=True)]
            first += 1
    roles = {i: _label_role(lab) for i, lab in enumerate(labels)}
    if "temp" not in roles.values() and "power" not in roles.values():
        raise ParseError(f"rocm-smi table header has no Temp/Power column: {labels}")
    result = ParseResult()
    closed = False
    for line in lines[first:]:
        stripped = line.strip()
        if stripped.startswith("=") or stripped.startswith("End of ROCm SMI"):
            closed = closed or bool(result.devices)
            continue
        if not stripped:
            continue
        if not re.match(r"^\s*\d+\s", line + " "):
            if result.devices and result.devices[-1].name is None:
                result.devices[-1].name = stripped  # continuation row: "AMD Instinct MI300X"
            continue
        cells = [" ".join(c) for c in _assign(_columns(line), starts, len(line))]
        rec = DeviceRecord(index=int(cells[0].split()[0]))
        cut = _cut_row_warning(rec, line, starts, labels)
        if cut:
            result.warnings.append(cut)
        for i, role in roles.items():
            value = cells[i]
            if role and is_na(value):
                result.warnings.append(f"GPU {rec.index}: {labels[i]} is {value or 'empty'}")
                continue
            if role == "temp":
                rec.temp_c = first_float(value)
            elif role == "power":
                rec.power_w = first_float(value)
            elif role == "util":
                rec.util_pct = first_float(value)
            elif role == "vram_pct":
                rec.vram_used_pct = first_float(value)
            elif role == "device_id":
                rec.device_id = hex_id(value)
        result.devices.append(rec)
    if not result.devices:
        raise ParseError(
            "rocm-smi table has a header but no device rows (output cut before the first row?)"
        )
    if not closed:
        result.warnings.append(
            f"rocm-smi table ends without its closing '====' line (truncated paste?): read "
            f"{len(result.devices)} device row(s); later GPUs may be missing"
        )
    return result


def _apply_key(rec: DeviceRecord, key: str, value: object, warnings: list[str]) -> None:
    k = key.strip().lower()
    if isinstance(value, str) and is_na(value):
        if "power" in k or "temperature" in k:
            warnings.append(f"GPU {rec.index}: {key.strip()}: {value.strip()}")
        return
    if "power" in k and "(w)" in k and "cap" not in k:
        rec.power_w = first_float(value)
    elif k.startswith("temperature") and ("junction" in k or rec.temp_c is None):
        rec.temp_c = first_float(value)
    elif k in ("card series", "card model name", "device name", "marketing name"):
        rec.name = str(value).strip() or rec.name
    elif k in ("device id", "card model") and hex_id(value):
        rec.device_id = rec.device_id or hex_id(value)
    elif k in ("gfx version", "gfx_version"):
        rec.gfx_arch = normalize_gfx_arch(str(value))
    elif k.startswith("vram total memory"):
        rec.vram_total_bytes = to_bytes(value, "B")
    elif k.startswith("vram total used memory"):
        rec.vram_used_bytes = to_bytes(value, "B")
    elif k == "gpu use (%)":
        rec.util_pct = first_float(value)


_GPU_PREFIX = re.compile(r"^\s*GPU\[(\d+)\]")


def _parse_keyvalue(lines: list[str]) -> ParseResult:
    by_index: dict[int, DeviceRecord] = {}
    warnings: list[str] = []
    for line in lines:
        m = _KV_LINE.match(line)
        if m:
            idx = int(m.group(1))
            rec = by_index.setdefault(idx, DeviceRecord(index=idx))
            _apply_key(rec, m.group(2), m.group(3), warnings)
        elif (cut := _GPU_PREFIX.match(line)) and line.strip():
            warnings.append(
                f"GPU {cut.group(1)}: line cut short (truncated paste?), skipped: {line.strip()!r}"
            )
    return ParseResult(devices=[by_index[i] for i in sorted(by_index)], warnings=warnings)


def _complete_cards(text: str) -> dict[str, object]:
    """The ``"cardN": {...}`` objects of a JSON text cut mid-way that still decode completely."""
    decoder = json.JSONDecoder()
    cards: dict[str, object] = {}
    for m in re.finditer(r'"(card\d+)"\s*:\s*', text):
        try:
            value, _ = decoder.raw_decode(text, m.end())
        except json.JSONDecodeError:
            continue
        cards[m.group(1)] = value
    return cards


def _parse_json(text: str) -> ParseResult:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        data = _complete_cards(text)
        if not data:
            raise ParseError(f"rocm-smi JSON is not valid JSON: {e}") from None
        result = _parse_json(json.dumps(data))
        result.warnings.append(
            f"rocm-smi JSON is cut short ({e.msg} at char {e.pos}; truncated paste?): read the "
            f"{len(data)} complete card object(s) {', '.join(data)}"
        )
        return result
    if not isinstance(data, dict):
        raise ParseError("rocm-smi JSON must be an object keyed by 'card0', 'card1', ...")
    result = ParseResult()
    for key in sorted(data, key=lambda k: int(re.sub(r"\D", "", k) or 0)):
        m = re.fullmatch(r"card(\d+)", key)
        if not m or not isinstance(data[key], dict):
            continue
        rec = DeviceRecord(index=int(m.group(1)))
        for k, v in data[key].items():
            _apply_key(rec, k, v, result.warnings)
        result.devices.append(rec)
    if not result.devices:
        raise ParseError("rocm-smi JSON has no 'cardN' entries")
    return result


def parse_rocm_smi(text: str) -> ParseResult:
    """Devices in a ``rocm-smi`` output (any of the three shapes); :class:`ParseError` otherwise."""
    body = strip_comment_header(text)
    if body.lstrip().startswith("{"):
        return _parse_json(body)
    lines = body.splitlines()
    if any(_KV_LINE.match(line) for line in lines):
        return _parse_keyvalue(lines)
    hi = _header_index(lines)
    if hi is None:
        raise ParseError(
            "not rocm-smi output: no 'GPU'/'Device' header row, no 'GPU[i] : key: value' lines "
            "and not JSON (save the output of `rocm-smi`, `rocm-smi --showpower` or `--json`)"
        )
    return _parse_concise(lines, hi)
