"""Blank out comments and string literals in C/C++/CUDA source, keeping every offset and newline.

Rules then match on code only (a ``0xffffffff`` in a comment or a string never triggers), and a
finding's line/column in the blanked text is the line/column in the original file. Comments are
returned separately (line → text) for ``rocmtrain: ignore[RULE]`` suppressions.

    code, comments = strip_c("int x = 32; // lanes\\n")
    # code == "int x = 32;         \\n", comments == {1: "// lanes"}
"""

from __future__ import annotations

import bisect
import re
import tokenize
from io import StringIO

_RAW_START = re.compile(r'R"([^()\\\s]{0,16})\(')


def strip_c(src: str) -> tuple[str, dict[int, str]]:
    """(code with comments/string contents replaced by spaces, {line: comment text})."""
    out = list(src)
    comments: dict[int, str] = {}
    line = 1
    i, n = 0, len(src)

    def blank(a: int, b: int) -> None:
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            comments[line] = comments.get(line, "") + src[i:j]
            blank(i, j)
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            comments[line] = comments.get(line, "") + src[i:j]
            blank(i, j)
            line += src.count("\n", i, j)
            i = j
        elif c == "R" and (m := _RAW_START.match(src, i)) and (i == 0 or not src[i - 1].isalnum()):
            end = src.find(")" + m.group(1) + '"', m.end())
            end = n if end < 0 else end + len(m.group(1)) + 2
            blank(i + 2, end - 1)
            line += src.count("\n", i, end)
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            blank(i + 1, min(j, n))
            i = j + 1
        else:
            i += 1
    return "".join(out), comments


def python_comments(src: str) -> dict[int, str]:
    """{line: comment} of a Python source (tokenize; tolerant of incomplete files)."""
    comments: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(StringIO(src).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string
    except (tokenize.TokenError, SyntaxError):
        pass
    return comments


class LineIndex:
    """Offset → (line, col), both 1-based."""

    def __init__(self, text: str) -> None:
        self._starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def at(self, offset: int) -> tuple[int, int]:
        i = bisect.bisect_right(self._starts, offset) - 1
        return i + 1, offset - self._starts[i] + 1


def matching(text: str, open_at: int, pair: str = "()") -> int:
    """Index just past the bracket that closes ``text[open_at]``; len(text) when unbalanced."""
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == pair[0]:
            depth += 1
        elif text[k] == pair[1]:
            depth -= 1
            if depth == 0:
                return k + 1
    return len(text)


def split_args(text: str) -> list[str]:
    """Top-level comma split of a call's argument text (without the outer parentheses)."""
    args, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{<" and ch != "<":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    args.append("".join(cur).strip())
    return args
