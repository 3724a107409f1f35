"""Parse ``rocminfo`` text: one :class:`DeviceRecord` per GPU agent.

``rocminfo`` prints ``Agent N`` blocks of ``Key: value`` lines indented by nesting level
(``Cache Info``, ``Pool Info`` → ``Pool k``, ``ISA Info``). GPU agents (``Device Type: GPU``) become
devices numbered 0, 1, ... in order (the HIP device order); CPU agents are skipped. Fields are found by
key name, so trimmed blocks (the LUMI excerpt has no pools) parse with ``None`` for what is missing.
A pasted excerpt whose ``Agent N`` header line was cut off still counts: an agent-level ``Name:`` line
(indent <= 2) with no header above it, or a second one inside the same block, starts a new agent, and
its ``Device Type: GPU`` / ``Name: gfx942`` lines decide whether it is a GPU (with a warning).

    Name: gfx942             → gfx_arch          Chip ID: 29857(0x74a1) → device_id "0x74a1"
    Marketing Name: ...      → name              Wavefront Size: 64(0x40) → wave_size
    Pool k (GLOBAL; COARSE GRAINED) Size: 201310208(0xbffc000) KB → vram_total_bytes
"""

from __future__ import annotations

import re

from rocmtrain.diagnostics.parsers._common import (
    DeviceRecord,
    ParseError,
    ParseResult,
    first_float,
    hex_id,
    strip_comment_header,
    to_bytes,
)
from rocmtrain.platform import normalize_gfx_arch

_AGENT = re.compile(r"^\s*Agent\s+(\d+)\s*$")
_KV = re.compile(r"^(\s*)([^:]+?)\s*:+\s*(.*?)\s*$")
_AGENT_NAME = re.compile(r"^[ \t]{0,2}Name:\s*\S")
#: label of an agent whose ``Agent N`` header line is missing from the pasted text
NO_HEADER = "?"


def _has_agent_name(block: list[str]) -> bool:
    return any(_AGENT_NAME.match(line) for line in block)


def _blocks(lines: list[str]) -> list[tuple[str, list[str]]]:
    """``(agent number, lines)`` per agent; a headerless agent (trimmed paste) gets :data:`NO_HEADER`."""
    blocks: list[tuple[str, list[str]]] = []
    for line in lines:
        m = _AGENT.match(line)
        if m:
            blocks.append((m.group(1), []))
            continue
        if _AGENT_NAME.match(line) and (not blocks or _has_agent_name(blocks[-1][1])):
            blocks.append((NO_HEADER, []))
        if blocks:
            blocks[-1][1].append(line)
    return blocks


def _parse_agent(lines: list[str]) -> tuple[dict[str, str], list[dict[str, str]]]:
    """Top-level ``key: value`` pairs of one agent and its memory pools (each a dict)."""
    top: dict[str, str] = {}
    pools: list[dict[str, str]] = []
    section = ""
    for line in lines:
        if line.strip().startswith("***"):
            continue
        m = _KV.match(line)
        if not m:
            if re.match(r"^\s+Pool\s+\d+\s*$", line) and section == "Pool Info":
                pools.append({})
            continue
        indent, key, value = len(m.group(1)), m.group(2).strip(), m.group(3)
        if indent <= 2:
            section = key if not value else ""
            top.setdefault(key, value)
        elif section == "Pool Info" and pools:
            pools[-1].setdefault(key, value)
    return top, pools


def parse_rocminfo(text: str) -> ParseResult:
    """Devices (GPU agents) in a ``rocminfo`` output; raises :class:`ParseError` if none."""
    lines = strip_comment_header(text).splitlines()
    blocks = _blocks(lines)
    if not blocks:
        raise ParseError(
            "not rocminfo output: no 'Agent N' blocks and no agent 'Name:' lines found "
            "(run `rocminfo` and save its full output)"
        )
    result = ParseResult()
    for agent_no, block in blocks:
        top, pools = _parse_agent(block)
        dev_type = top.get("Device Type", "").upper()
        if dev_type and dev_type != "GPU":
            continue
        name = top.get("Name")
        arch = normalize_gfx_arch(name)
        if not dev_type and arch is None:
            continue  # neither typed nor a gfx agent: not a GPU
        rec = DeviceRecord(index=len(result.devices))
        rec.gfx_arch = arch
        rec.device_id = hex_id(top.get("Chip ID"))
        rec.name = top.get("Marketing Name") or None
        ws = first_float(top.get("Wavefront Size"))
        rec.wave_size = int(ws) if ws is not None else None
        cu = first_float(top.get("Compute Unit"))
        rec.compute_units = int(cu) if cu is not None else None
        for pool in pools:
            seg = pool.get("Segment", "").upper()
            if "GLOBAL" in seg and "COARSE" in seg:
                rec.vram_total_bytes = to_bytes(pool.get("Size"))
                break
        if agent_no == NO_HEADER:
            result.warnings.append(
                f"GPU {rec.index} ({name}): its 'Agent N' header line is missing (trimmed paste?); "
                "counted from its Name / Device Type lines, so the HIP device order may be off"
            )
        if rec.name is None:
            result.warnings.append(f"agent {agent_no} (GPU {rec.index}): empty Marketing Name")
        if rec.vram_total_bytes is None:
            result.warnings.append(
                f"agent {agent_no} (GPU {rec.index}): no coarse-grained GLOBAL pool "
                "(trimmed output?); VRAM size unknown"
            )
        if rec.gfx_arch is None:
            result.warnings.append(f"agent {agent_no} (GPU {rec.index}): no gfx arch in Name")
        result.devices.append(rec)
    if not result.devices:
        result.warnings.append("rocminfo lists no GPU agent (driver loaded but no GPU visible?)")
    return result
