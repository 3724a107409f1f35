"""``python -m rocmtrain scan PATH...``: find CUDA→HIP porting traps in kernels and Triton code.

    python -m rocmtrain scan csrc/ kernels/triton_tbe.py            # file:line:col rule severity
    python -m rocmtrain scan csrc --format json                      # {"findings": [...]}
    python -m rocmtrain scan csrc --format sarif > scan.sarif        # SARIF 2.1.0 (code scanning)
    python -m rocmtrain scan csrc --fail-on warning                  # CI gate (exit 1)

Scans ``.cu .cuh .hip .cpp .cc .cxx .h .hpp`` (rules in :mod:`scan_cuda`) and ``.py`` files that use
Triton (:mod:`scan_triton`). Comments and string literals never trigger a rule. Suppress a finding
with a comment on the same line or on the line above::

    #define WARP 32   // rocmtrain: ignore[warp-size-literal]
    # rocmtrain: ignore[triton-atomic-acq-rel-loop]

(``rocmtrain: ignore`` without a list suppresses every rule on that line). With ``hipify-perl`` on
PATH the report adds its conversion statistics (``--no-hipify`` to skip).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from rocmtrain import exit_codes
from rocmtrain.diagnostics.scan_cuda import RULES as CUDA_RULES
from rocmtrain.diagnostics.scan_lex import LineIndex, python_comments, strip_c
from rocmtrain.diagnostics.scan_triton import RULES as TRITON_RULES
from rocmtrain.diagnostics.scan_triton import scan_triton

C_EXTS = {".cu", ".cuh", ".hip", ".cpp", ".cc", ".cxx", ".h", ".hpp"}
PY_EXTS = {".py"}
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", ".tox"}
SEVERITIES = ("info", "warning", "error")
ALL_RULES = {r.id: r for r in (*CUDA_RULES, *TRITON_RULES)}
_SPACE = re.compile(r"\s*")
_IGNORE = re.compile(r"rocmtrain:\s*ignore(?:\[([\w\-,\s]+)\])?")


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    col: int
    rule: str
    severity: str
    why: str
    fix: str


def _suppressed(rule: str, line: int, comments: dict[int, str], code_lines: list[str]) -> bool:
    candidates = [line]
    if line - 1 in comments and not code_lines[line - 2].strip():  # comment-only line above
        candidates.append(line - 1)
    for ln in candidates:
        m = _IGNORE.search(comments.get(ln, ""))
        if m and (m.group(1) is None or rule in {r.strip() for r in m.group(1).split(",")}):
            return True
    return False


def scan_source(path: str, src: str) -> list[Finding]:
    """Findings in one file's text (the file type is taken from ``path``'s suffix)."""
    suffix = Path(path).suffix.lower()
    findings: list[Finding] = []
    if suffix in PY_EXTS:
        comments = python_comments(src)
        code_lines = [re.sub(r"#.*", "", ln) for ln in src.splitlines()] + [""]
        for rule, line, col, _ in scan_triton(src):
            if not _suppressed(rule.id, line, comments, code_lines):
                findings.append(
                    Finding(path, line, col, rule.id, rule.severity, rule.why, rule.fix)
                )
    elif suffix in C_EXTS:
        code, comments = strip_c(src)
        index, code_lines = LineIndex(code), code.splitlines() + [""]
        seen: set[tuple[int, int, str]] = set()
        for rule in CUDA_RULES:
            for off, _detail in rule.find(code):
                line, col = index.at(_SPACE.match(code, off).end())  # type: ignore[union-attr]
                if (line, col, rule.id) in seen or _suppressed(rule.id, line, comments, code_lines):
                    continue
                seen.add((line, col, rule.id))
                findings.append(
                    Finding(path, line, col, rule.id, rule.severity, rule.why, rule.fix)
                )
    return sorted(findings, key=lambda f: (f.file, f.line, f.col, f.rule))


def collect_files(paths: list[Path]) -> list[Path]:
    """Source files under ``paths`` (directories recursively, skipping VCS/venv/build folders)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.is_file() and f.suffix.lower() in C_EXTS | PY_EXTS:
                    if not SKIP_DIRS.intersection(f.relative_to(p).parts[:-1]):
                        out.append(f)
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(p)
    return out


def _sources_only(files: list[Path]) -> tuple[list[Path], list[str]]:
    """The files the rules can read, and why each other one is skipped (a suffix no rule reads,
    or binary content)."""
    keep, skipped = [], []
    for f in files:
        if f.suffix.lower() not in C_EXTS | PY_EXTS:
            skipped.append(f"{f}: not a C/C++/CUDA/HIP or Python source")
            continue
        with open(f, "rb") as fh:
            if b"\0" in fh.read(8192):
                skipped.append(f"{f}: binary content")
                continue
        keep.append(f)
    return keep, skipped


def hipify_stats(files: list[Path]) -> dict | None:
    """``hipify-perl -examine`` statistics for the CUDA files, or None without hipify-perl."""
    exe = shutil.which("hipify-perl")
    cuda = [str(f) for f in files if f.suffix.lower() in C_EXTS]
    if exe is None or not cuda:
        return None
    from rocmtrain.diagnostics.parsers import ParseError
    from rocmtrain.diagnostics.parsers.hipify_stats import parse_hipify_stats

    proc = subprocess.run([exe, "-examine", *cuda], capture_output=True, text=True, timeout=300)
    try:
        stats = parse_hipify_stats(proc.stderr + proc.stdout)
    except ParseError:
        return {"files": [], "converted": 0, "warnings": 0, "loc": 0}  # nothing to convert
    return stats.to_schema()


def to_sarif(findings: list[Finding]) -> dict:
    level = {"error": "error", "warning": "warning", "info": "note"}
    used = sorted({f.rule for f in findings})
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "rocmtrain-scan",
                        "informationUri": "https://github.com/ROCm/HIPIFY",
                        "rules": [
                            {
                                "id": rid,
                                "shortDescription": {"text": ALL_RULES[rid].why},
                                "help": {"text": ALL_RULES[rid].fix},
                                "defaultConfiguration": {"level": level[ALL_RULES[rid].severity]},
                            }
                            for rid in used
                        ],
                    }
                },
                "results": [
                    {
                        "ruleId": f.rule,
                        "ruleIndex": used.index(f.rule),
                        "level": level[f.severity],
                        "message": {"text": f"{f.why}. Fix: {f.fix}"},
                        "locations": [
                            {
                                "physicalLocation": {
                                    "artifactLocation": {"uri": Path(f.file).as_posix()},
                                    "region": {"startLine": f.line, "startColumn": f.col},
                                }
                            }
                        ],
                    }
                    for f in findings
                ],
            }
        ],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rocmtrain scan", description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="+", type=Path, help="files or directories")
    ap.add_argument("--format", choices=("text", "json", "sarif"), default="text")
    ap.add_argument(
        "--fail-on",
        choices=(*SEVERITIES, "none"),
        default="error",
        help="exit 1 when a finding has this severity or higher (default: error)",
    )
    ap.add_argument("--no-hipify", action="store_true", help="do not run hipify-perl -examine")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        files = collect_files(args.paths)
    except FileNotFoundError as e:
        print(f"rocmtrain scan: no such file or directory: {e}", file=sys.stderr)
        return exit_codes.USAGE
    files, skipped = _sources_only(files)
    for why in skipped:
        print(f"rocmtrain scan: skipped {why}", file=sys.stderr)
    if not files:  # "0 file(s), 0 finding(s)" would read as a clean bill of health
        where = ", ".join(str(p) for p in args.paths)
        print(
            f"rocmtrain scan: nothing to scan in {where}: no C/C++/CUDA/HIP or Python source "
            f"(suffixes {' '.join(sorted(C_EXTS | PY_EXTS))}); point it at a source file or folder",
            file=sys.stderr,
        )
        return exit_codes.USAGE
    findings: list[Finding] = []
    for f in files:
        findings += scan_source(str(f), f.read_text(errors="replace"))
    hip = None if args.no_hipify else hipify_stats(files)
    if args.format == "json":
        doc: dict = {"findings": [asdict(f) for f in findings]}
        if hip is not None:
            doc["hipify"] = hip
        print(json.dumps(doc, indent=2))
    elif args.format == "sarif":
        print(json.dumps(to_sarif(findings), indent=2))
    else:
        for f in findings:
            print(f"{f.file}:{f.line}:{f.col}: {f.severity} [{f.rule}] {f.why}\n    fix: {f.fix}")
        by_sev = {s: sum(f.severity == s for f in findings) for s in reversed(SEVERITIES)}
        print(
            f"{len(files)} file(s), {len(findings)} finding(s): "
            + ", ".join(f"{n} {s}" for s, n in by_sev.items())
        )
        if hip is not None:
            print(
                f"hipify-perl: {hip['converted']} CUDA refs to convert, {hip['warnings']} warnings, {hip['loc']} lines"
            )
    if args.fail_on != "none":
        threshold = SEVERITIES.index(args.fail_on)
        if any(SEVERITIES.index(f.severity) >= threshold for f in findings):
            return exit_codes.FAILURE
    return exit_codes.OK
