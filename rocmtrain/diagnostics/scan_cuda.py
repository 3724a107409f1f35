"""CUDA→HIP porting-trap rules for ``.cu .cuh .hip .cpp .h``.

Each rule matches on source with comments and string contents blanked (:mod:`scan_lex`), so the
reported line:col are the file's own. Regex rules are kept narrow (lane arithmetic only on thread/lane
names, masks only as sync-intrinsic arguments or MASK macros) so correct wave64 code stays silent.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from rocmtrain.diagnostics.scan_lex import matching, split_args

Hit = tuple[int, str]  # (offset in the blanked code, detail)


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str  # "error" | "warning" | "info"
    why: str
    fix: str
    patterns: tuple[str, ...] = ()
    finder: Callable[[str], Iterator[Hit]] | None = field(default=None, compare=False)

    def find(self, code: str) -> Iterator[Hit]:
        for p in self.patterns:
            for m in re.finditer(p, code, re.MULTILINE):
                yield m.start(), m.group(0).strip()
        if self.finder is not None:
            yield from self.finder(code)


_HALF = r"(?:__half2?|half2?|__nv_bfloat16[2]?|__hip_bfloat16|hip_bfloat16|__bf16|nv_bfloat16)"
_THREADISH = r"(?:threadIdx\.[xyz]|\w*(?:tid|lane|thread)\w*)"
# 32-bit all-ones masks (an int -1 / ~0 widens to 64 ones and is fine; ~0u / 0xffffffff are not)
_FULL32 = r"(?:0x[fF]{8}(?![0-9a-fA-F])[uUlL]*|~0[uU]\b|\(\s*unsigned(?:\s+int)?\s*\)\s*-1)"


def _names(code: str, pattern: str) -> set[str]:
    return set(re.findall(pattern, code))


def _calls(code: str, name_re: str) -> Iterator[tuple[int, str, list[str]]]:
    """(offset, callee, args) for each call whose callee matches ``name_re``."""
    for m in re.finditer(rf"\b({name_re})\s*\(", code):
        end = matching(code, m.end() - 1)
        yield m.start(), m.group(1), split_args(code[m.end() : end - 1])


def _loop_spans(code: str) -> list[tuple[int, int]]:
    spans = []
    for m in re.finditer(r"\b(?:for|while)\s*\(", code):
        head_end = matching(code, m.end() - 1)
        body_start = _SPACE.match(code, head_end).end()  # type: ignore[union-attr]
        if code.startswith("{", body_start):
            spans.append((m.start(), matching(code, body_start, "{}")))
        else:
            semi = code.find(";", body_start)
            spans.append((m.start(), len(code) if semi < 0 else semi))
    return spans


def _scopes(code: str) -> list[tuple[int, int]]:
    """Top-level declarations (function signature + body), as (start, end) offsets."""
    spans, depth, start = [], 0, 0
    for k, ch in enumerate(code):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth = max(0, depth - 1)
            if depth == 0:
                spans.append((start, k + 1))
                start = k + 1
        elif ch == ";" and depth == 0:
            start = k + 1
    return spans


_SPACE = re.compile(r"\s*")


def _inside(spans: list[tuple[int, int]]) -> Callable[[int], bool]:
    """``off -> whether a span holds it``, for spans that may nest or overlap: a binary search
    per offset instead of a pass over every span (a large file has thousands of them)."""
    ordered = sorted(spans)
    starts = [a for a, _ in ordered]
    reach = list(itertools.accumulate((b for _, b in ordered), max))  # furthest end so far

    def holds(off: int) -> bool:
        k = bisect.bisect_right(starts, off) - 1
        return k >= 0 and reach[k] > off

    return holds


class _ScopeNames:
    """Names a pattern declares in the top-level function around an offset (the whole file
    outside any function), each scope searched once however many calls it holds."""

    def __init__(self, code: str, pattern: str) -> None:
        self.code, self.pattern = code, pattern
        self.spans = _scopes(code)  # in order, not overlapping
        self.starts = [a for a, _ in self.spans]
        self.cache: dict[int, set[str]] = {}

    def at(self, off: int) -> set[str]:
        k = bisect.bisect_right(self.starts, off) - 1
        if k < 0 or not off < self.spans[k][1]:
            k = -1
        if k not in self.cache:
            a, b = self.spans[k] if k >= 0 else (0, len(self.code))
            self.cache[k] = _names(self.code[a:b], self.pattern)
        return self.cache[k]


# a definition of __syncwarp by the user (a shim for HIP before ROCm 7.0), not a call
_SYNCWARP_DEF = re.compile(
    r"^[ \t]*#[ \t]*define[ \t]+__syncwarp\b[^\n]*|\b(?:void|auto)\s+__syncwarp\s*\(", re.MULTILINE
)


def _syncwarp_defs(code: str) -> Iterator[Hit]:
    for m in _SYNCWARP_DEF.finditer(code):
        yield m.start(), m.group(0).strip()


def _syncwarp_calls(code: str) -> Iterator[Hit]:
    in_def = _inside([(m.start(), m.end()) for m in _SYNCWARP_DEF.finditer(code)])
    for m in re.finditer(r"\b__syncwarp\s*\(", code):
        if not in_def(m.start()):
            yield m.start(), m.group(0).strip()


def _half_atomics(code: str) -> Iterator[Hit]:
    scope = _ScopeNames(code, rf"\b{_HALF}\s*\*\s*(?:__restrict__\s+|const\s+)?(\w+)")
    for off, callee, args in _calls(code, r"atomicAdd\w*|unsafeAtomicAdd"):
        ptrs = scope.at(off)
        target = re.sub(r"^[&(\s]+", "", args[0])
        base = re.match(r"\w+", target)
        if re.search(rf"\(\s*{_HALF}\s*\*\s*\)", args[0]) or (base and base.group(0) in ptrs):
            yield off, f"{callee}({args[0]}, ...)"


def _float_atomics_in_loops(code: str) -> Iterator[Hit]:
    scope = _ScopeNames(code, r"\b(?:float|double)\s*\*\s*(?:__restrict__\s+|const\s+)?(\w+)")
    in_loop = _inside(_loop_spans(code))
    for off, callee, args in _calls(code, r"atomicAdd"):
        ptrs = scope.at(off)
        target = re.sub(r"^[&(\s]+", "", args[0])
        base = re.match(r"\w+", target)
        is_float = re.search(r"\(\s*(?:float|double)\s*\*\s*\)", args[0]) or (
            base and base.group(0) in ptrs
        )
        if is_float and in_loop(off):
            yield off, f"{callee}({args[0]}, ...) inside a loop"


def _grid_sync(code: str) -> Iterator[Hit]:
    names = _names(code, r"\bgrid_group\s+(\w+)") | _names(
        code, r"\bauto\s+(\w+)\s*=\s*(?:\w+::)*this_grid\s*\(\s*\)"
    )
    for m in re.finditer(r"\bthis_grid\s*\(\s*\)\s*\.\s*sync\s*\(", code):
        yield m.start(), "this_grid().sync()"
    for name in names:
        for m in re.finditer(rf"\b{re.escape(name)}\s*\.\s*sync\s*\(", code):
            yield m.start(), f"{name}.sync()"


# a lane count spelled as a constant: #define NAME 32, const/constexpr [type] NAME = 32 / NAME{32}
_CONST_32 = (
    r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+\(?32[uU]?\)?[ \t]*$",
    r"\b(?:constexpr|const)\s+(?:(?:static|unsigned|signed|long|short|int|uint32_t|int32_t|"
    r"uint64_t|int64_t|size_t|auto)\s+)*(\w+)\s*(?:=\s*32[uUlL]*|\{\s*32[uUlL]*\s*\})\s*(?=[;,)]|$)",
)
_WARPISH = re.compile(r"warp|lane|wave|wavefront|simd", re.IGNORECASE)
_ASSERTS = r"assert|static_assert|_Static_assert|HIP_ASSERT|CUDA_ASSERT|assert_\w+"
_WS_CMP_32 = re.compile(
    r"(?:\bwarpSize\s*[!=]=\s*32[uU]?\b|\b32[uU]?\s*[!=]=\s*(?:\w+\s*(?:\.|->)\s*)?warpSize\b)"
)


def _constants_32(code: str) -> dict[str, int]:
    """Names defined as 32 (``#define WARP_SIZE 32``, ``const int kWarp = 32;``) → definition offset."""
    out: dict[str, int] = {}
    for pattern in _CONST_32:
        for m in re.finditer(pattern, code, re.MULTILINE):
            out.setdefault(m.group(1), m.start(1))
    return out


def _shuffle_widths(code: str) -> Iterator[tuple[int, str]]:
    """(offset, text) of the width argument of each ``__shfl*`` call that passes one."""
    for off, callee, args in _calls(code, r"__shfl\w*"):
        n_args = 4 if callee.endswith("_sync") else 3
        if len(args) >= n_args and args[n_args - 1]:
            width = args[n_args - 1]
            yield code.find(width, off), width


def _for_conditions(code: str) -> Iterator[tuple[int, str]]:
    """(offset, text) of the condition of each ``for (init; cond; step)`` head."""
    for m in re.finditer(r"\bfor\s*\(", code):
        end = matching(code, m.end() - 1)
        head = code[m.end() : end - 1]
        parts = head.split(";")
        if len(parts) == 3:
            yield m.end() + len(parts[0]) + 1, parts[1]


def _lane_constant_uses(code: str) -> Iterator[Hit]:
    """A lane count hard-coded to 32 used as a shuffle width, loop bound or mask size.

    Any constant (or a literal 32) passed as a shuffle width counts; as a loop bound or shift only
    constants with a warp/lane/wave name do, so ``const int kTile = 32`` loops stay silent.
    """
    consts = _constants_32(code)
    warpish = [n for n in consts if _WARPISH.search(n)]
    for off, width in _shuffle_widths(code):
        if width in consts or re.fullmatch(r"32[uU]?", width):
            yield off, f"shuffle width {width} = 32"
    for name in warpish:
        word = re.compile(rf"\b{re.escape(name)}\b")
        for off, cond in _for_conditions(code):
            for m in word.finditer(cond):
                yield off + m.start(), f"loop bound {name} = 32"
        for m in re.finditer(rf"<<\s*\(?\s*{re.escape(name)}\b", code):
            yield m.start() + m.group(0).index(name), f"mask size 1 << {name} (= 32)"


def _assert_spans(code: str) -> list[tuple[int, int]]:
    spans = []
    for m in re.finditer(rf"\b(?:{_ASSERTS})\s*\(", code):
        spans.append((m.start(), matching(code, m.end() - 1)))
    return spans


def _warpsize_compares(code: str, *, in_assert: bool) -> Iterator[Hit]:
    """``warpSize == 32`` / ``!= 32`` comparisons, inside (or outside) an assert."""
    in_assert_call = _inside(_assert_spans(code))
    for m in _WS_CMP_32.finditer(code):
        inside = in_assert_call(m.start())
        if inside is in_assert:
            yield m.start(), m.group(0)


def _warpsize_compare_hits(code: str) -> Iterator[Hit]:
    return _warpsize_compares(code, in_assert=False)


def _warpsize_assert_hits(code: str) -> Iterator[Hit]:
    return _warpsize_compares(code, in_assert=True)


RULES: tuple[Rule, ...] = (
    Rule(
        "warp-size-literal",
        "warning",
        "32 used as the warp size: on CDNA (wave64) half the lanes idle or the lane math is wrong",
        "use warpSize (device code) or props.warp_size / rocmtrain.platform.warp_size() (host)",
        (
            r"^\s*#\s*define\s+\w*WARP\w*\s+\(?32[uU]?\)?\s*$",
            r"\b\w*[wW]arp_?[sS]ize\w*\s*=\s*32\b",
            rf"\b{_THREADISH}\s*(?:%\s*32|&\s*(?:31|0x1[fF])|/\s*32|>>\s*5)\b",
            r"\blane\w*\s*<\s*32\b",
        ),
    ),
    Rule(
        "warpsize-compare-32",
        "warning",
        "warpSize compared with 32: false on every CDNA GPU (MI100/MI200/MI300 are wave64), so the "
        "wave32 branch never runs there (or the != 32 branch always does)",
        "write the code for any wave size (size from warpSize), or branch on warpSize == 64 and test "
        "both paths",
        finder=_warpsize_compare_hits,
    ),
    Rule(
        "warpsize-assert-32",
        "error",
        "assert on warpSize == 32 fails on every CDNA GPU (wave64): the kernel or program aborts",
        "remove the assert and make the code wave-size agnostic (warpSize, __ballot as uint64_t), or "
        "accept 64 as well",
        finder=_warpsize_assert_hits,
    ),
    Rule(
        "warp-constant-32",
        "warning",
        "lane count hard-coded to 32 (#define / const / constexpr) used as a shuffle width, loop bound "
        "or mask size: on CDNA (wave64) lanes 32-63 are skipped, shuffled in the wrong segment or "
        "masked out",
        "derive it from warpSize in device code (props.warp_size on the host), or define it per arch "
        "(64 under __GFX9__); masks of 64 lanes need uint64_t",
        finder=_lane_constant_uses,
    ),
    Rule(
        "warpsize-constexpr",
        "error",
        "warpSize is not a compile-time constant on ROCm >= 7.0 (constexpr, template argument, "
        "__launch_bounds__ or array size does not compile)",
        "use an arch-guarded constant (64 on CDNA: __GFX9__) or dispatch at run time",
        (
            r"\bconstexpr\b[^;{]*=[^;{]*\bwarpSize\b",
            r"__launch_bounds__\s*\([^)]*\bwarpSize\b",
            r"\b\w+\s*<\s*[^<>;()&|]*\bwarpSize\b[^<>;()&|]*>\s*(?:\(|::|\w)",
            r"\b(?!return\b)[A-Za-z_]\w*\s+\w+\s*\[[^\]]*\bwarpSize\b[^\]]*\]\s*[;=\[]",
        ),
    ),
    Rule(
        "mask-32bit",
        "error",
        "32-bit lane mask: HIP's __*_sync builtins static_assert a 64-bit mask "
        "(hip/amd_detail/amd_warp_sync_functions.h), so passing it does not compile; widened to 64 "
        "bits by a cast it still covers only lanes 0-31 of a wave64",
        "pass 0xffffffffffffffffULL or __activemask(); keep masks in uint64_t",
        (
            rf"\b__(?:shfl\w*_sync|ballot_sync|any_sync|all_sync|match_\w+_sync|reduce_\w+_sync)"
            rf"\s*\(\s*{_FULL32}\s*[,)]",
            r"^\s*#\s*define\s+\w*MASK\w*\s+\(?0x[fF]{8}(?![0-9a-fA-F])[uUlL]*\)?\s*$",
            r"\b(?:unsigned(?:\s+int)?|uint32_t|int)\s+\w*[mM]ask\w*\s*=\s*0x[fF]{8}(?![0-9a-fA-F])",
        ),
    ),
    Rule(
        "ballot-truncation",
        "error",
        "__ballot/__activemask return 64 bits on wave64; a 32-bit variable or __popc/__ffs "
        "drops lanes 32-63",
        "store in uint64_t / unsigned long long and use __popcll / __ffsll",
        (
            r"\b(?:unsigned\s+int|unsigned|uint32_t|int)\s+\w+\s*=\s*__(?:ballot\w*|activemask)\s*\(",
            r"\b__(?:popc|ffs|clz)\s*\(\s*__(?:ballot\w*|activemask)\s*\(",
        ),
    ),
    Rule(
        "butterfly-16",
        "warning",
        "reduction/butterfly starting at offset 16 covers 32 lanes; lanes 32-63 are never combined",
        "start at warpSize / 2 (for (int o = warpSize / 2; o > 0; o /= 2))",
        (
            r"\bfor\s*\(\s*(?:(?:unsigned|int|auto|size_t)\s+)?\w+\s*=\s*16\s*;[^;]*;[^)]*"
            r"(?:/=\s*2|>>=\s*1|>>\s*1|/\s*2)[^)]*\)",
            r"\b__shfl_(?:xor|down)\w*\s*\((?:[^();]|\([^();]*\))*,\s*16\s*(?:,[^();]*)?\)",
        ),
    ),
    Rule(
        "syncwarp",
        "info",
        "__syncwarp() needs ROCm >= 7.0 (hip/amd_detail/amd_warp_sync_functions.h declares it from "
        "7.0); with an older ROCm the file does not compile",
        "build with ROCm >= 7.0, or guard the call (#if HIP_VERSION_MAJOR >= 7: wavefront lanes of "
        "older HIP run in lockstep); do not add your own __syncwarp, it conflicts with ROCm >= 7.0",
        finder=_syncwarp_calls,
    ),
    Rule(
        "syncwarp-shim",
        "warning",
        "a user-defined __syncwarp (a shim for HIP before ROCm 7.0) conflicts with the one ROCm >= 7.0 "
        "declares in hip/amd_detail/amd_warp_sync_functions.h: redefinition error",
        "remove the shim and require ROCm >= 7.0, or guard it with #if HIP_VERSION_MAJOR < 7 (then "
        "suppress this finding with // rocmtrain: ignore[syncwarp-shim])",
        finder=_syncwarp_defs,
    ),
    Rule(
        "wmma",
        "error",
        "nvcuda::wmma (mma.h) does not exist in HIP",
        "use rocWMMA (rocwmma::) or a library GEMM (hipBLASLt)",
        (r"\bnvcuda\b", r"\bwmma\s*::", r"^\s*#\s*include\s*<mma\.h>"),
    ),
    Rule(
        "inline-ptx",
        "error",
        "inline PTX asm does not assemble for AMD GPUs",
        "use HIP intrinsics / builtins, or guard with #ifdef __HIP_PLATFORM_NVIDIA__",
        (r"\b(?:asm|__asm__)\s*(?:volatile\s*|__volatile__\s*)?\(",),
    ),
    Rule(
        "cg-tile-32",
        "warning",
        "cooperative-groups tile of 32 assumes wave32 (and 32-bit masks)",
        "size tiles from warpSize (tile <= warpSize) or use a tile of the wavefront size",
        (
            r"\btiled_partition\s*<\s*32\s*>",
            r"\bthread_block_tile\s*<\s*32\s*>",
            r"\btiled_partition\s*\([^;()]*,\s*32\s*\)",
        ),
    ),
    Rule(
        "grid-sync",
        "warning",
        "grid.sync() needs a cooperative launch (hipLaunchCooperativeKernel) and co-resident blocks",
        "launch with hipLaunchCooperativeKernel and size the grid by occupancy, or split the kernel",
        finder=_grid_sync,
    ),
    Rule(
        "half-atomic",
        "warning",
        "atomicAdd on __half / bf16 is a CAS loop (MI200 has no bf16 atomics) and accumulating in "
        "half loses updates",
        "accumulate in fp32 (rocmtrain.precision.atomics) and convert once",
        finder=_half_atomics,
    ),
    Rule(
        "atomic-in-loop",
        "warning",
        "float atomics in a loop: contended and slow (the default atomicAdd(float) is a CAS loop); "
        "the hardware float atomics that -munsafe-fp-atomics or unsafeAtomicAdd emit are fast but "
        "do not work on fine-grained or host memory on MI200 (gfx90a)",
        "accumulate in registers/LDS and issue one atomic per thread; use unsafeAtomicAdd / "
        "-munsafe-fp-atomics only on coarse-grained device memory (hipMalloc)",
        finder=_float_atomics_in_loops,
    ),
    Rule(
        "cuda-arch-check",
        "warning",
        "__CUDA_ARCH__ / CUDA_VERSION are not defined (or not comparable) under HIP",
        "use __HIP_DEVICE_COMPILE__, __HIP_ARCH_HAS_*__ / __gfx9xx__, HIP_VERSION or ROCM_VERSION",
        (r"\b__CUDA_ARCH__\b", r"\bCUDA(?:RT)?_VERSION\b"),
    ),
    Rule(
        "smem-bank-padding",
        "info",
        "shared-memory padding tuned for 32 banks ([32][33]): CDNA LDS also has 32 banks x 4 B, so it "
        "still avoids conflicts for 32-bit accesses; what differs is wave64 (64-lane tiles) and how "
        "wide 64/128-bit loads group lanes",
        "keep it for 32-bit element access; re-derive the padding for wide loads and 64-lane tiles, "
        "and measure LDS bank conflicts with rocprof",
        (r"__shared__[^;]*\[\s*(\w+)\s*\]\s*\[\s*(?:33|\1\s*\+\s*1)\s*\]",),
    ),
)
