"""Relaunch compiled Triton kernels without ``JITFunction.run``'s per-call argument binding.

``kernel[grid](*args, **meta)`` re-derives every argument's specialization on every call (dtype,
16-byte alignment, int width and divisibility; on AMD whether a tensor spans < 2 GiB) before it
looks the binary up. On the H200 machine's host that costs 20-50 us for the forward kernel's 23
parameters (``scripts/bench/tbe_host_cost.py``; BENCHMARKS.md), as long as the kernel itself runs
at B=16K, so the call was host-bound. :class:`Launcher` sends the first launch of each *key* through Triton (which
compiles and picks the binary) and launches that binary directly when a later call's arguments
have the same key. The key holds every property Triton specializes on, so the binary is the one
Triton would pick. ``ROCMTRAIN_TRITON_LAUNCH`` selects the path:

- ``fast`` (default): as above;
- ``check``: as ``fast``, and every launch asserts that Triton's own dispatch picks the same binary
  (a new Triton version that specializes on something else fails loudly here);
- ``triton``: every launch through ``kernel[grid]``.

The Triton interpreter (``TRITON_INTERPRET=1``) and Triton releases before 3.4 (whose launcher
takes other arguments) always use ``kernel[grid]``.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any

import torch
import triton
from triton.runtime.driver import driver

_knobs = getattr(triton, "knobs", None)  # Triton >= 3.4
MODES = ("fast", "check", "triton")
_I32 = 2**31
_U64 = 2**63


@functools.cache
def launch_mode() -> str:
    """``ROCMTRAIN_TRITON_LAUNCH`` (read once per process; ``launch_mode.cache_clear()`` re-reads)."""
    mode = os.environ.get("ROCMTRAIN_TRITON_LAUNCH", "fast")
    if mode not in MODES:
        raise ValueError(
            f"ROCMTRAIN_TRITON_LAUNCH={mode!r} is not a launch path; use one of {MODES}: 'fast' "
            f"(default) relaunches cached binaries, 'check' also verifies each against Triton's "
            f"dispatch, 'triton' always launches through kernel[grid]"
        )
    return mode


@functools.cache
def _fast_supported() -> bool:
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return _knobs is not None and not interpreted and torch.cuda.is_available()


def arg_key(a: Any, rocm: bool) -> Any:
    """What Triton specializes a kernel argument on (a superset: two arguments with one key
    always get the same binary). Floats by type only: Triton passes them by value."""
    if isinstance(a, torch.Tensor):
        aligned = a.data_ptr() % 16 == 0
        if rocm:  # AMD buffer ops: the tensor's storage spans < 2 GiB
            return a.dtype, aligned, a.untyped_storage().size() < _I32
        return a.dtype, aligned
    if isinstance(a, bool) or a is None or isinstance(a, str):
        return a
    if isinstance(a, int):
        width = 0 if -_I32 <= a < _I32 else (1 if a < _U64 else 2)
        return a == 1, a % 16 == 0, width
    if isinstance(a, float):
        return float
    return a  # anything else (constexpr objects): by value


def has_hook(hook: Any) -> bool:
    """Whether a launch hook is set: Triton 3.6 keeps an empty ``HookChain`` (its ``calls``
    list) by default, older ones ``None``."""
    return bool(getattr(hook, "calls", hook))


class Launcher:
    """``Launcher(kernel).run(grid, *args, **meta)`` launches like ``kernel[grid](*args, **meta)``
    (runtime arguments positional, constexprs and launch options by keyword)."""

    def __init__(self, fn: triton.runtime.JITFunction):
        self.fn = fn
        params = inspect.signature(fn.fn).parameters
        self._names = list(params)
        self._defaults = {n: p.default for n, p in params.items()
                          if p.default is not inspect.Parameter.empty}  # fmt: skip
        self._bins: dict[tuple, Any] = {}
        self._rocm = torch.version.hip is not None

    def run(self, grid: tuple[int, ...], *args: Any, **meta: Any) -> None:
        mode = launch_mode()
        if mode == "triton" or not _fast_supported():
            self.fn[grid](*args, **meta)
            return
        device = driver.active.get_current_device()
        rocm = self._rocm
        key = (device, tuple([arg_key(a, rocm) for a in args]), tuple(meta.items()))
        binary = self._bins.get(key)
        hooked = has_hook(_knobs.runtime.launch_enter_hook) or self.fn.pre_run_hooks
        if binary is None or hooked:  # Triton's own dispatch: compiles on a miss, runs hooks
            self._bins[key] = self.fn[grid](*args, **meta)
            return
        if mode == "check":
            want = self.fn.warmup(*args, grid=grid, **meta)
            if want is not binary:
                raise RuntimeError(
                    f"{self.fn.__name__}: the cached binary for this launch is not the one "
                    f"Triton {triton.__version__} dispatches to (it specializes on an argument "
                    f"property rocmtrain.kernels.launch.arg_key misses); run with "
                    f"ROCMTRAIN_TRITON_LAUNCH=triton and report the Triton version"
                )
        # the values in signature order, constexprs included, as JITFunction.run passes them
        vals = list(args)
        for name in self._names[len(args) :]:
            vals.append(meta[name] if name in meta else self._defaults[name])
        g0, g1, g2 = (tuple(grid) + (1, 1))[:3]
        stream = driver.active.get_current_stream(device)
        binary.run(g0, g1, g2, stream, binary.function, binary.packed_metadata, None, None, None,
                   *vals)  # fmt: skip
