"""The rccl-tests parser on every real recorded log, and on variations derived from them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rocmtrain.comms.rccl_tests.parser import assess, parse_csv, parse_json, parse_text, to_json

FIX = "rccl_tests"
# Expected values read by eye from the files themselves (see each file's numbers).
EXPECTED = {
    "rccl-tests_allreduce_mi300x_1.txt": dict(
        ok=True,
        collective="all_reduce",
        ranks=8,
        rows=25,
        first=8,
        last=134217728,
        avg=54.8575,
        spot=(4194304, 112.03, 110.61),
    ),
    "rccl-tests_allgather_mi250x_multinode_5.txt": dict(
        ok=True,
        collective="all_gather",
        ranks=None,
        rows=17,
        first=65536,
        last=4294967296,
        avg=37.9868,
        spot=(2097152, 0.03, 0.03),
    ),
    "rccl-tests_allreduce_failed_init_4.txt": dict(
        ok=False,
        collective="all_reduce",
        ranks=2,
        rows=0,
        avg=None,
        reasons=[
            "Test NCCL failure common.cu:1285 'unhandled cuda error'",
            "invalid kernel file",
            "no rccl-tests/nccl-tests result table",
        ],
    ),
    "nccl-tests_allreduce_failed_midrun_8.txt": dict(
        ok=False,
        collective="all_reduce",
        ranks=2,
        rows=0,
        avg=None,
        reasons=["Test NCCL failure common.cu:392 'unhandled cuda error", "no result rows"],
    ),
    "nccl-tests_allgather_oob_failed_10.txt": dict(
        ok=False,
        collective="all_gather",
        ranks=None,
        rows=1,
        first=4294967296,
        last=4294967296,
        avg=128.942,
        spot=(4294967296, 129.05, 128.84),
        reasons=["Out of bounds values : 2"],
    ),
}


def _logs(fixtures_dir: Path) -> list[Path]:
    return sorted((fixtures_dir / FIX).iterdir())


def test_every_fixture_has_expectations(fixtures_dir: Path) -> None:
    assert {p.name for p in _logs(fixtures_dir)} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_log(fixtures_dir: Path, name: str) -> None:
    exp = EXPECTED[name]
    res = parse_text((fixtures_dir / FIX / name).read_text())
    errors, _ = assess(res)
    assert (not errors) is exp["ok"], errors
    assert res.collective == exp["collective"]
    assert res.ranks == exp["ranks"]
    assert len(res.rows) == exp["rows"]
    assert res.avg_busbw_gbps == exp["avg"]
    if res.rows:
        assert res.rows[0].size_bytes == exp["first"] and res.rows[-1].size_bytes == exp["last"]
        sizes = [r.size_bytes for r in res.rows]
        assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
        size, oop, ip = exp["spot"]
        row = next(r for r in res.rows if r.size_bytes == size)
        assert (row.out_of_place.busbw_gbps, row.in_place.busbw_gbps) == (oop, ip)
    for reason in exp.get("reasons", []):
        assert any(reason in e for e in errors), (reason, errors)
    doc = to_json(res, errors)
    assert set(doc) == {"ok", "collective", "ranks", "rows", "avg_busbw_gbps", "errors"}
    json.dumps(doc)


@pytest.mark.parametrize(
    "name", ["rccl-tests_allreduce_mi300x_1.txt", "rccl-tests_allgather_mi250x_multinode_5.txt"]
)
def test_rows_reproduce_the_printed_average(fixtures_dir: Path, name: str) -> None:
    """nccl-tests' "Avg bus bandwidth" averages busbw over every row and both blocks: an independent
    check that every row and column was read (values are printed rounded to 0.01)."""
    res = parse_text((fixtures_dir / FIX / name).read_text())
    vals = [m.busbw_gbps for r in res.rows for m in (r.out_of_place, r.in_place)]
    assert sum(vals) / len(vals) == pytest.approx(res.avg_busbw_gbps, abs=0.005)


def test_mi300x_details(fixtures_dir: Path) -> None:
    res = parse_text((fixtures_dir / FIX / "rccl-tests_allreduce_mi300x_1.txt").read_text())
    last = res.rows[-1]
    assert (last.count, last.type, last.redop, last.root) == (33554432, "float", "sum", -1)
    assert (last.out_of_place.time_us, last.out_of_place.algbw_gbps) == (801.4, 167.47)
    assert last.in_place.wrong == 0 and res.oob_values == 0 and res.complete


def test_old_format_error_column_is_not_a_count(fixtures_dir: Path) -> None:
    res = parse_text((fixtures_dir / FIX / "nccl-tests_allgather_oob_failed_10.txt").read_text())
    row = res.rows[0]
    assert row.redop is None and row.root is None
    assert row.out_of_place.wrong is None and row.out_of_place.max_error == 1.0
    assert res.oob_values == 2


def test_multinode_cliff_is_a_warning(fixtures_dir: Path) -> None:
    res = parse_text(
        (fixtures_dir / FIX / "rccl-tests_allgather_mi250x_multinode_5.txt").read_text()
    )
    errors, warnings = assess(res)
    assert not errors
    assert any("size 2097152 B" in w for w in warnings)
    assert not any("size 16777216 B" in w for w in warnings)


# ---- synthetic variations of the real MI300X log ----


@pytest.fixture()
def mi300x(fixtures_dir: Path) -> str:
    return (fixtures_dir / FIX / "rccl-tests_allreduce_mi300x_1.txt").read_text()


def _sig(text: str) -> list[tuple[int, float, float]]:
    res = parse_text(text)
    return [(r.size_bytes, r.out_of_place.busbw_gbps, r.in_place.busbw_gbps) for r in res.rows]


@pytest.mark.parametrize("prefix", ["[1,0]<stdout>:", " 0: ", "12: "])
def test_launcher_prefixes(mi300x: str, prefix: str) -> None:
    prefixed = "\n".join(prefix + line for line in mi300x.splitlines())
    res = parse_text(prefixed)
    assert _sig(prefixed) == _sig(mi300x) and len(res.rows) == 25
    assert not assess(res)[0] and res.ranks == 8


def test_interleaved_log_lines(mi300x: str) -> None:
    noise = [
        "c42f4555f685:56417:56417 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
        "--------------------------------------------------------------------------",
        "WARNING: There was an error initializing an OpenFabrics device.",
        "[1,3]<stderr>:hwloc warning: ignoring unknown NUMA node",
    ]
    out = []
    for i, line in enumerate(mi300x.splitlines()):
        out.append(line)
        out.append(noise[i % len(noise)])
    text = "\n".join(out)
    assert _sig(text) == _sig(mi300x)
    assert assess(parse_text(text))[0] == []


def _rows_edit(text: str, fn) -> str:
    row = re.compile(r"^(\s*\d+\s+\d+\s+float\s+sum\s+-1)(\s.*)$")
    lines = []
    for line in text.splitlines():
        m = row.match(line)
        lines.append(fn(m.group(1), m.group(2).split()) if m else line)
    return "\n".join(lines) + "\n"


def test_na_in_wrong_column(mi300x: str) -> None:
    text = _rows_edit(
        mi300x, lambda lead, t: lead + "  " + "  ".join(t[:3] + ["N/A"] + t[4:7] + ["N/A"])
    )
    res = parse_text(text)
    assert len(res.rows) == 25 and all(r.in_place.wrong is None for r in res.rows)
    errors, warnings = assess(res)
    assert not errors and any("not validated" in w for w in warnings)


def test_wrong_elements_fail_the_size(mi300x: str) -> None:
    def inject(lead: str, t: list[str]) -> str:
        if lead.split()[0] == "65536":
            t[7] = "12"
        return lead + "  " + "  ".join(t)

    errors, _ = assess(parse_text(_rows_edit(mi300x, inject)))
    assert errors == ["size 65536 B in-place: #wrong=12 (wrong results)"]


def test_nan_busbw_is_out_of_bounds(mi300x: str) -> None:
    def inject(lead: str, t: list[str]) -> str:
        if lead.split()[0] == "1024":
            t[2] = "-nan"
        return lead + "  " + "  ".join(t)

    errors, _ = assess(parse_text(_rows_edit(mi300x, inject)))
    assert len(errors) == 1 and "size 1024 B out-of-place: invalid measurement" in errors[0]


def test_truncated_mid_row(mi300x: str) -> None:
    cut = mi300x.index("   801.4")  # inside the 128 MiB row
    errors, _ = assess(parse_text(mi300x[:cut]))
    assert any("cannot parse result row" in e for e in errors)
    assert any("incomplete" in e and "67108864" in e for e in errors)


def test_truncated_at_line_boundary_then_timeout_trailer(mi300x: str) -> None:
    lines = mi300x.splitlines()
    keep = [i for i, line in enumerate(lines) if line.strip().startswith("2097152 ")][0]
    text = "\n".join(lines[: keep + 1] + ["c42f4555f685: Test timeout (30s) common.cu:518"])
    errors, _ = assess(parse_text(text))
    assert errors[0] == "run failed: Test timeout (30s) common.cu:518"
    assert "incomplete" in errors[1] and "size 2097152 B" in errors[1]


def test_garbled_and_empty_input() -> None:
    for text in ["", "\x00\x01garbage\nnot a log at all\n", "Segmentation fault (core dumped)\n"]:
        errors, _ = assess(parse_text(text))
        assert errors and "no rccl-tests/nccl-tests result table" in errors[-1]


def test_busbw_floor(mi300x: str) -> None:
    res = parse_text(mi300x)
    assert assess(res, min_busbw_gbps=250, floor_min_bytes=64 << 20)[0] == []
    errors, _ = assess(res, min_busbw_gbps=280, floor_min_bytes=64 << 20)
    assert errors == [
        "size 67108864 B out-of-place: busbw 271.93 GB/s below the floor 280 GB/s",
        "size 67108864 B in-place: busbw 266.5 GB/s below the floor 280 GB/s",
    ]


def test_in_place_only_table(mi300x: str) -> None:
    """rccl-tests -O 0 prints only the in-place block."""
    lines = []
    for line in mi300x.splitlines():
        if "out-of-place" in line:
            line = "#                                                   in-place"
        elif line.startswith("#") and ("size" in line or "(B)" in line):
            toks = line.lstrip("#").split()
            line = "# " + "  ".join(toks[: len(toks) - 4] if "size" in line else toks[:-3])
        lines.append(line)
    text = _rows_edit("\n".join(lines), lambda lead, t: lead + "  " + "  ".join(t[4:]))
    res = parse_text(text)
    assert len(res.rows) == 25 and res.rows[-1].out_of_place is None
    assert res.rows[-1].in_place.busbw_gbps == 289.60 and not assess(res)[0]


def test_flagged_old_format_row(fixtures_dir: Path) -> None:
    text = (fixtures_dir / FIX / "nccl-tests_allgather_oob_failed_10.txt").read_text()
    text = text.replace("129.05  1e+00", "129.05  1e+00*")
    errors, _ = assess(parse_text(text))
    assert "size 4294967296 B out-of-place: error above the test's threshold (marked *)" in errors


def test_nccl_tests_json() -> None:
    """The -J output of nccl-tests (keys as written by src/util.cu), values from the MI300X log."""
    doc = {
        "version": 3, "args": ["./build/all_reduce_perf", "-b", "8"], "nccl_version": 22005,
        "devices": [{"rank": i} for i in range(8)],
        "results": [
            {"size": 8, "count": 2, "type": "float", "redop": "sum", "root": "    -1",
             "out_of_place": {"time": 45.92, "alg_bw": 0.0, "bus_bw": 0.0, "nwrong": 0.0},
             "in_place": {"time": 46.12, "alg_bw": 0.0, "bus_bw": 0.0, "nwrong": 0.0}},
            {"size": 134217728, "count": 33554432, "type": "float", "redop": "sum", "root": "-1",
             "out_of_place": {"time": 801.4, "alg_bw": 167.47, "bus_bw": 293.07, "nwrong": None},
             "in_place": {"time": 811.1, "alg_bw": 165.48, "bus_bw": 289.60, "nwrong": 3.0}},
        ],
        "out_of_bounds": {"count": 1, "okay": False},
        "average_bus_bandwidth": {"bandwidth": 54.8575, "okay": "unchecked"},
        "errors": [],
    }  # fmt: skip
    res = parse_json(json.dumps(doc))
    assert (res.collective, res.ranks, len(res.rows), res.avg_busbw_gbps) == (
        "all_reduce",
        8,
        2,
        54.8575,
    )
    assert res.rows[1].root == -1 and res.rows[1].out_of_place.wrong is None
    errors, _ = assess(res)
    assert "size 134217728 B in-place: #wrong=3 (wrong results)" in errors
    assert "validation failed: Out of bounds values : 1" in errors


def test_rccl_tests_csv() -> None:
    """rccl-tests -Z csv (header as written by Reporter in src/common.cu), MI300X values."""
    text = (
        "collective, gpus, size, type, redop, inplace, time, algbw, busbw, #wrong\n"
        "AllReduce, 8, 8388608, float, sum, 0, 88.10, 95.22, 166.63, 0\n"
        "AllReduce, 8, 8388608, float, sum, 1, 90.19, 93.01, 162.77, 0\n"
        "AllReduce, 8, 16777216, float, sum, 0, 152.7, 109.84, 192.22, N/A\n"
    )
    res = parse_csv(text)
    assert res.ranks == 8 and [r.size_bytes for r in res.rows] == [8388608, 16777216]
    assert res.rows[0].in_place.busbw_gbps == 162.77 and res.rows[1].out_of_place.wrong is None
    assert res.rows[1].in_place is None and not assess(res)[0]
    bad = parse_csv(text + "AllReduce, 8, oops, float, sum, 0, x, y, z, 0\n")
    assert any("csv line 5" in e for e in assess(bad)[0])
