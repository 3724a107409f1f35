"""Triton porting-trap rules for ``.py`` files (AST based: comments and strings never match).

- ``triton-num-warps-32``: warp counts or thread counts derived with 32 lanes (``BLOCK // 32``,
  ``num_warps * 32``, ``WARP_SIZE = 32``). On CDNA ``num_warps`` counts 64-lane wavefronts.
- ``triton-atomic-half``: ``tl.atomic_add`` of fp16/bf16 values (CAS loops; no bf16 atomics on
  MI200; repeated bf16 adds stall).
- ``triton-atomic-acq-rel-loop``: ``tl.atomic_*`` in a loop with the default ``sem="acq_rel"``,
  which orders every atomic against the surrounding memory accesses; what that costs on AMD is not
  measured here (info only); pass ``sem="relaxed"`` when ordering is not needed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from rocmtrain.diagnostics.scan_cuda import Rule

RULES: tuple[Rule, ...] = (
    Rule(
        "triton-num-warps-32",
        "warning",
        "warp count / thread count computed with 32 lanes; on CDNA num_warps counts 64-lane "
        "wavefronts, so the block gets twice the threads you planned",
        "derive from the device warp size: rocmtrain.platform.warp_size() (64 on MI200/MI300)",
    ),
    Rule(
        "triton-atomic-half",
        "error",
        "tl.atomic_add on fp16/bf16: CAS loops on AMD (no bf16 atomics on MI200) and bf16 "
        "accumulation stalls (1.0 added repeatedly stops at 256)",
        "accumulate in fp32 (atomic_add on a float32 buffer) and convert once at the end",
    ),
    Rule(
        "triton-atomic-acq-rel-loop",
        "info",
        'tl.atomic_* in a loop with the default sem="acq_rel" (triton.language.atomic_add docs): '
        "each atomic is ordered against the surrounding memory accesses, which the loop may not "
        "need (the cost on AMD is unmeasured here)",
        'pass sem="relaxed" when the loop needs no ordering between the atomics',
    ),
)
_BY_ID = {r.id: r for r in RULES}
_ATOMICS = {"atomic_add", "atomic_max", "atomic_min", "atomic_xchg", "atomic_cas", "atomic_and",
            "atomic_or", "atomic_xor"}  # fmt: skip
_HALF_NAMES = {"float16", "bfloat16", "fp16", "bf16"}


def _is_jit(fn: ast.FunctionDef) -> bool:
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        text = ast.unparse(target)
        if text.endswith("jit") or text.endswith("autotune") or text.endswith("heuristics"):
            return True
    return False


def _mentions_half(node: ast.AST, half_vars: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in _HALF_NAMES:
            return True
        if isinstance(sub, ast.Name) and sub.id in half_vars:
            return True
    return False


def _has_32(node: ast.AST, ops: tuple[type, ...]) -> bool:
    return any(
        isinstance(sub, ast.BinOp)
        and isinstance(sub.op, ops)
        and any(isinstance(x, ast.Constant) and x.value == 32 for x in (sub.left, sub.right))
        for sub in ast.walk(node)
    )


def _num_warps_hits(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            sides = (node.left, node.right)
            if any(isinstance(s, ast.Constant) and s.value == 32 for s in sides) and any(
                "num_warps" in ast.unparse(s) for s in sides
            ):
                yield node, ast.unparse(node)
        elif isinstance(node, ast.keyword) and node.arg == "num_warps":
            if _has_32(node.value, (ast.Div, ast.FloorDiv)):
                yield node.value, f"num_warps={ast.unparse(node.value)}"
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                name = ast.unparse(t)
                low = name.lower()
                if "num_warps" in low and _has_32(node.value, (ast.Div, ast.FloorDiv)):
                    yield node, ast.unparse(node)
                elif "warp" in low and "size" in low and isinstance(node.value, ast.Constant):
                    if node.value.value == 32:
                        yield node, ast.unparse(node)


class _KernelVisitor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.hits: list[tuple[str, ast.AST, str]] = []
        self.loop_depth = 0
        self.half_vars: set[str] = set()

    def _loop(self, node: ast.AST) -> None:
        self.loop_depth += 1
        self.generic_visit(node)
        self.loop_depth -= 1

    visit_For = visit_While = _loop  # noqa: N815

    def visit_Assign(self, node: ast.Assign) -> None:  # noqa: N802
        if _mentions_half(node.value, self.half_vars):
            self.half_vars |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:  # noqa: N802
        name = (
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        )
        if name in _ATOMICS:
            kw = {k.arg: k.value for k in node.keywords}
            val = kw.get("val", node.args[1] if len(node.args) > 1 else None)
            if name == "atomic_add" and val is not None and _mentions_half(val, self.half_vars):
                self.hits.append(("triton-atomic-half", node, ast.unparse(node)))
            sem = kw.get("sem")
            default_sem = sem is None or (isinstance(sem, ast.Constant) and sem.value == "acq_rel")
            if self.loop_depth and default_sem:
                self.hits.append(("triton-atomic-acq-rel-loop", node, ast.unparse(node)))
        self.generic_visit(node)


def scan_triton(src: str) -> list[tuple[Rule, int, int, str]]:
    """(rule, line, col, detail) for each trap; [] for files that do not use Triton."""
    if "triton" not in src:
        return []
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []
    out = [
        (_BY_ID["triton-num-warps-32"], n.lineno, n.col_offset + 1, d)
        for n, d in _num_warps_hits(tree)
    ]
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and _is_jit(fn):
            v = _KernelVisitor()
            for stmt in fn.body:
                v.visit(stmt)
            out += [(_BY_ID[r], n.lineno, n.col_offset + 1, d) for r, n, d in v.hits]
    return out
