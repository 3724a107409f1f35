"""Triton backward of table-batched embedding bags, fused with the optimizer update.

No dense ``[rows, D]`` gradient and no atomics on the common path:

1. torch ops: key every index position by its global row (``row_offset[table] + index``), sort
   (stable in deterministic mode), mark segment starts, cut each segment into chunks of at most
   ``hot_chunk`` positions (one host sync: the chunk count).
2. ``_bwd_chunk_kernel``, one program per chunk: sums the chunk's gradient rows (``grad_out`` row
   of its bag x per-sample weight x 1/len for MEAN) in fp32, writes d per_sample_weights, and -
   when the chunk is the row's whole segment - applies SGD / rowwise Adagrad / Adam to the row
   and stores it (stochastic rounding for fp16/bf16). Chunks of a hot row instead write fp32
   partials (deterministic: one slot per chunk; otherwise ``atomic_add(sem="relaxed")`` into one
   fp32 slot per hot row).
3. ``_bwd_hot_kernel``, one program per hot row: adds its partials in chunk order and applies the
   same update. A row seen 1e5 times costs ~400 parallel chunk programs, not one serial loop.

Usage (what the module calls)::

    dpsw = backward_update(layout, weights, states, grad_out, indices, offsets, psw,
                           pooling="sum", spec=spec, step=1, stochastic_rounding=True,
                           need_psw_grad=False, deterministic=False, seed=0)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .arch import backward_config
from .layout import TBELayout
from .optim import OptimizerSpec
from .reference import bag_ids
from .tbe_forward import _device_info

_OPT_CODE = {"sgd": 0, "rowwise_adagrad": 1, "adam": 2}


@triton.jit
def _update_rows(
    weights_ptr, mom_ptr, m1_ptr, m2_ptr, key, wrow, ds, rmask, D, w, g,
    lr, eps, beta1, beta2, wd, c1, c2, seed,
    OPT: tl.constexpr, SR: tl.constexpr, SR_DROP: tl.constexpr,
):  # fmt: skip
    """Update rows ``[C, BLOCK_D]`` (``rmask`` [C] selects rows) from fp32 ``w`` and summed ``g``.

    Stores the weights (stochastic rounding if ``SR``) and the fp32 optimizer state.
    """
    m = rmask[:, None] & (ds[None, :] < D[:, None])
    ptr = wrow[:, None] + ds[None, :]
    if OPT == 0:
        new = w - lr * (g + wd * w)
    elif OPT == 1:
        gw = tl.where(m, g + wd * w, 0.0)
        mom = tl.load(mom_ptr + key, mask=rmask, other=0.0)
        mom += tl.sum(gw * gw, axis=1) / tl.maximum(D, 1).to(tl.float32)
        tl.store(mom_ptr + key, mom, mask=rmask)
        new = w - lr * gw / (tl.sqrt(mom) + eps)[:, None]
    else:
        m1 = tl.load(m1_ptr + ptr, mask=m, other=0.0) * beta1 + (1.0 - beta1) * g
        m2 = tl.load(m2_ptr + ptr, mask=m, other=0.0) * beta2 + (1.0 - beta2) * g * g
        tl.store(m1_ptr + ptr, m1, mask=m)
        tl.store(m2_ptr + ptr, m2, mask=m)
        new = w - lr * ((m1 / c1) / (tl.sqrt(m2 / c2) + eps) + wd * w)
    if SR:
        # add uniform noise below the target mantissa, truncate: E[stored] == new
        low: tl.constexpr = (1 << SR_DROP) - 1
        bits = new.to(tl.int32, bitcast=True)
        rnd = tl.randint(seed, ptr.to(tl.int32)).to(tl.int32, bitcast=True)
        rounded = ((bits + (rnd & low)) & ~low).to(tl.float32, bitcast=True)
        new = tl.where(tl.abs(new) < float("inf"), rounded, new)
    tl.store(weights_ptr + ptr, new.to(weights_ptr.dtype.element_ty), mask=m)


@triton.jit
def _row_of(sorted_keys_ptr, sorted_bag_ptr, start, cm, B, total_rows,
            f_woff_ptr, f_roff_ptr, f_dim_ptr):  # fmt: skip
    """Global row key, validity, dim and flat weight offset of the chunks starting at ``start``."""
    key = tl.load(sorted_keys_ptr + start, mask=cm, other=total_rows).to(tl.int64)
    kv = cm & (key < total_rows)  # the sentinel key marks out-of-range indices: no update
    f0 = tl.load(sorted_bag_ptr + start, mask=kv, other=0) // B
    D = tl.load(f_dim_ptr + f0, mask=kv, other=0)
    wrow = (
        tl.load(f_woff_ptr + f0, mask=kv, other=0)
        + (key - tl.load(f_roff_ptr + f0, mask=kv, other=0)) * D
    )
    return key, kv, D, wrow


@triton.jit
def _bwd_chunk_kernel(
    weights_ptr, mom_ptr, m1_ptr, m2_ptr, go_ptr, go_stride,
    sorted_keys_ptr, sorted_bag_ptr, perm_ptr, psw_ptr, inv_len_ptr, dpsw_ptr,
    chunk_start_ptr, slot_ptr, partial_ptr, n_chunks, N, B, total_rows,
    f_woff_ptr, f_roff_ptr, f_dim_ptr, f_doff_ptr,
    lr, eps, beta1, beta2, wd, c1, c2, seed,
    OPT: tl.constexpr, SR: tl.constexpr, SR_DROP: tl.constexpr, HAS_PSW: tl.constexpr,
    MEAN: tl.constexpr, NEED_DPSW: tl.constexpr, DETERMINISTIC: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    cs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cs < n_chunks
    start = tl.load(chunk_start_ptr + cs, mask=cm, other=0)
    end = tl.load(chunk_start_ptr + cs + 1, mask=cs + 1 < n_chunks, other=N)
    key, kv, D, wrow = _row_of(sorted_keys_ptr, sorted_bag_ptr, start, cm, B, total_rows,
                               f_woff_ptr, f_roff_ptr, f_dim_ptr)  # fmt: skip
    length = tl.where(kv, end - start, 0)
    slot = tl.load(slot_ptr + cs, mask=kv, other=-1)
    ds = tl.arange(0, BLOCK_D)
    dm = kv[:, None] & (ds[None, :] < D[:, None])
    w = tl.load(weights_ptr + wrow[:, None] + ds[None, :], mask=dm, other=0.0).to(tl.float32)
    ps = tl.arange(0, BLOCK_P)
    acc = tl.zeros([BLOCK_C, BLOCK_P, BLOCK_D], dtype=tl.float32)
    for l0 in range(0, tl.max(length, axis=0), BLOCK_P):
        p = start[:, None] + l0 + ps[None, :]  # [C, P] sorted positions
        pm = (l0 + ps[None, :]) < length[:, None]
        bag = tl.load(sorted_bag_ptr + p, mask=pm, other=0)
        f = bag // B
        b = (bag - f * B).to(tl.int64)
        doff = tl.load(f_doff_ptr + f, mask=pm, other=0)
        g = tl.load(
            go_ptr + b[:, :, None] * go_stride + doff[:, :, None] + ds[None, None, :],
            mask=pm[:, :, None] & dm[:, None, :],
            other=0.0,
        ).to(tl.float32)
        if MEAN:
            g = g * tl.load(inv_len_ptr + bag, mask=pm, other=0.0)[:, :, None]
        if NEED_DPSW or HAS_PSW:
            orig = tl.load(perm_ptr + p, mask=pm, other=0)
        if NEED_DPSW:
            tl.store(dpsw_ptr + orig, tl.sum(g * w[:, None, :], axis=2), mask=pm)
        if HAS_PSW:
            g = g * tl.load(psw_ptr + orig, mask=pm, other=0.0).to(tl.float32)[:, :, None]
        acc += g
    gsum = tl.sum(acc, axis=1)
    _update_rows(weights_ptr, mom_ptr, m1_ptr, m2_ptr, key, wrow, ds, kv & (slot < 0), D, w,
                 gsum, lr, eps, beta1, beta2, wd, c1, c2, seed, OPT, SR, SR_DROP)  # fmt: skip
    hot = dm & (slot >= 0)[:, None]
    pptr = partial_ptr + slot.to(tl.int64)[:, None] * BLOCK_D + ds[None, :]
    if DETERMINISTIC:
        tl.store(pptr, gsum, mask=hot)
    else:
        tl.atomic_add(pptr, gsum, mask=hot, sem="relaxed")


@triton.jit
def _bwd_hot_kernel(
    weights_ptr, mom_ptr, m1_ptr, m2_ptr,
    sorted_keys_ptr, sorted_bag_ptr, chunk_start_ptr, slot_ptr, partial_ptr,
    hot_chunk_ptr, hot_nch_ptr, n_hot, B, total_rows,
    f_woff_ptr, f_roff_ptr, f_dim_ptr,
    lr, eps, beta1, beta2, wd, c1, c2, seed,
    OPT: tl.constexpr, SR: tl.constexpr, SR_DROP: tl.constexpr,
    DETERMINISTIC: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    hs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    c0 = tl.load(hot_chunk_ptr + hs, mask=hs < n_hot, other=-1)
    cm = c0 >= 0
    start = tl.load(chunk_start_ptr + c0, mask=cm, other=0)
    key, kv, D, wrow = _row_of(sorted_keys_ptr, sorted_bag_ptr, start, cm, B, total_rows,
                               f_woff_ptr, f_roff_ptr, f_dim_ptr)  # fmt: skip
    slot0 = tl.load(slot_ptr + c0, mask=kv, other=0).to(tl.int64)
    ds = tl.arange(0, BLOCK_D)
    dm = kv[:, None] & (ds[None, :] < D[:, None])
    w = tl.load(weights_ptr + wrow[:, None] + ds[None, :], mask=dm, other=0.0).to(tl.float32)
    pptr = partial_ptr + slot0[:, None] * BLOCK_D + ds[None, :]
    if DETERMINISTIC:
        nch = tl.load(hot_nch_ptr + hs, mask=kv, other=0)
        g = tl.zeros([BLOCK_C, BLOCK_D], dtype=tl.float32)
        for i in range(0, tl.max(nch, axis=0)):  # fixed order: bitwise repeatable
            g += tl.load(pptr + i * BLOCK_D, mask=dm & (i < nch)[:, None], other=0.0)
    else:
        g = tl.load(pptr, mask=dm, other=0.0)
    _update_rows(weights_ptr, mom_ptr, m1_ptr, m2_ptr, key, wrow, ds, kv, D, w, g,
                 lr, eps, beta1, beta2, wd, c1, c2, seed, OPT, SR, SR_DROP)  # fmt: skip


def backward_update(
    layout: TBELayout,
    weights: torch.Tensor,
    states: dict[str, torch.Tensor],
    grad_out: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    *,
    pooling: str,
    spec: OptimizerSpec,
    step: int,
    stochastic_rounding: bool,
    need_psw_grad: bool,
    deterministic: bool,
    seed: int,
) -> torch.Tensor | None:
    """Apply the fused optimizer to the rows touched by this batch; return d per_sample_weights."""
    B = layout.batch_size(offsets)
    N = indices.numel()
    dev = weights.device
    dpsw = torch.zeros(N, dtype=torch.float32, device=dev) if need_psw_grad else None
    if N == 0 or B == 0:
        return dpsw
    meta = layout.meta(dev)
    info = _device_info(dev.index)
    total_rows = layout.total_rows

    # 1. sort positions by global row; chunk segments
    bags = bag_ids(offsets, N)
    feat = torch.div(bags, B, rounding_mode="floor")
    idx = indices.long()
    valid = (idx >= 0) & (idx < meta.rows[feat])
    keys = torch.where(valid, meta.row_offset[feat] + idx, total_rows)
    if total_rows < 2**31 - 1:
        keys = keys.to(torch.int32)  # halves the radix sort's passes
    sorted_keys, perm = torch.sort(keys, stable=deterministic)
    sorted_bag = bags[perm]
    if layout.num_features * B < 2**31 - 1:
        sorted_bag = sorted_bag.to(torch.int32)
    flag = torch.ones(N, dtype=torch.bool, device=dev)
    flag[1:] = sorted_keys[1:] != sorted_keys[:-1]
    pos = torch.arange(N, device=dev)
    seg_start = torch.cummax(torch.where(flag, pos, 0), dim=0).values
    cfg, chunk = backward_config(info, max_dim=layout.max_dim, avg_segment=1.0)
    chunk_starts = torch.nonzero((pos - seg_start) % chunk == 0).flatten()  # host sync
    n_chunks = chunk_starts.numel()
    cfg, _ = backward_config(info, max_dim=layout.max_dim, avg_segment=N / n_chunks)

    chunk_first = flag[chunk_starts]
    single = chunk_first.clone()
    single[:-1] &= chunk_first[1:]
    in_hot = ~single
    hot_first = chunk_first & in_hot
    max_hot = N // chunk + 1  # a hot row has > chunk positions
    if deterministic:
        slot = torch.where(in_hot, torch.cumsum(in_hot, 0) - 1, -1)
        partial_rows = min(n_chunks, 2 * max_hot)
        partial = torch.empty(partial_rows, cfg.block_d, dtype=torch.float32, device=dev)
    else:
        slot = torch.where(in_hot, torch.cumsum(hot_first, 0) - 1, -1)
        partial = torch.zeros(max_hot, cfg.block_d, dtype=torch.float32, device=dev)
    slot = slot.to(torch.int32)

    # 2. per-chunk segment reduce + fused update
    opt = dict(
        lr=spec.lr, eps=spec.eps, beta1=spec.beta1, beta2=spec.beta2, wd=spec.weight_decay,
        c1=1.0 - spec.beta1**step, c2=1.0 - spec.beta2**step, seed=int(seed),
        OPT=_OPT_CODE[spec.kind], SR=bool(stochastic_rounding and weights.dtype != torch.float32),
        SR_DROP=16 if weights.dtype == torch.bfloat16 else 13,
    )  # fmt: skip
    dummy = torch.empty(1, dtype=torch.float32, device=dev)
    mom = states.get("momentum", dummy)
    m1 = states.get("exp_avg", dummy)
    m2 = states.get("exp_avg_sq", dummy)
    go = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
    inv_len = None
    if pooling == "mean":
        lengths = (offsets[1:] - offsets[:-1]).to(torch.float32)
        inv_len = 1.0 / lengths.clamp(min=1.0)
    psw = per_sample_weights
    kw = cfg.launch_kwargs()
    _bwd_chunk_kernel[(triton.cdiv(n_chunks, cfg.bags),)](
        weights, mom, m1, m2, go, go.stride(0),
        sorted_keys, sorted_bag, perm, psw if psw is not None else dummy,
        inv_len if inv_len is not None else dummy, dpsw if dpsw is not None else dummy,
        chunk_starts, slot, partial, n_chunks, N, B, total_rows,
        meta.weights_offset, meta.row_offset, meta.dim, meta.d_offsets,
        HAS_PSW=psw is not None, MEAN=inv_len is not None, NEED_DPSW=dpsw is not None,
        DETERMINISTIC=deterministic, BLOCK_C=cfg.bags, BLOCK_P=cfg.block_l,
        BLOCK_D=cfg.block_d, **opt, **kw,
    )  # fmt: skip

    # 3. hot rows: combine partials, update (skipped when no row can be hot)
    if N > chunk:
        hot_chunks = torch.nonzero_static(hot_first, size=max_hot, fill_value=-1).flatten()
        hot_nch = None
        if deterministic:
            cidx = torch.arange(n_chunks, device=dev)
            first_idx = torch.where(chunk_first, cidx, n_chunks)
            nxt = torch.cat([first_idx[1:], first_idx.new_full((1,), n_chunks)])
            nxt = torch.flip(torch.cummin(torch.flip(nxt, [0]), dim=0).values, [0])
            hot_nch = (nxt - cidx)[hot_chunks.clamp(min=0)].to(torch.int32)
        hot_cfg = backward_config(info, max_dim=layout.max_dim, avg_segment=1.0)[0]
        _bwd_hot_kernel[(triton.cdiv(max_hot, hot_cfg.bags),)](
            weights, mom, m1, m2, sorted_keys, sorted_bag, chunk_starts, slot, partial,
            hot_chunks, hot_nch if hot_nch is not None else slot, max_hot, B, total_rows,
            meta.weights_offset, meta.row_offset, meta.dim,
            DETERMINISTIC=deterministic, BLOCK_C=hot_cfg.bags, BLOCK_D=cfg.block_d, **opt, **kw,
        )  # fmt: skip
    return dpsw
