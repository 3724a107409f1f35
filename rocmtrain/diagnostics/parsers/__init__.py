"""Header-driven parsers for GPU tool outputs, pure functions of text (tested on recorded outputs).

    from rocmtrain.diagnostics.parsers import parse
    parse("rocm-smi", text).to_schema()   # {"devices": [...], "warnings": [...]}

Kinds: ``rocminfo``, ``rocm-smi``, ``amd-smi``, ``nvidia-smi`` (``--query-gpu`` CSV) and
``hipify-stats`` (returns :class:`HipifyStats`, schema ``{"files", "converted", "warnings", "loc"}``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rocmtrain.diagnostics.parsers._common import DeviceRecord, ParseError, ParseResult
from rocmtrain.diagnostics.parsers.amd_smi import parse_amd_smi
from rocmtrain.diagnostics.parsers.hipify_stats import HipifyStats, parse_hipify_stats
from rocmtrain.diagnostics.parsers.nvidia_smi import parse_nvidia_smi_csv
from rocmtrain.diagnostics.parsers.rocm_smi import parse_rocm_smi
from rocmtrain.diagnostics.parsers.rocminfo import parse_rocminfo

PARSERS: dict[str, Callable[[str], Any]] = {
    "rocminfo": parse_rocminfo,
    "rocm-smi": parse_rocm_smi,
    "amd-smi": parse_amd_smi,
    "nvidia-smi": parse_nvidia_smi_csv,
    "hipify-stats": parse_hipify_stats,
}


def parse(kind: str, text: str) -> ParseResult | HipifyStats:
    """Parse ``text`` as the output of tool ``kind``; :class:`ParseError` on unknown kind or text."""
    try:
        fn = PARSERS[kind]
    except KeyError:
        raise ParseError(f"unknown kind {kind!r}; choose one of {sorted(PARSERS)}") from None
    if not text.strip():
        raise ParseError(f"empty input: nothing to parse as {kind}")
    return fn(text)


__all__ = ["DeviceRecord", "HipifyStats", "PARSERS", "ParseError", "ParseResult", "parse"]
