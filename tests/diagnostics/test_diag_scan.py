"""Scanner on the hand-written corpus: exact (line, rule) sets from `expect:` markers, clean files
silent, suppressions, output formats, exit codes; hipify-perl statistics when it is on PATH."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from rocmtrain.diagnostics.scan import ALL_RULES, main, scan_source

CORPUS = Path(__file__).parent / "corpus"
SOURCES = sorted(p for p in CORPUS.iterdir() if p.suffix != ".md")


def _expected(path: Path) -> set[tuple[int, str]]:
    out = set()
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        m = re.search(r"expect:\s*([\w\-,]+)", line)
        if m:
            out |= {(n, rule) for rule in m.group(1).split(",")}
    return out


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_corpus_findings_match_markers(path: Path) -> None:
    got = {(f.line, f.rule) for f in scan_source(str(path), path.read_text())}
    assert got == _expected(path)
    if path.name.startswith("clean_"):
        assert got == set()


def test_every_rule_has_a_positive_case() -> None:
    covered = set().union(*({r for _, r in _expected(p)} for p in SOURCES))
    assert covered == set(ALL_RULES)


def test_columns_point_at_the_construct() -> None:
    src = (CORPUS / "warp32_reduce.cu").read_text()
    lines = src.splitlines()
    for f in scan_source("warp32_reduce.cu", src):
        if f.rule == "mask-32bit" and f.line == 9:
            assert lines[8][f.col - 1 :].startswith("__shfl_down_sync")
        if f.rule == "syncwarp":
            assert lines[f.line - 1][f.col - 1 :].startswith("__syncwarp")


def test_comment_and_string_blanking_keeps_positions() -> None:
    src = 'const char* s = "__syncwarp()"; /* 0xffffffff */ __syncwarp();\n'
    (f,) = scan_source("x.cu", src)
    assert (f.rule, f.line, f.col) == ("syncwarp", 1, src.index("__syncwarp();") + 1)


def test_json_format_and_exit_codes(capsys) -> None:
    target = str(CORPUS / "warp32_reduce.cu")
    assert main([target, "--format", "json", "--no-hipify"]) == 1  # errors present, --fail-on error
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"findings"}
    keys = {"file", "line", "col", "rule", "severity", "why", "fix"}
    assert all(set(f) == keys for f in data["findings"])
    assert {(f["line"], f["rule"]) for f in data["findings"]} == _expected(
        CORPUS / "warp32_reduce.cu"
    )
    smem = str(CORPUS / "misc_traps.cu")
    assert main([str(CORPUS / "clean_wave64.hip"), "--fail-on", "info", "--no-hipify"]) == 0
    assert main([smem, "--fail-on", "none", "--no-hipify"]) == 0
    capsys.readouterr()
    assert main([str(CORPUS / "suppressed.cuh"), "--fail-on", "error", "--no-hipify"]) == 0
    assert main([str(CORPUS / "suppressed.cuh"), "--fail-on", "info", "--no-hipify"]) == 1
    assert "1 finding(s): 0 error, 0 warning, 1 info" in capsys.readouterr().out
    assert main([str(CORPUS / "triton_traps.py"), "--fail-on", "error"]) == 1
    assert main([str(CORPUS / "clean_triton.py"), str(CORPUS / "clean_comments_strings.cu")]) == 0
    assert main([str(CORPUS / "no_such_dir")]) == 2


def test_sarif_shape(capsys) -> None:
    assert main([str(CORPUS), "--format", "sarif", "--fail-on", "none", "--no-hipify"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["version"] == "2.1.0"
    (run,) = doc["runs"]
    rule_ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    total = sum(len(_expected(p)) for p in SOURCES)
    assert len(run["results"]) == total
    for res in run["results"]:
        assert rule_ids[res["ruleIndex"]] == res["ruleId"]
        assert res["level"] in {"error", "warning", "note"}
        region = res["locations"][0]["physicalLocation"]["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1


@pytest.mark.skipif(shutil.which("hipify-perl") is None, reason="hipify-perl not on PATH")
def test_hipify_statistics_added(capsys) -> None:
    files = [str(CORPUS / "warp32_reduce.cu"), str(CORPUS / "misc_traps.cu")]
    main([*files, "--format", "json", "--fail-on", "none"])
    hip = json.loads(capsys.readouterr().out)["hipify"]
    assert {f["file"] for f in hip["files"]} <= set(files)
    assert hip["loc"] == sum(len(Path(f).read_text().splitlines()) for f in hip_files(hip))
    assert hip["converted"] >= 1
    for f in hip["files"]:  # hipify's own warning lines are attached to their file
        assert len(f["warning_lines"]) == f["warnings"]


def hip_files(hip: dict) -> list[str]:
    return [f["file"] for f in hip["files"]]


def test_rocm_7_constructs_are_no_error() -> None:
    """__syncwarp() exists from ROCm 7.0 (amd_warp_sync_functions.h): at most an info. HIP has
    __shfl* overloads for __half/__half2 (amd_hip_fp16.h) and __shfl_*_sync for __hip_bfloat16
    (amd_hip_bf16.h): no finding."""
    src = (
        "__global__ void k(__half* x, __hip_bfloat16* y) {\n"
        "  __half h = x[threadIdx.x];\n"
        "  __half2 h2 = __halves2half2(h, h);\n"
        "  __hip_bfloat16 b = y[threadIdx.x];\n"
        "  h = __shfl_xor(h, 1);\n"
        "  h2 = __shfl_down(h2, 2);\n"
        "  b = __shfl_sync(0xffffffffffffffffULL, b, 0);\n"
        "  __syncwarp();\n"
        "  x[threadIdx.x] = h;\n"
        "}\n"
    )
    found = scan_source("k.hip", src)
    assert [(f.line, f.rule, f.severity) for f in found] == [(8, "syncwarp", "info")]
    assert "ROCm >= 7.0" in found[0].why


def test_mask_32bit_says_it_does_not_compile() -> None:
    (f,) = scan_source(
        "m.cu", "__device__ int f(int v) { return __shfl_sync(0xffffffff, v, 0); }\n"
    )
    assert f.rule == "mask-32bit" and f.severity == "error"
    assert "static_assert" in f.why and "does not compile" in f.why


def test_triton_acq_rel_loop_is_info_without_an_unsourced_cost() -> None:
    """Triton's default sem is acq_rel; what it costs on AMD is unmeasured, so the rule informs."""
    src = (CORPUS / "triton_traps.py").read_text()
    hits = [f for f in scan_source("t.py", src) if f.rule == "triton-atomic-acq-rel-loop"]
    assert len(hits) == 2 and {f.severity for f in hits} == {"info"}
    assert "flush" not in hits[0].why and "unmeasured" in hits[0].why


KERNEL = """
__global__ void k{i}(float* out, const __half* h, int n) {{
  __half v = h[threadIdx.x];
  for (int i = 0; i < n; ++i) {{
    atomicAdd(&out[i], 1.0f);
  }}
  v = __shfl_down_sync(0xffffffff, v, 16);
}}
"""


def test_scan_time_grows_with_the_file_not_with_its_square(tmp_path: Path) -> None:
    """Three quarters of a megabyte of kernels inside one namespace (one top-level scope around every call, as
    in most real CUDA sources) is scanned in seconds: each rule reads a scope once, not once per
    call it holds. Run as the real command, so a quadratic scan fails on the timeout."""
    import subprocess
    import sys

    n = 3000
    src = tmp_path / "ops.cu"
    src.write_text("namespace ops {\n" + "".join(KERNEL.format(i=i) for i in range(n)) + "}\n")
    p = subprocess.run(
        [sys.executable, "-m", "rocmtrain", "scan", str(src), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=45,  # about 8 s here with the scopes read once; about 2 min when read per call
    )
    rules = [f["rule"] for f in json.loads(p.stdout)["findings"]]
    expected = ["atomic-in-loop", "butterfly-16", "mask-32bit"]
    assert sorted(set(rules)) == expected and len(rules) == 3 * n, p.stderr[-2000:]


def test_nothing_to_scan_is_said_not_reported_clean(tmp_path: Path, capsys) -> None:
    """An empty folder, a binary or a file no rule reads: one line saying so, exit 2 (not
    "0 finding(s)", which reads as a clean result)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    binary = tmp_path / "kernel.cu"
    binary.write_bytes(b"\x7fELF\x00\x01\x02" * 100)
    other = tmp_path / "notes.bin"
    other.write_bytes(b"\x00\x01")
    for path in (empty, binary, other):
        assert main([str(path)]) == 2
        out = capsys.readouterr()
        assert out.out == "" and f"nothing to scan in {path}" in out.err, out
    assert "kernel.cu: binary content" in (main([str(binary)]), capsys.readouterr().err)[1]
