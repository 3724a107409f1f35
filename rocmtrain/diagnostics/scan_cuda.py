"""CUDA→HIP porting-trap rules for ``.cu .cuh .hip .cpp .h`` (ROCM_FACTS §6).

Each rule matches on source with comments and string contents blanked (:mod:`scan_lex`), so the
reported line:col are the file's own. Regex rules are kept narrow (lane arithmetic only on thread/lane
names, masks only as sync-intrinsic arguments or MASK macros) so correct wave64 code stays silent.
"""

from __future__ import annotations

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
        rest = code[head_end:]
        stripped = rest.lstrip()
        body_start = head_end + len(rest) - len(stripped)
        if stripped.startswith("{"):
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


def _scope_of(code: str, spans: list[tuple[int, int]], off: int) -> str:
    """The text of the top-level function containing ``off`` (names declared there only)."""
    for a, b in spans:
        if a <= off < b:
            return code[a:b]
    return code


def _half_shuffles(code: str) -> Iterator[Hit]:
    spans = _scopes(code)
    for off, callee, args in _calls(code, r"__shfl\w*"):
        halves = _names(_scope_of(code, spans, off), rf"\b{_HALF}\s+(\w+)\s*[=;,)\[]")
        value = args[1] if callee.endswith("_sync") and len(args) > 1 else args[0]
        if value in halves or re.search(rf"__float2half|__float2bfloat16|\(\s*{_HALF}\s*\)", value):
            yield off, f"{callee}(... {value} ...)"


def _half_atomics(code: str) -> Iterator[Hit]:
    spans = _scopes(code)
    for off, callee, args in _calls(code, r"atomicAdd\w*|unsafeAtomicAdd"):
        ptrs = _names(
            _scope_of(code, spans, off), rf"\b{_HALF}\s*\*\s*(?:__restrict__\s+|const\s+)?(\w+)"
        )
        target = re.sub(r"^[&(\s]+", "", args[0])
        base = re.match(r"\w+", target)
        if re.search(rf"\(\s*{_HALF}\s*\*\s*\)", args[0]) or (base and base.group(0) in ptrs):
            yield off, f"{callee}({args[0]}, ...)"


def _float_atomics_in_loops(code: str) -> Iterator[Hit]:
    scopes, spans = _scopes(code), _loop_spans(code)
    for off, callee, args in _calls(code, r"atomicAdd"):
        scope = _scope_of(code, scopes, off)
        ptrs = _names(scope, r"\b(?:float|double)\s*\*\s*(?:__restrict__\s+|const\s+)?(\w+)")
        target = re.sub(r"^[&(\s]+", "", args[0])
        base = re.match(r"\w+", target)
        is_float = re.search(r"\(\s*(?:float|double)\s*\*\s*\)", args[0]) or (
            base and base.group(0) in ptrs
        )
        if is_float and any(a <= off < b for a, b in spans):
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
        "32-bit lane mask: HIP masks are 64-bit, lanes 32-63 are dropped",
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
        "error",
        "__syncwarp / independent thread scheduling do not exist in HIP",
        "restructure: wavefront lanes run in lockstep; use __syncthreads() across warps",
        (r"\b__syncwarp\s*\(",),
    ),
    Rule(
        "half-shuffle",
        "warning",
        "__shfl* on __half / bf16 values is unsupported in HIP",
        "shuffle as float (__half2float) or reinterpret as short/int",
        finder=_half_shuffles,
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
        "float atomics in a loop: slow, and a silent no-op on fine-grained/host memory on MI200",
        "accumulate in registers/LDS and issue one atomic per thread; unsafeAtomicAdd on device "
        "memory",
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
        "shared-memory padding tuned for 32 banks ([32][33]); the LDS bank layout differs on CDNA",
        "re-derive the padding for the target (measure LDS bank conflicts with rocprof)",
        (r"__shared__[^;]*\[\s*(\w+)\s*\]\s*\[\s*(?:33|\1\s*\+\s*1)\s*\]",),
    ),
)
