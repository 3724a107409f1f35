"""Triton backward of table-batched embedding bags, fused with the optimizer update.

No dense ``[rows, D]`` gradient, no float atomics, no host sync:

1. ``_keys_kernel``: every index position gets its global row key ``row_offset[table] + index``
   (a sentinel past the last row for out-of-range indices); ``torch.sort`` groups equal rows
   (stable in deterministic mode: a row's occurrences are then summed in input order).
2. ``_flags_kernel`` + ``torch.nonzero_static``: chunk starts = segment starts plus every
   ``CHUNK``-th sorted position, so no chunk is longer than ``CHUNK`` positions.
3. ``_bwd_chunk_kernel``, ``BLOCK_C`` chunks per program: sums each chunk's gradient rows
   (``grad_out`` row of its bag x per-sample weight x 1/len for MEAN) in fp32, writes
   d per_sample_weights, and - when the chunk is its row's whole segment (the common case) -
   applies SGD / rowwise Adagrad / Adam and stores the row (stochastic rounding for fp16/bf16).
   A chunk of a longer ("hot") segment writes an fp32 partial to slot ``2*tile + (not at tile
   start)`` instead (``tile = start // CHUNK``; at most two such chunks per tile).
4. ``_bwd_hot_kernel``, one lane per tile: the tile holding a hot segment's last chunk adds the
   segment's partials (walking back tile by tile, fixed order) and applies the update. A row seen
   1e5 times is ~400 parallel chunk programs plus one 400-step sum, never a serial loop over 1e5.

Usage (what the module calls)::

    dpsw = backward_update(layout, weights, states, grad_out, indices, offsets, psw,
                           pooling="sum", spec=spec, step=1, stochastic_rounding=True,
                           need_psw_grad=False, deterministic=False, seed=0)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .arch import backward_config, forward_config
from .layout import TBELayout
from .optim import OptimizerSpec
from .tbe_forward import _device_info, _uniform_dim, _vec

_OPT_CODE = {"sgd": 0, "rowwise_adagrad": 1, "adam": 2}


@triton.jit
def _update_rows(
    weights_ptr, mom_ptr, m1_ptr, m2_ptr, key, wrow, ds, rmask, D, w, g,
    lr, eps, beta1, beta2, wd, c1, c2, seed,
    OPT: tl.constexpr, SR: tl.constexpr, SR_DROP: tl.constexpr, VEC: tl.constexpr,
):  # fmt: skip
    """Update rows ``[C, BLOCK_D]`` (``rmask`` [C] selects rows) from fp32 ``w`` and summed ``g``.

    Stores the weights (stochastic rounding if ``SR``) and the fp32 optimizer state.
    """
    m = rmask[:, None] & ((ds[None, :] // VEC) < (D[:, None] // VEC))  # VEC | D: vector masks
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
        bits = new.to(tl.int32, bitcast=True)
        rnd = tl.randint(seed, ptr.to(tl.int32)).to(tl.int32, bitcast=True)
        noise = rnd & ((1 << SR_DROP) - 1)
        rounded = ((bits + noise) & (-(1 << SR_DROP))).to(tl.float32, bitcast=True)
        new = tl.where(tl.abs(new) < float("inf"), rounded, new)
    tl.store(weights_ptr + ptr, new.to(weights_ptr.dtype.element_ty), mask=m)


@triton.jit
def _load_rows(
    weights_ptr, f_woff_ptr, f_roff_ptr, f_dim_ptr, key, f0, rmask,
    N_ROWS: tl.constexpr, VEC: tl.constexpr, DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Rows ``key`` of features ``f0`` ([N_ROWS] each, ``rmask`` selects): their dims ``D``, flat
    weight offsets ``wrow``, the column range ``ds``, the element mask ``dm`` and the rows in fp32."""
    if DIM > 0:  # every table has this dim: compile-time D (static masks, 16-byte accesses)
        D = tl.full([N_ROWS], DIM, tl.int32)
    else:
        D = tl.load(f_dim_ptr + f0, mask=rmask, other=0)
    wrow = (
        tl.load(f_woff_ptr + f0, mask=rmask, other=0)
        + (key - tl.load(f_roff_ptr + f0, mask=rmask, other=0)) * D
    )
    wrow = tl.multiple_of(wrow, VEC)
    ds = tl.arange(0, BLOCK_D)
    dm = rmask[:, None] & ((ds[None, :] // VEC) < (D[:, None] // VEC))
    w = tl.load(weights_ptr + wrow[:, None] + ds[None, :], mask=dm, other=0.0).to(tl.float32)
    return D, wrow, ds, dm, w


@triton.jit
def _keys_kernel(
    indices_ptr, offsets_ptr, keys_ptr, bags_ptr, f_rows_ptr, f_roff_ptr, B, F, total_rows,
    BAGS: tl.constexpr, BLOCK_L: tl.constexpr,
):  # fmt: skip
    """keys[p] = global row of position p (sentinel total_rows if out of range); bags[p] = f*B+b."""
    gbag = tl.program_id(0) * BAGS + tl.arange(0, BAGS)
    gm = gbag < F * B
    f = gbag // B
    start = tl.load(offsets_ptr + gbag, mask=gm, other=0).to(tl.int64)
    length = tl.load(offsets_ptr + gbag + 1, mask=gm, other=0).to(tl.int64) - start
    rows = tl.load(f_rows_ptr + f, mask=gm, other=0)
    roff = tl.load(f_roff_ptr + f, mask=gm, other=0)
    ls = tl.arange(0, BLOCK_L)
    for l0 in range(0, tl.max(length, axis=0), BLOCK_L):
        pos = start[:, None] + l0 + ls[None, :]
        pm = (l0 + ls[None, :]) < length[:, None]
        idx = tl.load(indices_ptr + pos, mask=pm, other=0).to(tl.int64)
        ok = (idx >= 0) & (idx < rows[:, None])
        key = tl.where(ok, roff[:, None] + idx, total_rows)
        tl.store(keys_ptr + pos, key.to(keys_ptr.dtype.element_ty), mask=pm)
        tl.store(bags_ptr + pos, (gbag[:, None] + 0 * pos).to(bags_ptr.dtype.element_ty), mask=pm)


@triton.jit
def _flags_kernel(keys_ptr, flags_ptr, N, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """flags[p] = p starts a chunk: a new row, or every CHUNK-th position."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = p < N
    k = tl.load(keys_ptr + p, mask=m, other=0)
    kp = tl.load(keys_ptr + p - 1, mask=m & (p > 0), other=0)
    tl.store(flags_ptr + p, (((p % CHUNK) == 0) | (k != kp)).to(tl.int8), mask=m)


@triton.jit
def _bwd_chunk_kernel(
    weights_ptr, mom_ptr, m1_ptr, m2_ptr, go_ptr, go_stride,
    sorted_keys_ptr, perm_ptr, sorted_bags_ptr, offsets_ptr, psw_ptr, dpsw_ptr,
    chunk_start_ptr, n_rows, partial_ptr, N, B, total_rows,
    f_woff_ptr, f_roff_ptr, f_dim_ptr, f_doff_ptr,
    lr, eps, beta1, beta2, wd, c1, c2, seed,
    OPT: tl.constexpr, SR: tl.constexpr, SR_DROP: tl.constexpr, HAS_PSW: tl.constexpr,
    MEAN: tl.constexpr, NEED_DPSW: tl.constexpr, CHUNK: tl.constexpr,
    VEC: tl.constexpr, DIM: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """BLOCK_C consecutive chunks; their sorted positions are one contiguous range, walked
    BLOCK_P positions per step (work follows positions, so long chunks do not serialise)."""
    cs = tl.program_id(0).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    start = tl.load(chunk_start_ptr + cs, mask=cs < n_rows, other=N)  # GPU: padded with N
    cm = start < N
    if tl.max(cm.to(tl.int32), axis=0) > 0:  # grid is sized by N: padding programs exit
        end = tl.load(chunk_start_ptr + cs + 1, mask=cs + 1 < n_rows, other=N)
        key = tl.load(sorted_keys_ptr + start, mask=cm, other=total_rows).to(tl.int64)
        kv = cm & (key < total_rows)  # the sentinel key marks out-of-range indices: no update
        # does the chunk begin / end its row's segment?
        kprev = tl.load(sorted_keys_ptr + start - 1, mask=kv & (start > 0), other=-1).to(tl.int64)
        knext = tl.load(sorted_keys_ptr + end, mask=kv & (end < N), other=-1).to(tl.int64)
        single = (kprev != key) & (knext != key)
        slot = 2 * (start // CHUNK) + ((start % CHUNK) != 0).to(tl.int64)
        f0 = tl.load(sorted_bags_ptr + start, mask=kv, other=0) // B
        D, wrow, ds, dm, w = _load_rows(weights_ptr, f_woff_ptr, f_roff_ptr, f_dim_ptr, key, f0,
                                        kv, BLOCK_C, VEC, DIM, BLOCK_D)  # fmt: skip
        qs = tl.arange(0, BLOCK_P)
        acc = tl.zeros([BLOCK_C, BLOCK_D], dtype=tl.float32)
        pstart = tl.min(start, axis=0)
        pend = tl.max(tl.where(cm, end, 0), axis=0)
        for q0 in range(pstart, pend, BLOCK_P):
            q = q0 + qs  # sorted positions
            own = (q[None, :] >= start[:, None]) & (q[None, :] < end[:, None]) & kv[:, None]
            qv = tl.max(own.to(tl.int32), axis=0) > 0  # [P]: position of a valid chunk
            bag = tl.load(sorted_bags_ptr + q, mask=qv, other=0)
            f = bag // B
            b = (bag - f * B).to(tl.int64)
            doff = tl.multiple_of(tl.load(f_doff_ptr + f, mask=qv, other=0), VEC)
            if DIM > 0:
                dq = tl.full([BLOCK_P], DIM, tl.int32)
            else:
                dq = tl.load(f_dim_ptr + f, mask=qv, other=0)
            g = tl.load(
                go_ptr + b[:, None] * go_stride + doff[:, None] + ds[None, :],
                mask=qv[:, None] & ((ds[None, :] // VEC) < (dq[:, None] // VEC)),
                other=0.0,
            ).to(tl.float32)  # [P, D]
            if MEAN:
                n = tl.load(offsets_ptr + bag + 1, mask=qv, other=1) - tl.load(
                    offsets_ptr + bag, mask=qv, other=0
                )
                g = g / tl.maximum(n, 1).to(tl.float32)[:, None]
            sel = own.to(tl.float32)[:, :, None]  # [C, P, 1] one-hot: position -> its chunk
            if NEED_DPSW or HAS_PSW:
                orig = tl.load(perm_ptr + q, mask=qv, other=0)
            if NEED_DPSW:
                wq = tl.sum(sel * w[:, None, :], axis=0)  # [P, D] the row each position read
                tl.store(dpsw_ptr + orig, tl.sum(g * wq, axis=1), mask=qv)
            if HAS_PSW:
                g = g * tl.load(psw_ptr + orig, mask=qv, other=0.0).to(tl.float32)[:, None]
            acc += tl.sum(sel * g[None, :, :], axis=1)
        _update_rows(weights_ptr, mom_ptr, m1_ptr, m2_ptr, key, wrow, ds, kv & single, D, w,
                     acc, lr, eps, beta1, beta2, wd, c1, c2, seed, OPT, SR, SR_DROP, VEC)  # fmt: skip
        pptr = partial_ptr + slot[:, None] * BLOCK_D + ds[None, :]
        tl.store(pptr, acc, mask=dm & (~single)[:, None])


@triton.jit
def _bwd_hot_kernel(
    weights_ptr, mom_ptr, m1_ptr, m2_ptr, sorted_keys_ptr, sorted_bags_ptr, partial_ptr,
    N, B, total_rows, f_woff_ptr, f_roff_ptr, f_dim_ptr,
    lr, eps, beta1, beta2, wd, c1, c2, seed,
    OPT: tl.constexpr, SR: tl.constexpr, SR_DROP: tl.constexpr, CHUNK: tl.constexpr,
    VEC: tl.constexpr, DIM: tl.constexpr,
    NBITS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Program t owns the hot segment (longer than one tile) whose last chunk starts at tile
    t's first position: binary-search the segment start, add its partials BLOCK_T at a time in
    tile order (deterministic), update the row."""
    t = tl.program_id(0) + tl.zeros([1], dtype=tl.int64)  # [1]-vectors keep one code path
    p0 = t * CHUNK
    tm = (p0 < N) & (p0 > 0)
    key = tl.load(sorted_keys_ptr + p0, mask=tm, other=total_rows).to(tl.int64)
    kv = tm & (key < total_rows)
    kprev = tl.load(sorted_keys_ptr + p0 - 1, mask=kv, other=-1).to(tl.int64)
    knext = tl.load(sorted_keys_ptr + p0 + CHUNK, mask=kv & (p0 + CHUNK < N), other=-1)
    own = kv & (kprev == key) & (knext.to(tl.int64) != key)
    if tl.max(own.to(tl.int32), axis=0) > 0:  # most tiles own no hot row: exit early
        lo = p0 * 0
        hi = tl.where(own, p0, 0)
        for _ in range(NBITS):  # lower_bound(key) in sorted_keys[0:p0]
            srch = lo < hi
            mid = (lo + hi) // 2
            km = tl.load(sorted_keys_ptr + mid, mask=srch, other=0).to(tl.int64)
            right = km < key
            lo = tl.where(srch & right, mid + 1, lo)
            hi = tl.where(srch & ~right, mid, hi)
        ts = (
            lo // CHUNK
        )  # first tile of the segment; its chunk there is slot 2*ts + (lo % CHUNK != 0)
        f0 = tl.load(sorted_bags_ptr + p0, mask=own, other=0) // B
        D, wrow, ds, dm, w = _load_rows(weights_ptr, f_woff_ptr, f_roff_ptr, f_dim_ptr, key, f0,
                                        own, 1, VEC, DIM, BLOCK_D)  # fmt: skip
        g = tl.zeros([BLOCK_D], dtype=tl.float32)
        js = tl.arange(0, BLOCK_T)
        first = tl.max(tl.where(own, ts, t + 1), axis=0)
        last = tl.max(t, axis=0)
        mid_start = tl.max(((lo % CHUNK) != 0).to(tl.int32), axis=0) != 0
        for j0 in range(first, last + 1, BLOCK_T):
            j = j0 + js
            slot = 2 * j + ((j == first) & mid_start).to(tl.int64)
            g += tl.sum(tl.load(partial_ptr + slot[:, None] * BLOCK_D + ds[None, :],
                                mask=(j <= last)[:, None] & dm,
                                other=0.0), axis=0)  # fmt: skip
        _update_rows(weights_ptr, mom_ptr, m1_ptr, m2_ptr, key, wrow, ds, own, D, w, g[None, :],
                     lr, eps, beta1, beta2, wd, c1, c2, seed, OPT, SR, SR_DROP, VEC)  # fmt: skip


def _nonzero_padded(flags: torch.Tensor, n: int) -> torch.Tensor:
    """Positions of True, padded with ``n`` to length ``n`` (no host sync where supported)."""
    try:
        return torch.nonzero_static(flags, size=n, fill_value=n).flatten()
    except (NotImplementedError, RuntimeError):  # older torch without a device kernel
        idx = torch.nonzero(flags).flatten()
        return torch.cat([idx, idx.new_full((n - idx.numel(),), n)])


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
    F = layout.num_features
    dev = weights.device
    dpsw = torch.zeros(N, dtype=torch.float32, device=dev) if need_psw_grad else None
    if N == 0 or B == 0:
        return dpsw
    meta = layout.meta(dev)
    info = _device_info(dev.index)
    total_rows = layout.total_rows
    cfg, chunk = backward_config(info, max_dim=layout.max_dim)

    # 1. global row key per position, sort
    kdtype = torch.int32 if total_rows < 2**31 - 1 else torch.int64  # int32: half the sort passes
    keys = torch.empty(N, dtype=kdtype, device=dev)
    bags = torch.empty(N, dtype=torch.int32 if F * B < 2**31 else torch.int64, device=dev)
    kcfg = forward_config(info, max_dim=1, avg_len=N / (F * B), elem_bytes=4)
    _keys_kernel[(triton.cdiv(F * B, kcfg.bags),)](
        indices, offsets, keys, bags, meta.rows, meta.row_offset, B, F, total_rows,
        BAGS=kcfg.bags, BLOCK_L=kcfg.block_l, num_warps=kcfg.num_warps,
    )  # fmt: skip
    sorted_keys, perm = torch.sort(keys, stable=deterministic)
    sorted_bags = bags[perm]  # one parallel gather; spares the kernels a dependent load

    # 2. chunk starts (padded with N: no host sync)
    flags = torch.empty(N, dtype=torch.int8, device=dev)
    _flags_kernel[(triton.cdiv(N, 1024),)](sorted_keys, flags, N, CHUNK=chunk, BLOCK=1024)
    if dev.type == "cuda":
        chunk_starts = _nonzero_padded(flags, N)
    else:  # interpreter: the sync is free; an exact grid and tile save empty programs
        chunk_starts = torch.nonzero(flags).flatten()
    n_rows = chunk_starts.numel()
    n_tiles = triton.cdiv(N, chunk)
    partial = torch.empty(2 * n_tiles, cfg.block_d, dtype=torch.float32, device=dev)

    # 3. per-chunk segment reduce + fused update
    opt = dict(
        lr=spec.lr, eps=spec.eps, beta1=spec.beta1, beta2=spec.beta2, wd=spec.weight_decay,
        c1=1.0 - spec.beta1**step, c2=1.0 - spec.beta2**step, seed=int(seed),
        OPT=_OPT_CODE[spec.kind], SR=bool(stochastic_rounding and weights.dtype != torch.float32),
        SR_DROP=16 if weights.dtype == torch.bfloat16 else 13, CHUNK=chunk,
        VEC=_vec(layout), DIM=_uniform_dim(layout),
    )  # fmt: skip
    dummy = torch.empty(1, dtype=torch.float32, device=dev)
    mom = states.get("momentum", dummy)
    m1 = states.get("exp_avg", dummy)
    m2 = states.get("exp_avg_sq", dummy)
    go = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
    psw = per_sample_weights
    _bwd_chunk_kernel[(triton.cdiv(n_rows, cfg.bags),)](
        weights, mom, m1, m2, go, go.stride(0),
        sorted_keys, perm, sorted_bags, offsets, psw if psw is not None else dummy,
        dpsw if dpsw is not None else dummy, chunk_starts, n_rows, partial, N, B, total_rows,
        meta.weights_offset, meta.row_offset, meta.dim, meta.d_offsets,
        HAS_PSW=psw is not None, MEAN=pooling == "mean", NEED_DPSW=dpsw is not None,
        BLOCK_C=cfg.bags, BLOCK_P=cfg.block_l, BLOCK_D=cfg.block_d, **opt,
        **cfg.launch_kwargs(),
    )  # fmt: skip

    # 4. hot rows (segments longer than one tile): combine partials, update
    if N > chunk:
        _bwd_hot_kernel[(n_tiles,)](
            weights, mom, m1, m2, sorted_keys, sorted_bags, partial, N, B, total_rows,
            meta.weights_offset, meta.row_offset, meta.dim, NBITS=max(1, N.bit_length()),
            BLOCK_T=cfg.hot_block, BLOCK_D=cfg.block_d, **opt, **cfg.launch_kwargs(),
        )  # fmt: skip
    return dpsw
