"""Parse ``hipify-perl -examine`` / ``--print-stats`` statistics.

Per file hipify-perl prints::

    [HIPIFY] info: file 'nbody-orig.cu' statistics:
      CONVERTED refs count: 7
      TOTAL lines of code: 91
      WARNINGS: 0
    [HIPIFY] info: CONVERTED refs by names:
      cudaFree => hipFree: 1

and for several files a ``GLOBAL`` block with the totals. Result:
``{"files": [{"file", "converted", "warnings", "loc", "refs": {name: count}, "warning_lines": [...]}],
"converted", "warnings", "loc"}`` with totals summed over the files (the GLOBAL block, when present, is cross-checked).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from rocmtrain.diagnostics.parsers._common import ParseError, strip_comment_header

_FILE = re.compile(r"\[HIPIFY\]\s+info:\s+file\s+'(.+?)'\s+statistics:")
_COUNT = re.compile(r"^\s*(CONVERTED refs count|TOTAL lines of code|WARNINGS)\s*:\s*(\d+)")
_REF = re.compile(r"^\s*(\S+)\s*=>\s*(\S+)\s*:\s*(\d+)\s*$")
# "  warning: FILE:#LINE : code" (unconverted CUDA API) and "  FILE:LINE: warning: unsupported ..."
_WARN = re.compile(
    r"^\s*(?:warning:\s*(?P<f1>.+?):#(?P<l1>\d+)\s*:|(?P<f2>.+?):(?P<l2>\d+):\s*warning:)\s*(?P<t>.*?)\s*$"
)
_KEYS = {"CONVERTED refs count": "converted", "TOTAL lines of code": "loc", "WARNINGS": "warnings"}


@dataclass
class HipifyStats:
    files: list[dict[str, Any]] = field(default_factory=list)
    global_block: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def totals(self) -> dict[str, int]:
        return {
            k: sum(int(f.get(k, 0)) for f in self.files) for k in ("converted", "warnings", "loc")
        }

    def to_schema(self) -> dict[str, Any]:
        return {"files": self.files, **self.totals()}


def parse_hipify_stats(text: str) -> HipifyStats:
    """Statistics per converted file; :class:`ParseError` when no ``statistics:`` block exists."""
    stats = HipifyStats()
    current: dict[str, Any] | None = None
    pending: list[dict[str, Any]] = []  # hipify prints a file's warnings before its statistics
    for line in strip_comment_header(text).splitlines():
        w = _WARN.match(line)
        if w:
            f, ln = w.group("f1") or w.group("f2"), w.group("l1") or w.group("l2")
            pending.append({"file": f, "line": int(ln), "text": w.group("t")})
            continue
        m = _FILE.search(line)
        if m:
            current = {"file": m.group(1), "converted": 0, "warnings": 0, "loc": 0, "refs": {}}
            current["warning_lines"] = [p for p in pending if p["file"] == m.group(1)]
            pending = []
            if m.group(1).upper() == "GLOBAL":
                stats.global_block = current
            else:
                stats.files.append(current)
            continue
        if current is None:
            continue
        m = _COUNT.match(line)
        if m:
            current[_KEYS[m.group(1)]] = int(m.group(2))
            continue
        m = _REF.match(line)
        if m:
            current["refs"][f"{m.group(1)} => {m.group(2)}"] = int(m.group(3))
    if not stats.files and stats.global_block is None:
        raise ParseError(
            "not hipify-perl statistics: no \"[HIPIFY] info: file '...' statistics:\" block "
            "(run `hipify-perl -examine FILE.cu`)"
        )
    if not stats.files and stats.global_block is not None:
        stats.files.append(stats.global_block)
    for f in stats.files:
        listed = sum(f["refs"].values())
        if f["refs"] and listed != f["converted"]:
            stats.notes.append(
                f"{f['file']}: refs listed by name sum to {listed}, CONVERTED refs count is "
                f"{f['converted']} (partial listing?)"
            )
    if stats.global_block is not None and stats.global_block is not stats.files[0]:
        g, t = stats.global_block, stats.totals()
        for k in ("converted", "warnings", "loc"):
            if g[k] != t[k]:
                stats.notes.append(f"GLOBAL {k}={g[k]} differs from the per-file sum {t[k]}")
    return stats
