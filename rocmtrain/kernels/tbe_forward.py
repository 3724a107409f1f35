"""Triton forward of table-batched embedding bags: pooled SUM/MEAN with fp32 accumulation.

One program per (bag block, feature, D tile). Each program gathers a ``[BAGS, BLOCK_L, BLOCK_D]``
tile of weight rows per loop step (int32/int64 indices, out-of-range rows masked to zero — the
bounds check runs before, in :func:`rocmtrain.kernels.reference.check_inputs`), scales by the
per-sample weights, accumulates in fp32 and reduces over ``BLOCK_L`` once after the loop.

Usage::

    out = forward(layout, weights, indices, offsets, None, pooling="sum",
                  output_dtype=torch.float32)       # [B, sum_f D_f]
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

from rocmtrain.platform import DeviceInfo, device_info

from .arch import ONEHOT_MAX_LEN, LaunchConfig, forward_candidates, forward_config
from .launch import Launcher
from .layout import TBELayout


@triton.jit
def _tbe_fwd_kernel(
    weights_ptr,
    indices_ptr,
    offsets_ptr,
    psw_ptr,
    out_ptr,
    f_woff_ptr,
    f_rows_ptr,
    f_dim_ptr,
    f_doff_ptr,
    feat_ptr,
    bad_ptr,
    B,
    out_stride,
    COUNT_BAD: tl.constexpr,
    HAS_PSW: tl.constexpr,
    MEAN: tl.constexpr,
    VEC: tl.constexpr,
    DIM: tl.constexpr,
    BAGS: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    pid_b = tl.program_id(0)
    f = tl.load(feat_ptr + tl.program_id(1))  # this launch's feature group (one-/multi-hot)
    pid_d = tl.program_id(2)
    if DIM > 0:  # every table has this dim: compile-time D (static masks, 16-byte loads)
        D = DIM
    else:
        D = tl.load(f_dim_ptr + f)
    woff = tl.load(f_woff_ptr + f)
    rows = tl.load(f_rows_ptr + f)
    doff = tl.load(f_doff_ptr + f)

    bags = pid_b * BAGS + tl.arange(0, BAGS)
    bag_mask = bags < B
    gbag = f.to(tl.int64) * B + bags
    start = tl.load(offsets_ptr + gbag, mask=bag_mask, other=0).to(tl.int64)
    end = tl.load(offsets_ptr + gbag + 1, mask=bag_mask, other=0).to(tl.int64)
    length = end - start
    max_len = tl.max(length, axis=0)

    ls = tl.arange(0, BLOCK_L)
    ds = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = (ds // VEC) < (D // VEC)  # == ds < D (VEC divides D); keeps masks VEC-constant
    acc = tl.zeros([BAGS, BLOCK_L, BLOCK_D], dtype=tl.float32)
    nbad = tl.zeros([BAGS, BLOCK_L], dtype=tl.int32)
    if PREFETCH:  # the first step's indices; each step then loads the next step's
        nxt = tl.load(indices_ptr + start[:, None] + ls[None, :],
                      mask=ls[None, :] < length[:, None], other=0)  # fmt: skip
    for l0 in range(0, max_len, BLOCK_L):
        pos = start[:, None] + l0 + ls[None, :]  # [BAGS, BLOCK_L]
        pmask = (l0 + ls[None, :]) < length[:, None]
        if PREFETCH:
            # issued before this step's row gathers, so the indices -> rows chain of the next
            # step does not wait for a fresh index load
            idx = nxt.to(tl.int64)
            nxt = tl.load(indices_ptr + pos + BLOCK_L,
                          mask=(l0 + BLOCK_L + ls[None, :]) < length[:, None], other=0)  # fmt: skip
        else:
            idx = tl.load(indices_ptr + pos, mask=pmask, other=0).to(tl.int64)
        valid = pmask & (idx >= 0) & (idx < rows)
        if COUNT_BAD:
            nbad += tl.where(pmask & ~valid, 1, 0)
        row = tl.multiple_of(woff + idx * D, [VEC, VEC])
        w = tl.load(
            weights_ptr + row[:, :, None] + ds[None, None, :],
            mask=valid[:, :, None] & dmask[None, None, :],
            other=0.0,
        ).to(tl.float32)
        if HAS_PSW:
            s = tl.load(psw_ptr + pos, mask=pmask, other=0.0).to(tl.float32)
            w = w * s[:, :, None]
        acc += w
    if COUNT_BAD:  # deferred bounds check: out-of-range ids were read as zeros, count them
        bad = tl.sum(tl.sum(nbad, axis=1), axis=0)
        if (pid_d == 0) & (bad > 0):
            tl.atomic_add(bad_ptr, bad)
    res = tl.sum(acc, axis=1)
    if MEAN:
        res = res / tl.maximum(length, 1).to(tl.float32)[:, None]
    out_ptrs = out_ptr + bags[:, None].to(tl.int64) * out_stride + doff + ds[None, :]
    tl.store(out_ptrs, res.to(out_ptr.dtype.element_ty), mask=bag_mask[:, None] & dmask[None, :])


_FWD = Launcher(_tbe_fwd_kernel)


def _vec(layout: TBELayout) -> int:
    """Largest power of two (<= 16) dividing every table's dim and offset: row-start alignment.

    Cached on the layout: this runs on every launch, and host time is the small-batch cost."""
    v = layout._meta_cache.get("vec")
    if v is None:
        g = 0
        for x in (*layout.table_dims, *layout.weights_offsets):
            g = math.gcd(g, x)
        v = layout._meta_cache["vec"] = max(1, min(16, g & -g))
    return v


def _uniform_dim(layout: TBELayout) -> int:
    """The dim when all tables share it (a compile-time constant for the kernels), else 0."""
    dims = set(layout.table_dims)
    return dims.pop() if len(dims) == 1 else 0


def cdiv(a: int, b: int) -> int:
    """Host-side ceil(a / b) for launch grids (``triton.cdiv`` is a constexpr function whose
    argument unwrapping costs microseconds per call on the launch path)."""
    return -(-a // b)


@functools.cache
def _device_info(index: int | None) -> DeviceInfo:
    """The device's description, read once per process: reading the properties costs host time
    on every call, and a ~75 us forward launched from a slower host path is host-bound."""
    return device_info(index or 0)


def _launch(cfg: LaunchConfig, layout, weights, indices, offsets, psw, out, pooling, B,
            feats=None, max_dim=None, bad_count=None):  # fmt: skip
    """One launch of ``cfg`` (the autotuner's and the benchmark's entry point)."""
    step = _launch_step(cfg, layout, weights, out, pooling, B, psw is not None, feats, max_dim)
    _run(step, layout.meta(weights.device), weights, indices, offsets, psw, out, B, bad_count)


def _launch_step(cfg: LaunchConfig, layout, weights, out, pooling, B, has_psw, feats=None,
                 max_dim=None) -> tuple:  # fmt: skip
    """What a launch of ``cfg`` needs beyond the call's tensors: ``(grid, feats, constexprs and
    launch options)``. Built once per launch plan (:func:`_plan`), not per call."""
    feats = _all_features(layout.num_features, weights.device) if feats is None else feats
    max_dim = max_dim or layout.max_dim
    grid = (cdiv(B, cfg.bags), feats.numel(), cdiv(max_dim, cfg.block_d))
    meta = dict(
        HAS_PSW=has_psw, MEAN=pooling == "mean", VEC=_vec(layout), DIM=_uniform_dim(layout),
        BAGS=cfg.bags, BLOCK_L=cfg.block_l, BLOCK_D=cfg.block_d, PREFETCH=cfg.prefetch,
        **cfg.launch_kwargs(),
    )  # fmt: skip
    return grid, feats, meta


def _run(step: tuple, meta, weights, indices, offsets, psw, out, B, bad_count) -> None:
    grid, feats, kw = step
    _FWD.run(
        grid,
        weights, indices, offsets, psw if psw is not None else weights, out,
        meta.weights_offset, meta.rows, meta.dim, meta.d_offsets, feats,
        bad_count if bad_count is not None else feats, B, out.stride(0),
        COUNT_BAD=bad_count is not None, **kw,
    )  # fmt: skip


_FEATS: dict[tuple, torch.Tensor] = {}


def _all_features(F: int, device: torch.device) -> torch.Tensor:
    key = (F, str(device))
    if key not in _FEATS:
        _FEATS[key] = torch.arange(F, dtype=torch.int32, device=device)
    return _FEATS[key]


def feature_groups(layout: TBELayout, pooling_factors, device) -> list[tuple]:
    """Split the features by mean bag length (``pooling_factors``, one per feature) into a
    one-hot and a multi-hot group, each launched with its own tile: ``[(feature ids tensor,
    mean length, max dim)]``. One group per class that has features."""
    dims = layout.feature_dims()
    groups = []
    for onehot in (True, False):
        fs = [f for f, L in enumerate(pooling_factors) if (L <= ONEHOT_MAX_LEN) == onehot]
        if fs:
            avg = sum(pooling_factors[f] for f in fs) / len(fs)
            ids = torch.tensor(fs, dtype=torch.int32, device=device)
            groups.append((ids, avg, max(dims[f] for f in fs)))
    return groups


def measured_pooling_factors(layout: TBELayout, offsets: torch.Tensor) -> list[float] | None:
    """Mean bag length per feature in this batch (one host read of ``F + 1`` offsets), or None
    for an empty batch."""
    B = layout.batch_size(offsets)
    if B == 0:
        return None
    bounds = offsets[::B].to(torch.float64).cpu()  # offsets of each feature's first bag, F + 1
    return ((bounds[1:] - bounds[:-1]) / B).tolist()


# (arch key, max_dim, L bucket, dtype, pooling, psw) -> chosen LaunchConfig
_TUNED: dict[tuple, LaunchConfig] = {}


def autotune_enabled(device: torch.device) -> bool:
    """First-call tile tuning on: a GPU, ``ROCMTRAIN_TBE_AUTOTUNE`` not 0, and no stream capture
    in progress (timing would break the caller's graph; the table's tile is used then)."""
    return (
        device.type == "cuda"
        and os.environ.get("ROCMTRAIN_TBE_AUTOTUNE", "1") != "0"
        and not torch.cuda.is_current_stream_capturing()
    )


def forward(
    layout: TBELayout,
    weights: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    *,
    pooling: str,
    output_dtype: torch.dtype,
    groups: list[tuple] | None = None,
    bad_count: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pooled lookup ``[B, sum_f D_f]`` in ``output_dtype`` (fp32 accumulation).

    ``bad_count`` (int32 [1] on the device): add the number of out-of-range / negative indices
    (read as zeros) to it, without a host sync (the module's deferred bounds check).

    ``groups`` (from :func:`feature_groups`): one launch per feature group with the arch's
    one-hot or multi-hot tile; None = one launch over all features, tiled for the batch's mean
    bag length. On a GPU the first call per (shape class, dtype) times the table's config
    against a few neighbours with ``triton.testing.do_bench`` and keeps the fastest (set
    ``ROCMTRAIN_TBE_AUTOTUNE=0`` to use the table's choice only).
    """
    B = layout.batch_size(offsets)
    out = torch.empty(B, layout.total_dim, dtype=output_dtype, device=weights.device)
    if B == 0:
        return out
    psw = per_sample_weights.contiguous() if per_sample_weights is not None else None
    steps, meta = _plan(layout, weights, indices, offsets, psw, out, pooling, B, groups)
    for step in steps:
        _run(step, meta, weights, indices, offsets, psw, out, B, bad_count)
    return out


_MAX_PLANS = 64  # per layout; more distinct batch shapes than this start the cache afresh


def _plan(layout, weights, indices, offsets, psw, out, pooling, B, groups) -> tuple[list, object]:
    """The launches of one forward call and the layout's metadata tensors on the device.

    Cached on the layout per (device, dtypes, pooling, psw, B, groups; without groups the bag
    length class): a call that hits runs no tile lookup, grid or constexpr arithmetic, which
    at B=16K is most of the host time of a ~70 us kernel's call. A plan is kept only when every
    tile in it is final: tuned on this GPU, or a CPU's table choice (during a graph capture or
    with tuning off, the table's untuned tile is used and the next eager call tunes)."""
    dev = weights.device
    avg_len = indices.numel() / max(1, B * layout.num_features)
    # a cached plan holds its groups list, so that list's id is never reused while it is a key
    key = (dev, weights.dtype, out.dtype, pooling, psw is not None, B, id(groups),
           _pow2_bucket(avg_len) if groups is None else None)  # fmt: skip
    plans = layout._meta_cache.setdefault("fwd_plans", {})
    hit = plans.get(key)
    if hit is not None:
        return hit[1], hit[2]
    info = _device_info(dev.index)
    elem = weights.element_size()
    todo = [(None, avg_len, layout.max_dim)] if groups is None else groups
    steps, final = [], True
    for feats, avg_len, max_dim in todo:
        tkey = (info.arch, max_dim, _pow2_bucket(avg_len), _pow2_bucket(B), weights.dtype,
                pooling, psw is not None, out.dtype)  # fmt: skip
        cfg = _TUNED.get(tkey)
        if cfg is None:  # only a tuned choice is kept
            kw = dict(max_dim=max_dim, avg_len=avg_len, elem_bytes=elem)
            if autotune_enabled(dev):
                cfg = _TUNED[tkey] = fastest(
                    forward_candidates(info, **kw),
                    lambda c, f=feats, d=max_dim: _launch(
                        c, layout, weights, indices, offsets, psw, out, pooling, B, f, d
                    ),
                )
            else:
                cfg = forward_config(info, **kw)
                final = final and dev.type != "cuda"
        steps.append(_launch_step(cfg, layout, weights, out, pooling, B, psw is not None,
                                  feats, max_dim))  # fmt: skip
    meta = layout.meta(dev)
    if final:
        if len(plans) >= _MAX_PLANS:
            plans.clear()
        plans[key] = (groups, steps, meta)
    return steps, meta


def _pow2_bucket(x: float) -> int:
    return 1 << max(0, round(math.log2(max(x, 1.0))))


def fastest(cands: list[LaunchConfig], run) -> LaunchConfig:
    """The candidate for which ``run(cfg)`` (one launch, no side effects that a repeat changes)
    takes the least median time (``triton.testing.do_bench``); ties keep the earlier one."""
    best, best_ms = cands[0], float("inf")
    for cfg in cands:
        ms = triton.testing.do_bench(lambda cfg=cfg: run(cfg), warmup=5, rep=20,
                                     return_mode="median")  # fmt: skip
        if ms < best_ms:
            best, best_ms = cfg, ms
    return best
