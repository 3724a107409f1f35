"""The package's docs and comments state rules and their reasons, not a work log.

Measurements and the dates they were taken live in ``scripts/bench/`` (results folders and
``BENCHMARKS.md``, section "Records kept from the package docs"); ``rocmtrain/**/*.py`` and
``rocmtrain/**/*.md`` say what the code does and why, which stays true after the next run. So no
file there carries a calendar date (``2026-12-01``) or a work-log ordinal ("ninth session",
"the twelfth ...").

Allow-list rule: an entry names the file, the exact text and why that text is not a dated
measurement or a work-log note. Allowed are (a) a sample of a program's output whose format
includes a timestamp, and (b) the version of a cited source where the source itself is only
identified by its date (a ROCm fact keeps its source and version; the date the fact was checked is
a measurement date and goes). An entry whose text is gone fails too, so the list never outlives
its reason.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rocmtrain"

#: a calendar date, the form every dated measurement in the package used
DATE = re.compile(r"\b20\d\d-\d\d-\d\d")

_ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth"
)
#: work-log ordinals: "ninth session", "session 9", and any spelled ordinal from "fourth" on
#: ("first" .. "third" have ordinary uses: "third-party", "the first call")
WORK_LOG = re.compile(
    rf"\b(?:(?:{_ORDINALS}|\d+(?:st|nd|rd|th))\s+sessions?\b|sessions?\s+\d+\b|"
    r"(?:fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
    r"fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
    r"twenty-\w+)\b)",
    re.IGNORECASE,
)

#: (path under rocmtrain/, exact text on the line, why it is allowed: rule (a) or (b))
ALLOWED: tuple[tuple[str, str, str], ...] = (
    (
        "faults/HANGS.md",
        "declared by rank 1 at 2026-11-30T08:49:17+0000",
        "(a) a sample hang report: its header line carries the time the stall was declared",
    ),
)


def _files() -> list[Path]:
    return sorted(p for ext in ("*.py", "*.md") for p in PACKAGE.rglob(ext))


def _allowed(rel: str, line: str) -> bool:
    return any(rel == path and text in line for path, text, _ in ALLOWED)


def _findings() -> list[str]:
    found = []
    for path in _files():
        rel = path.relative_to(PACKAGE).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for pattern in (DATE, WORK_LOG):
                m = pattern.search(line)
                if m and not _allowed(rel, line):
                    found.append(f"rocmtrain/{rel}:{n}: {m.group(0)!r} in {line.strip()[:100]!r}")
    return found


def test_no_dates_or_work_log_ordinals_in_package_text() -> None:
    found = _findings()
    assert not found, (
        "dated measurements and work-log notes belong in scripts/bench/BENCHMARKS.md "
        "('Records kept from the package docs'; name the source file); keep the rule and why "
        "in the package:\n" + "\n".join(found)
    )


def test_allow_list_entries_still_match() -> None:
    """An allow-list entry whose text is gone is removed with it."""
    stale = [
        f"{path}: {text!r}"
        for path, text, _ in ALLOWED
        if text not in (PACKAGE / path).read_text(encoding="utf-8")
    ]
    assert not stale, "remove these ALLOWED entries, their text is gone:\n" + "\n".join(stale)


def test_patterns_catch_what_they_are_for() -> None:
    """The scan's own check: the forms that were in the package are caught, ordinary words not."""
    for bad in ("measured 2026-12-01 on H200", "BENCHMARKS.md, ninth session", "the twelfth note"):
        assert DATE.search(bad) or WORK_LOG.search(bad), bad
    for ok in ("third-party warnings", "the first call", "a new session", "NumericsSession"):
        assert not (DATE.search(ok) or WORK_LOG.search(ok)), ok
