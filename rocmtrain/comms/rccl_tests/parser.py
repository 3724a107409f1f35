"""Parse rccl-tests / nccl-tests output (text, nccl-tests ``-J`` JSON, rccl-tests ``-Z csv``).

    from rocmtrain.comms.rccl_tests.parser import parse_text, assess
    result = parse_text(Path("all_reduce.log").read_text())
    errors, warnings = assess(result, min_busbw_gbps=100.0, floor_min_bytes=64 << 20)

The text parser reads columns by the header, not by position, so it accepts: both banner styles
(``# nThread 1 nGpus 8 ...`` and the old ``# nThreads: 1 nGpus: 2 nRanks: 1 ...``), the old table
without ``redop``/``root``/``#wrong`` whose ``error`` column is a float (max error, not a count),
out-of-place and in-place blocks (or one), ``N/A`` in ``#wrong`` (``-c 0``), per-iteration columns,
launcher prefixes (``srun --label`` → `` 0: ``, OpenMPI ``--tag-output`` → ``[1,0]<stdout>:``),
interleaved log lines (``NCCL INFO``/``WARN``, MPI warnings), failure trailers (``Test NCCL failure``,
``Test CUDA failure``, ``Test timeout``) and a missing summary (= the run failed, was killed or hung).
Health is judged per size (:func:`assess`), never by "Avg bus bandwidth", which averages every row.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

_PREFIX_RE = re.compile(r"^(?:\[\d+,\d+\]<std(?:out|err)>:\s?|\s*\d+:\s)")
_OOB_RE = re.compile(r"Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?")
_AVG_RE = re.compile(r"Avg bus bandwidth\s*:\s*([-+0-9.eEnaif]+)")
_TRAILER_RE = re.compile(r"(Test (?:NCCL|CUDA|HIP) failure.*|Test timeout.*)")
_TRACE_RE = re.compile(r"pid \d+: Test failure")
_WARN_RE = re.compile(r"NCCL WARN (.*)")
_PERF_RE = re.compile(r"\b([a-z_]+?)_perf(?:_mpi)?\b")
_COLL_RE = re.compile(r"Collective test (?:starting|concluded): (\w+?)(?:_perf)?\b")
_RANK_RE = re.compile(r"^#?\s*Rank\s+(\d+)\s.*\bdevice\b")
_BANNER_RE = re.compile(r"nThreads?:?\s+(\d+)\s+nGpus:?\s+(\d+)(?:\s+nRanks:?\s+(\d+))?")
_LIB_RE = re.compile(r"(RCCL version\s*:?\s*\S+|nccl-tests version .*|NCCL version \S+)")
_TIME_COLS = ("time", "cputime")
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "alltoall",
    "alltoallv",
    "broadcast",
    "reduce",
    "sendrecv",
    "scatter",
    "gather",
    "hypercube",
)


@dataclass
class Measurement:
    """One block (out-of-place or in-place) of a row."""

    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None
    """Wrong elements (``#wrong``); None for ``N/A`` (validation off) and for the old format."""
    max_error: float | None = None
    """Old format only: the float ``error`` column (max error, not a count)."""
    flagged: bool = False
    """The value carried the ``*`` that marks an error above the threshold."""


@dataclass
class Row:
    size_bytes: int
    count: int
    type: str
    redop: str | None
    root: int | None
    out_of_place: Measurement | None
    in_place: Measurement | None
    line: int = 0


@dataclass
class ParseResult:
    collective: str | None = None
    ranks: int | None = None
    rows: list[Row] = field(default_factory=list)
    avg_busbw_gbps: float | None = None
    oob_values: int | None = None
    header_seen: bool = False
    complete: bool = False
    """The summary (``Out of bounds values``/``Avg bus bandwidth``) was printed after the table."""
    failures: list[str] = field(default_factory=list)
    """Failure trailers (``Test NCCL failure ...``, ``Test timeout ...``) and ``NCCL WARN`` messages."""
    parse_errors: list[str] = field(default_factory=list)
    library: str | None = None
    source_format: str = "text"


def strip_prefix(line: str) -> str:
    """Remove one launcher prefix (`` 0: `` from ``srun --label``, ``[1,0]<stdout>:`` from mpirun)."""
    return _PREFIX_RE.sub("", line, count=1)


def _int(tok: str) -> int | None:
    try:
        return int(tok)
    except ValueError:
        return None


def _num(tok: str) -> float:
    return float(tok.rstrip("*"))


@dataclass
class _Layout:
    lead: list[str]
    blocks: list[tuple[str, list[str]]]  # (out_of_place|in_place, column names)
    timestamp: bool

    @property
    def width(self) -> int:
        return len(self.lead) + sum(len(cols) for _, cols in self.blocks)


def _layout(tokens: list[str], banner: str | None) -> _Layout:
    timestamp = tokens[-1] == "timestamp"
    if timestamp:
        tokens = tokens[:-1]
    starts = [i for i, t in enumerate(tokens) if t in _TIME_COLS]
    lead = tokens[: starts[0]]
    groups = [tokens[s:e] for s, e in zip(starts, starts[1:] + [len(tokens)], strict=True)]
    if len(groups) == 2:
        names = ["out_of_place", "in_place"]
    elif banner is not None and "out-of-place" in banner:
        names = ["out_of_place"]
    else:
        names = ["in_place"]
    return _Layout(lead, list(zip(names, groups, strict=False)), timestamp)


def _measure(cols: list[str], vals: list[str]) -> Measurement:
    m = dict(zip(cols, vals, strict=True))
    wrong: int | None = None
    max_error: float | None = None
    flagged = any(v.endswith("*") for v in vals)
    if "#wrong" in m:
        w = m["#wrong"].rstrip("*")
        wrong = None if w.upper() == "N/A" else int(float(w))
    elif "error" in m:
        max_error = _num(m["error"])
    t = m.get("time", m.get("cputime", "nan"))
    return Measurement(_num(t), _num(m["algbw"]), _num(m["busbw"]), wrong, max_error, flagged)


def _row(toks: list[str], lay: _Layout, lineno: int) -> Row:
    blocks = list(lay.blocks)
    n = len(toks)
    if lay.timestamp and n > lay.width:
        toks = toks[: lay.width]
    elif n != lay.width:
        # nccl-tests prints an empty out-of-place body for trace replays: one block short.
        if len(blocks) == 2 and n == lay.width - len(blocks[0][1]):
            blocks = blocks[1:]
        else:
            raise ValueError(f"{n} fields, the header has {lay.width}")
    lead = dict(zip(lay.lead, toks, strict=False))
    pos = len(lay.lead)
    parsed: dict[str, Measurement | None] = {"out_of_place": None, "in_place": None}
    for name, cols in blocks:
        parsed[name] = _measure(cols, toks[pos : pos + len(cols)])
        pos += len(cols)
    root = lead.get("root")
    return Row(
        size_bytes=int(lead["size"]),
        count=int(lead["count"]),
        type=lead.get("type", ""),
        redop=lead.get("redop"),
        root=None if root is None else int(root),
        out_of_place=parsed["out_of_place"],
        in_place=parsed["in_place"],
        line=lineno,
    )


_DEFAULT_HEADER = "size count type redop root time algbw busbw #wrong time algbw busbw #wrong"


def parse_text(text: str) -> ParseResult:
    """Parse the stdout of one rccl-tests/nccl-tests run (or a pasted excerpt)."""
    res = ParseResult()
    layout: _Layout | None = None
    banner: str | None = None
    ranks: set[int] = set()
    lines = text.splitlines()
    for lineno, raw in enumerate(lines, 1):
        line = strip_prefix(raw).strip()
        if not line:
            continue
        body = line.lstrip("#").strip()
        toks = body.split()
        if m := _COLL_RE.search(body):
            res.collective = m.group(1)
        elif res.collective is None and (m := _PERF_RE.search(body)) and m.group(1) in COLLECTIVES:
            res.collective = m.group(1)
        if toks[:1] == ["size"] and "count" in toks and any(t in _TIME_COLS for t in toks):
            layout = _layout(toks, banner)
            res.header_seen = True
            continue
        if "out-of-place" in body or body == "in-place":
            banner = body
            continue
        if m := _OOB_RE.search(body):
            res.oob_values = int(m.group(1))
            res.complete = bool(res.rows)
            continue
        if m := _AVG_RE.search(body):
            res.avg_busbw_gbps = float(m.group(1))
            res.complete = res.complete or bool(res.rows)
            continue
        # failure trailers are never '#' lines (a '#' line quoting one is a comment, not a failure)
        if not line.startswith("#") and (m := _TRAILER_RE.search(body)):
            res.failures.append(m.group(1).strip())
            continue
        if _TRACE_RE.search(body):
            continue
        if not line.startswith("#") and (m := _WARN_RE.search(body)):
            msg = "NCCL WARN " + m.group(1).strip()
            if msg not in res.failures:
                res.failures.append(msg)
            continue
        if m := _RANK_RE.match(line):
            ranks.add(int(m.group(1)))
            continue
        if m := _LIB_RE.search(body):
            res.library = res.library or m.group(1)
        if line.startswith("#") or len(toks) < 2 or _int(toks[0]) is None or _int(toks[1]) is None:
            continue  # banner, comment or an interleaved log line
        if layout is None:  # rows without a header (an excerpt): assume the current format
            layout = _layout(_DEFAULT_HEADER.split(), None)
        try:
            res.rows.append(_row(toks, layout, lineno))
            res.complete = False  # a summary only counts after the last row
        except (ValueError, KeyError) as exc:
            res.parse_errors.append(f"line {lineno}: cannot parse result row ({exc}): {raw!r}")
    res.ranks = len(ranks) or None
    return res


def parse_json(data: str | dict[str, Any]) -> ParseResult:
    """Parse the ``-J file.json`` output of NVIDIA nccl-tests (JSON file version 3)."""
    obj = json.loads(data) if isinstance(data, str) else data
    res = ParseResult(source_format="json")
    args = obj.get("args") or []
    if args and (m := _PERF_RE.search(str(args[0]))):
        res.collective = m.group(1)
    res.ranks = len(obj.get("devices") or []) or None
    for i, r in enumerate(obj.get("results") or [], 1):

        def block(b: dict[str, Any] | None) -> Measurement | None:
            if not b:
                return None
            nwrong = b.get("nwrong")
            t = b.get("time", b.get("cpu_time"))
            return Measurement(
                float(t),
                float(b["alg_bw"]),
                float(b["bus_bw"]),
                None if nwrong is None else int(nwrong),
            )

        root = str(r.get("root", "")).strip()
        res.rows.append(
            Row(
                int(r["size"]),
                int(r["count"]),
                str(r.get("type", "")),
                r.get("redop"),
                int(root) if root else None,
                block(r.get("out_of_place")),
                block(r.get("in_place")),
                i,
            )
        )
    res.header_seen = True
    oob = obj.get("out_of_bounds")
    if isinstance(oob, dict):
        res.oob_values = int(oob.get("count", 0))
        res.complete = True
    avg = obj.get("average_bus_bandwidth")
    if isinstance(avg, dict) and avg.get("bandwidth") is not None:
        res.avg_busbw_gbps = float(avg["bandwidth"])
    res.failures.extend(str(e) for e in obj.get("errors") or [] if str(e).strip())
    return res


def parse_csv(text: str) -> ParseResult:
    """Parse rccl-tests ``-x FILE -Z csv`` output (one line per size and in/out-of-place).

    The CSV carries no summary, so ``complete`` is True when rows parse; check the exit code too.
    """
    res = ParseResult(source_format="csv")
    reader = csv.DictReader(io.StringIO(text), skipinitialspace=True)
    rows: dict[tuple[str, int, str, str], Row] = {}
    for i, rec in enumerate(reader, 2):
        try:
            res.collective = res.collective or rec["collective"].replace("_perf", "")
            ranks = rec.get("ranks") or rec.get("gpus")
            res.ranks = int(ranks) if ranks else res.ranks
            w = rec["#wrong"].strip()
            meas = Measurement(
                float(rec["time"]),
                float(rec["algbw"]),
                float(rec["busbw"]),
                None if w.upper() == "N/A" or int(w) < 0 else int(w),
            )
            key = (rec["collective"], int(rec["size"]), rec["type"], rec["redop"])
            row = rows.setdefault(
                key, Row(int(rec["size"]), 0, rec["type"], rec["redop"], None, None, None, i)
            )
            if int(rec["inplace"]):
                row.in_place = meas
            else:
                row.out_of_place = meas
        except (KeyError, ValueError, TypeError) as exc:
            res.parse_errors.append(f"csv line {i}: cannot parse ({exc}): {rec}")
    res.rows = list(rows.values())
    res.header_seen = bool(reader.fieldnames)
    res.complete = bool(res.rows)
    return res


def _bad(value: float) -> bool:
    return not math.isfinite(value) or value < 0


def assess(
    res: ParseResult,
    *,
    min_busbw_gbps: float | None = None,
    floor_min_bytes: int = 0,
    dip_ratio: float = 10.0,
) -> tuple[list[str], list[str]]:
    """Judge a run per size. Returns ``(errors, warnings)``; the run is healthy iff no errors.

    Errors: failure trailers, unparsable rows, no table, a missing summary (failed/killed/hung), a
    non-zero ``Out of bounds values``, ``#wrong`` > 0 or a ``*``-flagged error in any row, invalid
    numbers (NaN, negative), busbw below ``min_busbw_gbps`` for sizes >= ``floor_min_bytes``.
    Warnings: a busbw ``dip_ratio`` times below the best of the smaller sizes (a performance cliff).
    """
    errors = [f"run failed: {f}" for f in res.failures]
    errors += res.parse_errors
    if not res.header_seen and not res.rows:
        errors.append("no rccl-tests/nccl-tests result table found (is this an rccl-tests log?)")
    elif not res.rows:
        errors.append("no result rows: the run stopped before the first message size")
    elif not res.complete:
        last = res.rows[-1].size_bytes
        errors.append(
            f"incomplete: no 'Out of bounds values' summary after the last row (size "
            f"{last} B): the run failed, was killed or hung"
        )
    if res.oob_values:
        errors.append(f"validation failed: Out of bounds values : {res.oob_values}")
    warnings: list[str] = []
    blocks = [m for r in res.rows for m in (r.out_of_place, r.in_place) if m is not None]
    if blocks and all(m.wrong is None and m.max_error is None for m in blocks):
        warnings.append("results not validated (#wrong is N/A: the test ran with -c 0)")
    best = 0.0
    best_size = 0
    for row in res.rows:
        for label, m in (("out-of-place", row.out_of_place), ("in-place", row.in_place)):
            if m is None:
                continue
            where = f"size {row.size_bytes} B {label}"
            if m.wrong:
                errors.append(f"{where}: #wrong={m.wrong} (wrong results)")
            if m.flagged:
                errors.append(f"{where}: error above the test's threshold (marked *)")
            if any(_bad(v) for v in (m.time_us, m.algbw_gbps, m.busbw_gbps)) or m.time_us == 0:
                errors.append(
                    f"{where}: invalid measurement time={m.time_us} us busbw={m.busbw_gbps} GB/s"
                )
                continue
            if (
                min_busbw_gbps is not None
                and row.size_bytes >= floor_min_bytes
                and m.busbw_gbps < min_busbw_gbps
            ):
                errors.append(
                    f"{where}: busbw {m.busbw_gbps:g} GB/s below the floor {min_busbw_gbps:g} GB/s"
                )
        bw = max(
            (
                m.busbw_gbps
                for m in (row.out_of_place, row.in_place)
                if m is not None and not _bad(m.busbw_gbps)
            ),
            default=0.0,
        )
        if best > 0 and bw * dip_ratio < best and row.size_bytes > best_size:
            warnings.append(
                f"size {row.size_bytes} B: busbw {bw:g} GB/s is over {dip_ratio:g}x "
                f"below {best:g} GB/s at {best_size} B (performance cliff)"
            )
        if bw > best:
            best, best_size = bw, row.size_bytes
    return errors, warnings


def to_json(res: ParseResult, errors: list[str]) -> dict[str, Any]:
    """The ``parse --json`` object (schema in RCCL.md)."""

    def block(m: Measurement | None) -> dict[str, Any] | None:
        if m is None:
            return None
        return {
            "time_us": m.time_us,
            "algbw_gbps": m.algbw_gbps,
            "busbw_gbps": m.busbw_gbps,
            "wrong": m.wrong,
        }

    return {
        "ok": not errors,
        "collective": res.collective,
        "ranks": res.ranks,
        "rows": [
            {
                "size_bytes": r.size_bytes,
                "count": r.count,
                "type": r.type,
                "redop": r.redop,
                "root": r.root,
                "out_of_place": block(r.out_of_place),
                "in_place": block(r.in_place),
            }
            for r in res.rows
        ],
        "avg_busbw_gbps": res.avg_busbw_gbps,
        "errors": list(errors),
    }
