"""The warp-size-32 assumption in the spellings a new user writes, each reported at file:line with why
and fix; the LDS padding note states what really differs on CDNA."""

from __future__ import annotations

from pathlib import Path

from rocmtrain.diagnostics.scan import ALL_RULES, main, scan_source

CORPUS = Path(__file__).parent / "corpus"
SPELLINGS = CORPUS / "warp32_spellings.cu"


def test_each_spelling_is_found_with_why_and_fix() -> None:
    src = SPELLINGS.read_text()
    lines = src.splitlines()
    found = scan_source(str(SPELLINGS), src)
    by_text = {lines[f.line - 1].strip(): f for f in found}
    for needle, rule in [
        ("if (warpSize == 32)", "warpsize-compare-32"),
        ("if (warpSize != 32)", "warpsize-compare-32"),
        ("assert(warpSize == 32);", "warpsize-assert-32"),
        ("for (int i = 0; i < kWarp; ++i)", "warp-constant-32"),
        ("v += __shfl_xor(v, 1, WARP);", "warp-constant-32"),
        ("unsigned mask = (1u << kWarp) - 1;", "warp-constant-32"),
        ("#define WARP_SIZE 32", "warp-size-literal"),
    ]:
        (hit,) = [f for text, f in by_text.items() if text.startswith(needle)]
        assert hit.rule == rule and hit.why and hit.fix and hit.line > 0
    assert ALL_RULES["warpsize-assert-32"].severity == "error"


def test_columns_point_at_the_comparison_and_the_constant() -> None:
    src = SPELLINGS.read_text()
    lines = src.splitlines()
    for f in scan_source(str(SPELLINGS), src):
        at = lines[f.line - 1][f.col - 1 :]
        if f.rule in ("warpsize-compare-32", "warpsize-assert-32"):
            assert at.startswith(("warpSize", "32"))
        if f.rule == "warp-constant-32":
            assert at.startswith(("kWarp", "kLanes", "WARP", "32"))


def test_text_output_has_file_line_why_and_fix(capsys) -> None:
    main([str(SPELLINGS), "--no-hipify"])
    out = capsys.readouterr().out
    assert f"{SPELLINGS}:13:" in out and "[warpsize-assert-32]" in out
    assert "fix: remove the assert" in out


def test_lds_padding_note_is_not_overstated() -> None:
    rule = ALL_RULES["smem-bank-padding"]
    assert rule.severity == "info"
    assert "32 banks x 4 B" in rule.why and "still avoids conflicts for 32-bit" in rule.why
    assert "wave64" in rule.why and "wide" in rule.why
    assert "layout differs" not in rule.why
