"""Launch a Triton kernel again without re-running Triton's per-call argument specialisation.

``kernel[grid](*args)`` (``JITFunction.run``) binds every argument, specialises it (tensor dtype
and 16-byte alignment, integer width, integers equal to 1 or divisible by 16), hashes that into a
cache key and looks the compiled kernel up, on every call. On the H200's host that was ~40 % of
the forward's 114 µs host time per call (``scripts/bench/tbe_host_cost.py``, cProfile), more
than the 73 µs the GPU needs at B = 16384, so the forward was host-bound.

:func:`launch` keys the compiled kernel on a cheaper tuple that separates at least what Triton
specialises on (so one key never maps to two of Triton's kernels), takes Triton's own path on a
miss, and on a hit launches the compiled kernel through its launcher (``compiled[grid](*args)``,
Triton's API for a kernel compiled ahead of time; Triton >= 3.3 passes constexprs there too).
Under the interpreter (``TRITON_INTERPRET=1``) or on an older Triton every call takes Triton's
path.
"""

from __future__ import annotations

import torch
import triton

try:  # the compiled-kernel type Triton's path returns; absent under odd installs
    from triton.compiler import CompiledKernel
except ImportError:  # pragma: no cover - every supported Triton has it
    CompiledKernel = None  # type: ignore[assignment,misc]


def _triton_at_least(major: int, minor: int) -> bool:
    parts = triton.__version__.split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= (major, minor)
    except (ValueError, IndexError):
        return False


_FAST = CompiledKernel is not None and _triton_at_least(3, 3)

_I32 = (-(2**31), 2**31)


def _spec(a) -> object:
    """What Triton may specialise an argument on, cheaply: a tensor's dtype and 16-byte
    alignment; an integer's width and whether it is 1 or a multiple of 16; a bool's or a
    constexpr's value; a float's type."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool):
        return a
    if isinstance(a, int):
        return (_I32[0] <= a < _I32[1], a >= 2**63, a == 1, a % 16 == 0)
    if isinstance(a, float):
        return float
    return a  # None, strings and other constexpr values: by value


class _Entry:
    __slots__ = ("kernel", "tail")

    def __init__(self, kernel, tail: tuple[str, ...]):
        self.kernel = kernel
        self.tail = tail  # names of the keyword arguments that are kernel parameters, in order


_CACHES: dict[int, dict[tuple, _Entry]] = {}


def launch(fn, grid: tuple[int, ...], *args, **kwargs):
    """``fn[grid](*args, **kwargs)``, through the compiled kernel's launcher when an earlier call
    had the same specialisation. ``args``: the kernel's leading parameters, positionally;
    the first a tensor; ``kwargs``: its remaining parameters (constexprs) and launch options
    (``num_warps``, ``num_stages``, ``maxnreg``, ...). Returns what Triton's launch returns:
    the compiled kernel that ran (None-like under the interpreter)."""
    if not _FAST or not args[0].is_cuda:  # the interpreter, CPU tensors, an older Triton
        return fn[grid](*args, **kwargs)
    # a compiled kernel is loaded on one device: the current one is part of the key
    key = (torch.cuda.current_device(), *map(_spec, args), *kwargs.items())
    cache = _CACHES.setdefault(id(fn), {})
    entry = cache.get(key)
    if entry is not None:
        entry.kernel[(*grid, 1, 1)[:3]](*args, *[kwargs[n] for n in entry.tail])
        return entry.kernel
    compiled = fn[grid](*args, **kwargs)  # Triton's path: compiles or finds, and launches
    if isinstance(compiled, CompiledKernel):
        names = fn.arg_names[len(args) :]
        missing = [n for n in names if n not in kwargs]
        if not missing:  # (parameters left to their defaults stay on Triton's path)
            cache[key] = _Entry(compiled, tuple(names))
    return compiled


def cached_kernels(fn) -> int:
    """How many compiled kernels of ``fn`` :func:`launch` can launch directly (for tests)."""
    return len(_CACHES.get(id(fn), {}))
