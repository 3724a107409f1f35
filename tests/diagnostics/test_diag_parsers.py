"""Parsers on every recorded output in tests/fixtures/rocm_smi and hipify, plus layout variants.

Expected values below were read by eye from the fixture files (not produced by the parsers).
Variants (reordered columns, right-aligned cells, CPX 64-device tables, Node/IDs columns, JSON with
"Card series"/"Card Series") are generated here from the real rows of those files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rocmtrain.diagnostics.parsers import ParseError, parse

MI300X_KB = 201310208  # rocminfo "Size: 201310208(0xbffc000) KB" of the coarse-grained pool
MI300X_ROWS = [  # mi300x_x4_rocm-smi_concise.txt: (temp °C, socket power W)
    (35.0, 133.0),
    (37.0, 131.0),
    (34.0, 131.0),
    (38.0, 137.0),
]


def _read(fixtures_dir: Path, name: str) -> str:
    return (fixtures_dir / name).read_text()


def test_every_fixture_is_covered(fixtures_dir: Path) -> None:
    covered = {
        "mi250_rocm-smi_showpower.txt",
        "mi250x_lumi_rocm-smi_concise.txt",
        "mi250x_lumi_rocminfo_agent_excerpt.txt",
        "mi300x_amd-smi_metric.txt",
        "mi300x_amd-smi_static.txt",
        "mi300x_amd-smi_static_json_vram.txt",
        "mi300x_x4_rocm-smi_concise.txt",
        "mi300x_x4_rocminfo.txt",
    }
    assert {p.name for p in (fixtures_dir / "rocm_smi").iterdir()} == covered
    assert [p.name for p in (fixtures_dir / "hipify").iterdir()] == [
        "hipify-perl_examine_nbody.txt"
    ]


def test_rocminfo_mi300x_x4(fixtures_dir: Path) -> None:
    r = parse("rocminfo", _read(fixtures_dir, "rocm_smi/mi300x_x4_rocminfo.txt"))
    assert len(r.devices) == 4  # agents 1-2 are the EPYC CPUs, 3-6 the GPUs
    for i, d in enumerate(r.devices):
        assert d.index == i
        assert d.gfx_arch == "gfx942"
        assert d.device_id == "0x74a1"
        assert d.name == "AMD Instinct MI300X"
        assert d.vram_total_bytes == MI300X_KB * 1024
        assert d.wave_size == 64 and d.compute_units == 304
    assert r.warnings == []


def test_rocminfo_lumi_excerpt(fixtures_dir: Path) -> None:
    r = parse("rocminfo", _read(fixtures_dir, "rocm_smi/mi250x_lumi_rocminfo_agent_excerpt.txt"))
    (d,) = r.devices
    assert (d.gfx_arch, d.device_id, d.wave_size, d.compute_units) == ("gfx90a", "0x7408", 64, 110)
    assert d.name is None and d.vram_total_bytes is None  # empty Marketing Name, no pools printed
    assert any("Marketing Name" in w for w in r.warnings)
    assert any("VRAM" in w for w in r.warnings)


def test_rocm_smi_concise_mi300x(fixtures_dir: Path) -> None:
    r = parse("rocm-smi", _read(fixtures_dir, "rocm_smi/mi300x_x4_rocm-smi_concise.txt"))
    got = [(d.temp_c, d.power_w) for d in r.devices]
    assert got == MI300X_ROWS
    assert {d.device_id for d in r.devices} == {"0x74a1"}
    assert {d.name for d in r.devices} == {"AMD Instinct MI300X"}
    assert [d.util_pct for d in r.devices] == [0.0] * 4


def test_rocm_smi_concise_lumi_old_layout(fixtures_dir: Path) -> None:
    r = parse("rocm-smi", _read(fixtures_dir, "rocm_smi/mi250x_lumi_rocm-smi_concise.txt"))
    (d,) = r.devices
    assert d.index == 0 and d.temp_c == 50.0 and d.util_pct == 0.0
    assert d.power_w is None
    assert any("AvgPwr" in w and "N/A" in w for w in r.warnings)


def test_rocm_smi_showpower_secondary_die(fixtures_dir: Path) -> None:
    r = parse("rocm-smi", _read(fixtures_dir, "rocm_smi/mi250_rocm-smi_showpower.txt"))
    assert [d.power_w for d in r.devices] == [237.0, None, 230.0, None, 220.0, None, 235.0, None]
    assert len(r.warnings) == 4 and all("Secondary die" in w for w in r.warnings)


def test_amd_smi_static_and_metric(fixtures_dir: Path) -> None:
    s = parse("amd-smi", _read(fixtures_dir, "rocm_smi/mi300x_amd-smi_static.txt"))
    (d,) = s.devices
    assert (d.index, d.name, d.device_id) == (0, "MI300X-O", "0x74a1")
    assert any("truncated" in w for w in s.warnings)
    m = parse("amd-smi", _read(fixtures_dir, "rocm_smi/mi300x_amd-smi_metric.txt"))
    (d,) = m.devices
    assert (d.util_pct, d.power_w) == (100.0, 234.0)


def test_amd_smi_json_vram_agrees_with_rocminfo(fixtures_dir: Path) -> None:
    r = parse("amd-smi", _read(fixtures_dir, "rocm_smi/mi300x_amd-smi_static_json_vram.txt"))
    (d,) = r.devices
    assert d.vram_total_bytes == 196592 * 2**20
    # the same MI300X memory as rocminfo's KB figure: amd-smi "MB" means MiB
    assert d.vram_total_bytes == MI300X_KB * 1024


def test_hipify_stats(fixtures_dir: Path) -> None:
    s = parse("hipify-stats", _read(fixtures_dir, "hipify/hipify-perl_examine_nbody.txt"))
    data = s.to_schema()
    assert (data["converted"], data["warnings"], data["loc"]) == (7, 0, 91)
    (f,) = data["files"]
    assert f["file"] == "nbody-orig.cu" and f["refs"]["cudaMalloc => hipMalloc"] == 1
    assert any("sum to 4" in n for n in s.notes)  # the published listing names 4 of the 7 refs


def test_hipify_stats_global_block() -> None:
    # layout of hipify-perl's printStats (bin/hipify-perl) for two files + GLOBAL
    block = "\n[HIPIFY] info: file '{f}' statistics:\n  CONVERTED refs count: {c}\n"
    block += (
        "  TOTAL lines of code: {l}\n  WARNINGS: {w}\n[HIPIFY] info: CONVERTED refs by names:\n"
    )
    text = block.format(f="a.cu", c=5, l=3, w=1) + block.format(f="b.cu", c=2, l=10, w=0)
    text += block.format(f="GLOBAL", c=7, l=13, w=1)
    data = parse("hipify-stats", text).to_schema()
    assert [f["file"] for f in data["files"]] == ["a.cu", "b.cu"]
    assert (data["converted"], data["warnings"], data["loc"]) == (7, 1, 13)


# ---- layout variants generated from the real rows --------------------------------------------


def _concise_cells(text: str) -> tuple[list[str], list[list[str]], list[str]]:
    """Header labels, per-device cells and names of the real MI300X concise table."""
    lines = text.splitlines()
    hi = next(i for i, ln in enumerate(lines) if ln.startswith("Device"))
    header = re.split(r"\s{2,}", lines[hi].strip())
    rows, names = [], []
    for ln in lines[hi + 3 :]:
        if re.match(r"^\d", ln):
            rows.append(re.split(r"\s{2,}", ln.strip()))
        elif ln.startswith(" ") and ln.strip():
            names.append(ln.strip())
    return header, rows, names


def _render(header: list[str], rows: list[list[str]], names: list[str], *, rjust: bool) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) + 2 for i, h in enumerate(header)]
    out = ["=" * 40 + " Concise Info " + "=" * 40]
    out.append("".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    out.append("=" * sum(widths))
    for r, name in zip(rows, names, strict=True):
        cells = [
            (c.rjust(w - 2) + "  ") if rjust and i > 0 else c.ljust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        out.append("".join(cells))
        out.append(" " * widths[0] + name)
    out.append("=" * sum(widths))
    return "\n".join(out)


@pytest.mark.parametrize("rjust", [False, True])
def test_rocm_smi_reordered_columns(fixtures_dir: Path, rjust: bool) -> None:
    header, rows, names = _concise_cells(
        _read(fixtures_dir, "rocm_smi/mi300x_x4_rocm-smi_concise.txt")
    )
    assert len(header) == 12 and all(len(r) == 12 for r in rows)
    order = [0, 11, 3, 10, 2, 1, 9, 4, 5, 6, 7, 8]  # GPU%, Power, VRAM%, Temp, Model... shuffled
    text = _render(
        [header[i] for i in order], [[r[i] for i in order] for r in rows], names, rjust=rjust
    )
    r = parse("rocm-smi", text)
    assert [(d.temp_c, d.power_w) for d in r.devices] == MI300X_ROWS
    assert {d.device_id for d in r.devices} == {"0x74a1"}
    assert [d.name for d in r.devices] == ["AMD Instinct MI300X"] * 4


def test_rocm_smi_cpx_64_devices(fixtures_dir: Path) -> None:
    header, rows, names = _concise_cells(
        _read(fixtures_dir, "rocm_smi/mi300x_x4_rocm-smi_concise.txt")
    )
    cpx_rows, cpx_names = [], []
    for k in range(64):  # CPX: each of the 4 sockets shows up as 16 devices
        row = list(rows[k // 16])
        row[0], row[4] = str(k), "NPS1, CPX"
        cpx_rows.append(row)
        cpx_names.append(names[k // 16])
    r = parse("rocm-smi", _render(header, cpx_rows, cpx_names, rjust=False))
    assert [d.index for d in r.devices] == list(range(64))
    assert [d.temp_c for d in r.devices] == [MI300X_ROWS[k // 16][0] for k in range(64)]
    assert r.devices[63].power_w == 137.0


def test_rocm_smi_node_ids_layout(fixtures_dir: Path) -> None:
    """ROCm-SMI 3.x style: `Node  IDs (DID, GUID)` columns; values split by 2+ spaces."""
    _, rows, names = _concise_cells(_read(fixtures_dir, "rocm_smi/mi300x_x4_rocm-smi_concise.txt"))
    lines = [
        "Device  Node  IDs              Temp        Power     Partitions          SCLK    GPU%",
        "              (DID,     GUID)  (Junction)  (Socket)  (Mem, Compute, ID)",
        "=" * 90,
    ]
    for k, r in enumerate(rows):
        did = re.search(r"0x[0-9a-f]+", r[1]).group(0)
        guid = str(10000 + k)  # layout test: GUID digits are not in the recorded output
        lines.append(
            f"{k:<8}{k + 2:<6}{did + ',':<9}{guid:<8}{r[2]:<12}{r[3]:<10}{'NPS1, SPX, 0':<20}"
            f"{r[6]:<8}{r[11]}"
        )
    res = parse("rocm-smi", "\n".join(lines))
    assert [(d.temp_c, d.power_w) for d in res.devices] == MI300X_ROWS
    assert {d.device_id for d in res.devices} == {"0x74a1"}


@pytest.mark.parametrize("series_key", ["Card series", "Card Series"])
def test_rocm_smi_json_card_series_variants(series_key: str) -> None:
    data = {
        f"card{i}": {
            series_key: "AMD Instinct MI300X",
            "Card model": "0x74a1",
            "Temperature (Sensor junction) (C)": str(t),
            "Average Graphics Package Power (W)": str(p),
            "GPU use (%)": "0",
            "GFX Version": "gfx942",
        }
        for i, (t, p) in enumerate(MI300X_ROWS)
    }
    r = parse("rocm-smi", json.dumps(data))
    assert [d.name for d in r.devices] == ["AMD Instinct MI300X"] * 4
    assert [(d.temp_c, d.power_w) for d in r.devices] == MI300X_ROWS
    assert {(d.gfx_arch, d.device_id) for d in r.devices} == {("gfx942", "0x74a1")}


def test_nvidia_smi_csv_units_and_nounits() -> None:
    # `nvidia-smi --query-gpu=... --format=csv` header/value layout (units in header and values)
    text = (
        "index, name, pci.device_id, memory.total [MiB], memory.used [MiB], power.draw [W], "
        "temperature.gpu, utilization.gpu [%]\n"
        "0, NVIDIA H200, 0x233510DE, 143771 MiB, 512 MiB, 76.54 W, 31, 0 %\n"
        "1, NVIDIA H200, 0x233510DE, 143771 MiB, 0 MiB, [N/A], 29, 3 %\n"
    )
    r = parse("nvidia-smi", text)
    d0, d1 = r.devices
    assert (d0.device_id, d0.vram_total_bytes, d0.vram_used_bytes) == (
        "0x2335",
        143771 * 2**20,
        512 * 2**20,
    )
    assert (d0.power_w, d0.temp_c, d1.util_pct, d1.power_w) == (76.54, 31.0, 3.0, None)
    nounits = "utilization.gpu, index, memory.total\n7, 0, 143771\n"
    (d,) = parse("nvidia-smi", nounits).devices
    assert (d.util_pct, d.vram_total_bytes) == (7.0, 143771 * 2**20)


@pytest.mark.parametrize(
    ("kind", "fixture"),
    [
        ("rocminfo", "rocm_smi/mi300x_x4_rocm-smi_concise.txt"),
        ("rocm-smi", "rocm_smi/mi300x_x4_rocminfo.txt"),
        ("amd-smi", "rocm_smi/mi250_rocm-smi_showpower.txt"),
        ("hipify-stats", "rocm_smi/mi300x_amd-smi_metric.txt"),
    ],
)
def test_wrong_kind_is_a_clear_error(fixtures_dir: Path, kind: str, fixture: str) -> None:
    with pytest.raises(ParseError, match=r"not .*(output|statistics)"):
        parse(kind, _read(fixtures_dir, fixture))


def test_empty_and_unknown_kind() -> None:
    with pytest.raises(ParseError, match="empty"):
        parse("rocm-smi", "  \n")
    with pytest.raises(ParseError, match="unknown kind"):
        parse("rocm_smi", "x")
