"""Scatter-add / index-add / embedding-gradient accumulation that never accumulates in fp16/bf16.

Rule: accumulate in fp32, store once. Adding 1.0 to a bf16 slot 100 000 times by
repeated 16-bit adds stops at 256 (256 + 1 rounds back to 256); fp16 stops at 2048. These functions
accumulate into a fresh fp32 buffer (Triton ``tl.atomic_add(..., sem="relaxed")`` on GPU, or torch's
fp32 ``index_add_`` elsewhere) and cast to the destination dtype once.

    from rocmtrain.precision import atomics
    atomics.index_add(dest, index, source)                    # dest[index[i]] += source[i]
    atomics.scatter_add(dest, 0, index, src)                  # torch.scatter_add_ semantics
    grad_w = atomics.embedding_bag_grad(grad_out, indices, offsets, num_embeddings=R)

``policy`` (``precision.atomics``; ``None`` = :func:`get_default_policy`, which the precision plugin
sets from the config for the run): ``auto``/``fp32`` = fp32 intermediate for fp16/bf16 (fp32 and fp64
destinations accumulate in their own dtype, which is already >= fp32); ``native`` = torch's op in the
destination dtype (on GPU: fp16/bf16 atomics, a CAS loop where :mod:`capabilities` says ``cas``).
``backend``: ``auto`` (Triton on GPU, torch on CPU), ``triton`` (on CPU needs ``TRITON_INTERPRET=1``),
``torch``.

The Triton kernel allocates its fp32 buffer with torch (coarse-grained device memory) and refuses
pinned/host memory: on MI200 *hardware* float atomics (``-munsafe-fp-atomics``, ``unsafeAtomicAdd``,
and what Triton's AMD backend has emitted) do not work on fine-grained or host memory (AMD's
"Hardware atomics operation support" page). HIP's default ``atomicAdd(float)`` is a CAS loop and
is not affected.
"""

from __future__ import annotations

import logging
import os

import torch

from rocmtrain.precision.capabilities import current_capabilities

log = logging.getLogger(__name__)

try:  # Triton is optional: CPU installs without it use the torch path
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only without triton installed
    triton = None
    tl = None

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
_warned: set[str] = set()
_default_policy = "auto"


def get_default_policy() -> str:
    """The policy used when a call passes ``policy=None`` (set from ``precision.atomics`` by the
    precision plugin for the duration of a run)."""
    return _default_policy


def set_default_policy(policy: str) -> str:
    """Set the process-wide default policy; returns the previous one."""
    global _default_policy
    accumulation_dtype(torch.float16, policy)  # validates
    old, _default_policy = _default_policy, policy
    return old


def accumulation_dtype(dtype: torch.dtype, policy: str | None = None) -> torch.dtype:
    """The dtype the sum is accumulated in for a destination of ``dtype`` under ``policy``."""
    policy = _default_policy if policy is None else policy
    if policy not in ("auto", "fp32", "native"):
        raise ValueError(
            f"atomics policy={policy!r} is not valid; allowed: 'auto', 'fp32', 'native'"
        )
    if policy == "native" or dtype not in _LOW_PRECISION:
        return dtype
    return torch.float32


def _use_triton(t: torch.Tensor, backend: str) -> bool:
    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend={backend!r} is not valid; allowed: 'auto', 'triton', 'torch'")
    if backend == "torch":
        return False
    if triton is None:
        if backend == "triton":
            raise RuntimeError("backend='triton' needs the triton package: pip install triton")
        return False
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if backend == "triton" and t.device.type == "cpu" and not interpret:
        raise RuntimeError(
            "backend='triton' on a CPU tensor needs TRITON_INTERPRET=1 (interpreter) or a GPU tensor"
        )
    if backend == "auto":
        return t.device.type == "cuda"
    return True


def _warn_native(dtype: torch.dtype, device: torch.device) -> None:
    name = _DTYPE_NAMES.get(dtype, str(dtype))
    key = f"{name}:{device.type}"
    if key in _warned:
        return
    _warned.add(key)
    caps = current_capabilities()
    kind = caps.atomic_add.get(name, "none")
    log.warning(
        "precision.atomics=native: accumulating in %s on %s (%s atomics: %s). Repeated %s adds lose "
        "precision (bf16 1.0 summed stalls at 256); use precision.atomics=auto for fp32 accumulation",
        name,
        caps.arch,
        name,
        kind,
        name,
    )


def _check_device_memory(t: torch.Tensor) -> None:
    if t.device.type == "cpu" and t.is_pinned():
        raise ValueError(
            "atomic accumulation into pinned host memory: the Triton kernel's hardware (unsafe) "
            "float atomics do not work on fine-grained/host memory on MI200. Accumulate into a "
            "device tensor and copy afterwards"
        )


if triton is not None:

    @triton.jit
    def _index_add_rows_kernel(
        acc_ptr,  # fp32 [R, D] contiguous
        src_ptr,  # [N, D] any float dtype, row stride src_stride, unit column stride
        idx_ptr,  # int32/int64 [N]
        n_rows,
        dim,
        src_stride,
        alpha,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        rmask = rows < n_rows
        mask = rmask[:, None] & (cols < dim)[None, :]
        dst = tl.load(idx_ptr + rows, mask=rmask, other=0).to(tl.int64)
        src_off = rows.to(tl.int64)[:, None] * src_stride + cols[None, :]
        vals = tl.load(src_ptr + src_off, mask=mask, other=0.0).to(tl.float32) * alpha
        # relaxed: the adds need no ordering among themselves (the default is acq_rel).
        tl.atomic_add(acc_ptr + dst[:, None] * dim + cols[None, :], vals, mask=mask, sem="relaxed")


def _triton_index_add_rows(
    acc: torch.Tensor, index: torch.Tensor, src: torch.Tensor, alpha: float
) -> None:
    """``acc[index[i], :] += alpha * src[i, :]`` with fp32 atomics; acc fp32 [R, D] contiguous."""
    n, d = src.shape
    if n == 0 or d == 0:
        return
    src = src if src.stride(1) == 1 else src.contiguous()
    block_d = min(triton.next_power_of_2(d), 128)
    block_n = max(1, min(1024, 4096 // block_d))
    grid = (triton.cdiv(n, block_n), triton.cdiv(d, block_d))
    _index_add_rows_kernel[grid](
        acc,
        src,
        index.contiguous(),
        n,
        d,
        src.stride(0),
        float(alpha),
        BLOCK_N=block_n,
        BLOCK_D=block_d,
    )


def _check_index(index: torch.Tensor, size: int, what: str) -> None:
    if index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{what} must be int32/int64, got {index.dtype}")
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= size):
        raise IndexError(
            f"{what} out of range [0, {size}): min {int(index.min())}, max {int(index.max())}"
        )


def index_add(
    dest: torch.Tensor,
    index: torch.Tensor,
    source: torch.Tensor,
    *,
    dim: int = 0,
    alpha: float = 1.0,
    policy: str | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """In place ``dest.index_add_(dim, index, source, alpha=alpha)``, accumulated per ``policy``.

    Shapes: ``dest`` [R, ...], ``index`` [N] in [0, R), ``source`` [N, ...] (``dim`` moved first).
    Returns ``dest``.
    """
    acc_dtype = accumulation_dtype(dest.dtype, policy)
    if acc_dtype == dest.dtype:
        if dest.dtype in _LOW_PRECISION:
            _warn_native(dest.dtype, dest.device)
        return dest.index_add_(dim, index, source.to(dest.dtype), alpha=alpha)
    _check_index(index, dest.shape[dim], "index")
    if not _use_triton(dest, backend):
        acc = dest.to(torch.float32)
        acc.index_add_(dim, index, source.to(torch.float32), alpha=alpha)
        return dest.copy_(acc)  # the one cast
    _check_device_memory(dest)
    d_moved = dest.movedim(dim, 0)
    acc = d_moved.to(torch.float32).contiguous().view(d_moved.shape[0], -1)
    src = source.movedim(dim, 0).reshape(source.shape[dim], -1)
    if src.shape[1] != acc.shape[1]:
        raise ValueError(
            f"source shape {tuple(source.shape)} does not match dest {tuple(dest.shape)}"
        )
    _triton_index_add_rows(acc, index, src, alpha)
    d_moved.copy_(acc.view(d_moved.shape))
    return dest


def scatter_add(
    dest: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    src: torch.Tensor,
    *,
    policy: str | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """In place ``dest.scatter_add_(dim, index, src)`` accumulated per ``policy``; returns ``dest``.

    ``index`` has the same number of dims as ``dest``; ``src`` is read where ``index`` is defined.
    """
    acc_dtype = accumulation_dtype(dest.dtype, policy)
    if acc_dtype == dest.dtype:
        if dest.dtype in _LOW_PRECISION:
            _warn_native(dest.dtype, dest.device)
        return dest.scatter_add_(dim, index, src.to(dest.dtype))
    _check_index(index, dest.shape[dim], "index")
    if not _use_triton(dest, backend):
        acc = dest.to(torch.float32).scatter_add_(dim, index, src.to(torch.float32))
        return dest.copy_(acc)
    _check_device_memory(dest)
    # Linear offsets into a contiguous dest: position of every index element, with coordinate
    # `dim` replaced by the index value. Then a 1-wide row add (D = 1) into the flat fp32 buffer.
    dim = dim % dest.dim()
    coords = torch.meshgrid(
        *[torch.arange(s, device=index.device) for s in index.shape], indexing="ij"
    )
    strides = torch.empty(dest.shape).stride() if dest.dim() else ()
    flat = torch.zeros(index.shape, dtype=torch.int64, device=index.device)
    for k, (c, st) in enumerate(zip(coords, strides, strict=True)):
        flat += (index.long() if k == dim else c) * st
    vals = src[tuple(slice(0, s) for s in index.shape)]
    acc = dest.to(torch.float32).contiguous()
    _triton_index_add_rows(acc.view(-1, 1), flat.reshape(-1), vals.reshape(-1, 1), 1.0)
    return dest.copy_(acc)


def embedding_bag_grad(
    grad_output: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    *,
    num_embeddings: int,
    per_sample_weights: torch.Tensor | None = None,
    mode: str = "sum",
    out_dtype: torch.dtype | None = None,
    policy: str | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Dense weight gradient of an embedding bag: ``[num_embeddings, D]`` in ``out_dtype``.

    Shapes (B bags, L = total indices, bag b = ``indices[offsets[b]:offsets[b+1]]``)::

        grad_output [B, D]   indices [L]   offsets [B+1]   per_sample_weights [L] | None
        bag 0: rows 3, 7     bag 1: (empty)     bag 2: rows 7, 7, 1
        indices = [3, 7, 7, 7, 1]   offsets = [0, 2, 2, 5]   → row 7 gets g0 + 2*g2

    Every (index, bag) contribution is added into one fp32 buffer (under ``auto``/``fp32``), then
    cast once to ``out_dtype`` (default: ``grad_output.dtype``).
    """
    if mode not in ("sum", "mean"):
        raise ValueError(f"mode={mode!r} is not valid; allowed: 'sum', 'mean'")
    if offsets.numel() != grad_output.shape[0] + 1:
        raise ValueError(
            f"offsets has {offsets.numel()} entries; expected B+1 = {grad_output.shape[0] + 1}"
        )
    out_dtype = out_dtype or grad_output.dtype
    lengths = offsets[1:] - offsets[:-1]
    bag = torch.repeat_interleave(torch.arange(lengths.numel(), device=indices.device), lengths)
    acc_dtype = accumulation_dtype(out_dtype, policy)
    rows = grad_output.to(acc_dtype)[bag]  # [L, D]
    scale = None
    if mode == "mean":
        scale = 1.0 / lengths.clamp(min=1).to(acc_dtype)[bag]
    if per_sample_weights is not None:
        w = per_sample_weights.to(acc_dtype)
        scale = w if scale is None else scale * w
    if scale is not None:
        rows = rows * scale[:, None]
    out = torch.zeros(
        num_embeddings, grad_output.shape[1], dtype=out_dtype, device=grad_output.device
    )
    return index_add(out, indices, rows, policy=policy, backend=backend)
