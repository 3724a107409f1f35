"""Triton backward of table-batched embedding bags, fused with the optimizer update.

No dense ``[rows, D]`` gradient, no float atomics, no host sync:

1. ``_keys_kernel`` (one launch per feature group, one-hot / multi-hot, each with its own tile):
   every index position gets its global row key ``row_offset[table] + index``
   (a sentinel past the last row for out-of-range indices) and its bag, packed
   ``feature << shift | sample``; ``torch.sort`` groups equal rows (stable in deterministic
   mode: a row's occurrences are then summed in input order); on GPUs the bags are gathered
   into sorted order once.
2. ``_bwd_tile_kernel``, one program per ``TILE`` sorted positions, walked in steps of
   ``STEP``: gathers the gradient rows (``grad_out`` row of the bag x per-sample weight x 1/len
   for MEAN), sums each row's run in fp32 (:func:`_run_sums`; a run open at a step's end carries
   into the next step in registers), writes d per_sample_weights, and applies SGD / rowwise
   Adagrad / Adam where a row's run is whole in the program (stochastic rounding for fp16/bf16).
   A run cut by a program's border leaves an fp32 partial instead: slot ``2t`` (continues from
   program t-1) or ``2t + 1`` (runs into program t+1); a program that is one key's interior piece
   stores just that. (Below, a "tile" is one program's ``TILE`` positions.)
3. Hot rows (runs across tile borders), two levels over hot blocks of ``HT`` tiles:
   ``_bwd_hot_carry_kernel`` stores, per block that a run leaves, the run's sum over the block;
   ``_bwd_hot_kernel`` sums every run ending in its block over the block (a run sum over the
   tiles' pieces, fixed order), adds the carries of the blocks a run covered (walking back,
   fixed order) and updates the rows. A row seen 1e5 times at 64-position tiles (8 steps of
   8) is ~1,560 parallel tile programs, ~98 parallel block programs and a 4-step carry walk,
   never a serial loop over its occurrences.

Usage (what the module calls)::

    dpsw = backward_update(layout, weights, states, grad_out, indices, offsets, psw,
                           pooling="sum", spec=spec, step=1, stochastic_rounding=True,
                           need_psw_grad=False, deterministic=False, seed=0)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .arch import LaunchConfig, backward_config, keys_candidates, keys_config
from .launch import Launcher
from .layout import TBELayout
from .optim import OptimizerSpec
from .tbe_forward import (
    _all_features,
    _device_info,
    _pow2_bucket,
    _uniform_dim,
    _vec,
    autotune_enabled,
    cdiv,
    fastest,
)

_OPT_CODE = {"sgd": 0, "rowwise_adagrad": 1, "adam": 2}


@triton.jit
def _update_rows(
    weights_ptr, mom_ptr, m1_ptr, m2_ptr, key, wrow, ds, rmask, D, w, g, mom,
    lr, eps, beta1, beta2, wd, c1, c2, seed,
    OPT: tl.constexpr, SR: tl.constexpr, SR_DROP: tl.constexpr, VEC: tl.constexpr,
):  # fmt: skip
    """Update rows ``[C, BLOCK_D]`` (``rmask`` [C] selects rows) from fp32 ``w`` and summed ``g``.

    ``mom``: the rows' rowwise Adagrad state from :func:`_load_mom` (loaded by the caller before
    its gradient work, so the load overlaps it). Stores the weights (stochastic rounding if
    ``SR``) and the fp32 optimizer state.
    """
    m = rmask[:, None] & ((ds[None, :] // VEC) < (D[:, None] // VEC))  # VEC | D: vector masks
    ptr = wrow[:, None] + ds[None, :]
    if OPT == 0:
        new = w - lr * (g + wd * w)
    elif OPT == 1:
        gw = tl.where(m, g + wd * w, 0.0)
        mom += tl.sum(gw * gw, axis=1) / tl.maximum(D, 1).to(tl.float32)
        tl.store(mom_ptr + key, mom, mask=rmask)
        new = w - gw * (lr / (tl.sqrt(mom) + eps))[:, None]  # one division per row
    else:
        m1 = tl.load(m1_ptr + ptr, mask=m, other=0.0) * beta1 + (1.0 - beta1) * g
        m2 = tl.load(m2_ptr + ptr, mask=m, other=0.0) * beta2 + (1.0 - beta2) * g * g
        tl.store(m1_ptr + ptr, m1, mask=m)
        tl.store(m2_ptr + ptr, m2, mask=m)
        new = w - lr * ((m1 / c1) / (tl.sqrt(m2 / c2) + eps) + wd * w)
    if SR:
        # add uniform noise below the target mantissa, truncate: E[stored] == new
        bits = new.to(tl.int32, bitcast=True)
        rnd = _row_noise(seed, wrow, ds.shape[0]).to(tl.int32, bitcast=True)
        noise = rnd & ((1 << SR_DROP) - 1)
        rounded = ((bits + noise) & (-(1 << SR_DROP))).to(tl.float32, bitcast=True)
        new = tl.where(tl.abs(new) < float("inf"), rounded, new)
    tl.store(weights_ptr + ptr, new.to(weights_ptr.dtype.element_ty), mask=m)


@triton.jit
def _row_noise(seed, wrow, BLOCK_D: tl.constexpr):
    """Uniform 32-bit noise for the elements ``[len(wrow), BLOCK_D]`` of rows starting at flat
    offsets ``wrow``: one Philox evaluation per 4 columns, all four of its outputs used (one per
    column, as FBGEMM does; ``tl.randint`` per element would keep one of four and spend most of
    a 16-bit row update on the generator). Counter = the group's flat offset: a valid column's
    counter is never another row's valid column's (a collision would need a column >= D)."""
    if BLOCK_D >= 4:
        j = tl.arange(0, BLOCK_D // 4)
        r0, r1, r2, r3 = tl.randint4x(seed, (wrow[:, None] + 4 * j[None, :]).to(tl.int32))
        # [C, BLOCK_D/4, 2, 2] -> [C, BLOCK_D]: column 4j + k gets output k
        rnd = tl.reshape(tl.join(tl.join(r0, r1), tl.join(r2, r3)), [wrow.shape[0], BLOCK_D])
    else:
        ds = tl.arange(0, BLOCK_D)
        rnd = tl.randint(seed, (wrow[:, None] + ds[None, :]).to(tl.int32))
    return rnd


@triton.jit
def _load_rows(
    weights_ptr, f_woff_ptr, f_roff_ptr, f_dim_ptr, key, f0, rmask,
    N_ROWS: tl.constexpr, VEC: tl.constexpr, DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Rows ``key`` of features ``f0`` ([N_ROWS] each, ``rmask`` selects): their dims ``D``, flat
    weight offsets ``wrow``, the column range ``ds``, the element mask ``dm`` and the rows in fp32."""
    if DIM > 0:  # every table has this dim: compile-time D (static masks, 16-byte accesses);
        # table t starts at element row_offset[t] * DIM, so a global row's offset is key * DIM
        D = tl.full([N_ROWS], DIM, tl.int32)
        wrow = key.to(tl.int64) * DIM
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
def _load_mom(mom_ptr, key, rmask, OPT: tl.constexpr):
    """Rowwise Adagrad state of rows ``key`` (zeros for the other optimizers, never read)."""
    if OPT == 1:
        mom = tl.load(mom_ptr + key, mask=rmask, other=0.0)
    else:
        mom = tl.zeros(key.shape, dtype=tl.float32)
    return mom


@triton.jit
def _keys_kernel(
    indices_ptr, offsets_ptr, keys_ptr, bags_ptr, f_rows_ptr, f_roff_ptr, feat_ptr, B, BAG_SHIFT,
    total_rows, BAGS: tl.constexpr, BLOCK_L: tl.constexpr,
):  # fmt: skip
    """keys[p] = global row of position p (sentinel total_rows if out of range); bags[p] =
    f << BAG_SHIFT | b for sample b of feature f (the kernels after the sort shift, not divide).
    One program per (block of ``BAGS`` samples, feature of this launch's group)."""
    f = tl.load(feat_ptr + tl.program_id(1))
    b = tl.program_id(0) * BAGS + tl.arange(0, BAGS)
    bm = b < B
    gbag = f.to(tl.int64) * B + b
    start = tl.load(offsets_ptr + gbag, mask=bm, other=0).to(tl.int64)
    length = tl.load(offsets_ptr + gbag + 1, mask=bm, other=0).to(tl.int64) - start
    rows = tl.load(f_rows_ptr + f)
    roff = tl.load(f_roff_ptr + f)
    packed = ((f.to(tl.int64) << BAG_SHIFT) | b).to(bags_ptr.dtype.element_ty)
    ls = tl.arange(0, BLOCK_L)
    for l0 in range(0, tl.max(length, axis=0), BLOCK_L):
        pos = start[:, None] + l0 + ls[None, :]
        pm = (l0 + ls[None, :]) < length[:, None]
        idx = tl.load(indices_ptr + pos, mask=pm, other=0).to(tl.int64)
        ok = (idx >= 0) & (idx < rows)
        key = tl.where(ok, roff + idx, total_rows)
        tl.store(keys_ptr + pos, key.to(keys_ptr.dtype.element_ty), mask=pm)
        tl.store(bags_ptr + pos, packed[:, None] + 0 * ls[None, :], mask=pm)


@triton.jit
def _load_scalars(scal_ptr):
    """Optimizer scalars from the device tensor ``scal`` (filled per step without a host sync,
    so a captured graph replays with the current step's values)."""
    lr = tl.load(scal_ptr + 0)
    eps = tl.load(scal_ptr + 1)
    beta1 = tl.load(scal_ptr + 2)
    beta2 = tl.load(scal_ptr + 3)
    wd = tl.load(scal_ptr + 4)
    c1 = tl.load(scal_ptr + 5)
    c2 = tl.load(scal_ptr + 6)
    seed = tl.load(scal_ptr + 7).to(tl.int32, bitcast=True)
    return lr, eps, beta1, beta2, wd, c1, c2, seed


@triton.jit
def _segsum_combine(a, fa, b, fb):
    """Segmented inclusive-scan step: a run restarts where the right operand starts a segment."""
    return tl.where(fb != 0, b, a + b), fa | fb


@triton.jit
def _run_sums(x, key, starts, REDUCE: tl.constexpr):
    """fp32 sums of the rows of ``x`` ([R, C]) over runs of equal ``key`` (each run contiguous;
    ``starts`` marks a run's first row). ``"scan"``: a segmented inclusive scan, so each run's
    sum is at its last row; ``"dot"``: the [R, R] 0/1 same-key matrix times ``x`` in fp32 (no
    TF32), the sum at every row of the run. Callers read only a run's last row."""
    if REDUCE == "dot":
        same = (key[:, None] == key[None, :]).to(tl.float32)
        if x.shape[0] >= 16:
            acc = tl.dot(same, x, input_precision="ieee")
        else:  # tl.dot needs 16 rows; small blocks (the interpreter's) sum a mask product
            acc = tl.sum(same[:, :, None] * x[None, :, :], axis=1)
    else:
        flags = tl.broadcast_to(starts.to(tl.int32)[:, None], x.shape)
        acc, _ = tl.associative_scan((x, flags), 0, _segsum_combine)
    return acc


@triton.jit
def _tile_cuts(sorted_keys_ptr, j, N, total_rows, TILE: tl.constexpr):
    """Tiles ``j`` (scalar or vector): first / last key and whether the tile's first position
    continues a segment from the tile before (``head``) or its last one runs into the next tile
    (``tail``). Sentinel keys (out-of-range indices) are never cut."""
    p0 = j * TILE
    inb = p0 < N
    p1 = tl.minimum(p0 + TILE, N) - 1
    # (masks are plain comparisons: a bool combined with a scalar bool turns int32 in the
    # interpreter, which its loads reject)
    k0 = tl.load(sorted_keys_ptr + p0, mask=inb, other=total_rows).to(tl.int64)
    kp = tl.load(sorted_keys_ptr + p0 - 1, mask=tl.where(inb, p0, 0) > 0, other=-1).to(tl.int64)
    k1 = tl.load(sorted_keys_ptr + p1, mask=inb, other=total_rows).to(tl.int64)
    kn = tl.load(sorted_keys_ptr + p1 + 1, mask=tl.where(inb, p1 + 1, N) < N,
                 other=-1).to(tl.int64)  # fmt: skip
    # keys past N load as total_rows / -1: never equal to a neighbour, never below total_rows
    head = tl.where(kp == k0, k0, total_rows) < total_rows
    tail = tl.where(kn == k1, k1, total_rows) < total_rows
    return k0, k1, head, tail


@triton.jit
def _own_tail_piece(k0, k1, head, tail):
    """Whether a tile stored a piece in its tail slot ``2j + 1``: it has a segment running into
    the next tile, unless the whole tile is one key already cut at the start (then its single
    piece is in slot ``2j``)."""
    return tl.where(tail, tl.where(head, (k0 != k1).to(tl.int32), 1), 0) > 0


@triton.jit
def _bwd_tile_kernel(
    weights_ptr, mom_ptr, m1_ptr, m2_ptr, go_ptr, go_stride,
    sorted_keys_ptr, perm_ptr, bags_ptr, offsets_ptr, psw_ptr, dpsw_ptr,
    partial_ptr, scal_ptr, N, B, BAG_SHIFT, total_rows,
    f_woff_ptr, f_roff_ptr, f_dim_ptr, f_doff_ptr,
    OPT: tl.constexpr, SR: tl.constexpr, SR_DROP: tl.constexpr, HAS_PSW: tl.constexpr,
    MEAN: tl.constexpr, NEED_DPSW: tl.constexpr, VEC: tl.constexpr, DIM: tl.constexpr,
    TILE: tl.constexpr, STEP: tl.constexpr, BLOCK_D: tl.constexpr, REDUCE: tl.constexpr,
    BAG_SORTED: tl.constexpr, POS64: tl.constexpr, PIECE: tl.constexpr,
):  # fmt: skip
    """Program t owns sorted positions ``[t*TILE, (t+1)*TILE)``, walked ``STEP`` at a time
    (:func:`_tile_step`: one ``[STEP, BLOCK_D]`` tile of gradient rows, each row's run of equal
    keys summed in fp32, the row updated in place where its run ends; a run still open at a
    step's end is carried into the next step in registers). Runs cut by the program's borders
    leave fp32 partials instead: the piece that continues from the previous program in slot
    ``2t``, the piece that runs into the next one in slot ``2t + 1`` (the hot-row kernels
    combine them). No compaction, no host-side shapes.

    Several steps per program: a row's occurrences inside one program never reach the hot-row
    kernels (at the DLRM set, 8 steps of 8 cut their time 4-7x), and a program's fixed work (its
    border keys) is paid once per ``TILE``. A bag is packed as ``feature << BAG_SHIFT | sample``
    (shifts, not a division by B); sorted positions are int32 unless ``POS64`` (N near 2^31):
    per-row integer work is most of the instructions."""
    if POS64:
        t = tl.program_id(0).to(tl.int64)
    else:
        t = tl.program_id(0)
    t0 = t * TILE
    t1 = tl.minimum(t0 + TILE, N)  # one past this program's last position
    ds = tl.arange(0, BLOCK_D)
    k0, k1, head, tail = _tile_cuts(sorted_keys_ptr, t, N, total_rows, TILE)
    if (k0 == k1) & (head | tail):
        # one key's interior piece (skewed ids: most programs of a hot row): no row ends here,
        # so no per-position keys, cut flags, rows or state, just the gradient rows' sum into
        # one partial (head: slot 2t, else 2t + 1)
        if TILE == STEP:
            qb = t0 + tl.arange(0, STEP)
            bag0 = _sorted_bags(bags_ptr, perm_ptr, qb, qb < t1, qb < t1, BAG_SORTED)
            piece_sum = tl.sum(_piece_step(
                t0, t1, k0, bag0, weights_ptr, go_ptr, go_stride, perm_ptr, offsets_ptr,
                psw_ptr, dpsw_ptr, B, BAG_SHIFT, f_woff_ptr, f_roff_ptr, f_dim_ptr, f_doff_ptr,
                HAS_PSW, MEAN, NEED_DPSW, VEC, DIM, STEP, BLOCK_D, BAG_SORTED,
            ), axis=0)  # fmt: skip
        else:
            # the steps' tiles are summed in registers and reduced across warps once: a
            # reduction per step is a shared-memory round trip and a barrier every step
            # PIECE (a multiple of STEP dividing TILE) rows per iteration: more gradient rows
            # in flight than one step holds
            piece_acc = tl.zeros([PIECE, BLOCK_D], dtype=tl.float32)
            qb = t0 + tl.arange(0, PIECE)
            bag_n = _sorted_bags(bags_ptr, perm_ptr, qb, qb < t1, qb < t1, BAG_SORTED)
            for s in range(t0, t1, PIECE):
                # the next iteration's bags load before this one's gradient rows: one dependent
                # load less per step (the piece path has registers to spare, the tile path not)
                bag = bag_n
                qb = s + PIECE + tl.arange(0, PIECE)
                bag_n = _sorted_bags(bags_ptr, perm_ptr, qb, qb < t1, qb < t1, BAG_SORTED)
                piece_acc += _piece_step(
                    s, t1, k0, bag, weights_ptr, go_ptr, go_stride, perm_ptr, offsets_ptr,
                    psw_ptr, dpsw_ptr, B, BAG_SHIFT, f_woff_ptr, f_roff_ptr, f_dim_ptr,
                    f_doff_ptr, HAS_PSW, MEAN, NEED_DPSW, VEC, DIM, PIECE, BLOCK_D, BAG_SORTED,
                )  # fmt: skip
            piece_sum = tl.sum(piece_acc, axis=0)
        piece = 2 * t.to(tl.int64) + 1 - head.to(tl.int64)
        tl.store(partial_ptr + piece * BLOCK_D + ds, piece_sum)
    else:
        open_sum = tl.zeros([BLOCK_D], dtype=tl.float32)  # the run left open by the last step
        open_key = k0 * 0 - 1  # its key (-1: none)
        if TILE == STEP:  # straight-line code: a loop costs ~20 registers (sm_90 SASS)
            _tile_step(
                t0, t, t1, k0, k1, head, tail, open_sum, open_key,
                weights_ptr, mom_ptr, m1_ptr, m2_ptr, go_ptr, go_stride, sorted_keys_ptr,
                perm_ptr, bags_ptr, offsets_ptr, psw_ptr, dpsw_ptr, partial_ptr, scal_ptr, N, B,
                BAG_SHIFT, total_rows, f_woff_ptr, f_roff_ptr, f_dim_ptr, f_doff_ptr,
                OPT, SR, SR_DROP, HAS_PSW, MEAN, NEED_DPSW, VEC, DIM, STEP, BLOCK_D, REDUCE,
                BAG_SORTED,
            )  # fmt: skip
        else:
            for s in range(t0, t1, STEP):
                open_sum, open_key = _tile_step(
                    s, t, t1, k0, k1, head, tail, open_sum, open_key,
                    weights_ptr, mom_ptr, m1_ptr, m2_ptr, go_ptr, go_stride, sorted_keys_ptr,
                    perm_ptr, bags_ptr, offsets_ptr, psw_ptr, dpsw_ptr, partial_ptr, scal_ptr,
                    N, B, BAG_SHIFT, total_rows, f_woff_ptr, f_roff_ptr, f_dim_ptr, f_doff_ptr,
                    OPT, SR, SR_DROP, HAS_PSW, MEAN, NEED_DPSW, VEC, DIM, STEP, BLOCK_D, REDUCE,
                    BAG_SORTED,
                )  # fmt: skip


@triton.jit
def _piece_step(
    s, t1, k0, bag, weights_ptr, go_ptr, go_stride, perm_ptr, offsets_ptr, psw_ptr,
    dpsw_ptr, B, BAG_SHIFT, f_woff_ptr, f_roff_ptr, f_dim_ptr, f_doff_ptr,
    HAS_PSW: tl.constexpr, MEAN: tl.constexpr, NEED_DPSW: tl.constexpr, VEC: tl.constexpr,
    DIM: tl.constexpr, STEP: tl.constexpr, BLOCK_D: tl.constexpr, BAG_SORTED: tl.constexpr,
):  # fmt: skip
    """fp32 gradient rows ``[STEP, BLOCK_D]`` of sorted positions ``[s, min(s + STEP, t1))``
    (zeros past ``t1``; their packed bags ``bag`` loaded by the caller), all of row ``k0``, for
    the caller to sum (d psw written for each)."""
    q = s + tl.arange(0, STEP)
    qm = q < t1
    ds = tl.arange(0, BLOCK_D)
    g = _grad_rows(go_ptr, go_stride, offsets_ptr, bag, qm, ds, B, BAG_SHIFT, f_dim_ptr,
                   f_doff_ptr, MEAN, VEC, DIM)  # fmt: skip
    if HAS_PSW or NEED_DPSW:
        orig = tl.load(perm_ptr + q, mask=qm, other=0)
    if NEED_DPSW:  # every position's row is row k0 (read once per position: L1 hits)
        w = _load_rows(weights_ptr, f_woff_ptr, f_roff_ptr, f_dim_ptr, k0 + 0 * q,
                       bag >> BAG_SHIFT, qm, STEP, VEC, DIM, BLOCK_D)[4]  # fmt: skip
        tl.store(dpsw_ptr + orig, tl.sum(g * w, axis=1), mask=qm)
    if HAS_PSW:
        g = g * tl.load(psw_ptr + orig, mask=qm, other=0.0).to(tl.float32)[:, None]
    return g


@triton.jit
def _tile_step(
    s, t, t1, k0, k1, head, tail, open_sum, open_key,
    weights_ptr, mom_ptr, m1_ptr, m2_ptr, go_ptr, go_stride, sorted_keys_ptr, perm_ptr,
    bags_ptr, offsets_ptr, psw_ptr, dpsw_ptr, partial_ptr, scal_ptr, N, B, BAG_SHIFT,
    total_rows, f_woff_ptr, f_roff_ptr, f_dim_ptr, f_doff_ptr,
    OPT: tl.constexpr, SR: tl.constexpr, SR_DROP: tl.constexpr, HAS_PSW: tl.constexpr,
    MEAN: tl.constexpr, NEED_DPSW: tl.constexpr, VEC: tl.constexpr, DIM: tl.constexpr,
    STEP: tl.constexpr, BLOCK_D: tl.constexpr, REDUCE: tl.constexpr, BAG_SORTED: tl.constexpr,
):  # fmt: skip
    """Sorted positions ``[s, min(s + STEP, t1))`` of tile program ``t`` (first / last key
    ``k0`` / ``k1``, cut at its start / end: ``head`` / ``tail``): gather the gradient rows
    (their bags read in sorted order, or through ``perm``; psw applied, d psw written), sum
    each run of equal keys in fp32 (:func:`_run_sums`) plus ``open_sum`` for the run of key
    ``open_key`` that the step before left open, update each row whose run ends here and lies
    inside the program (after storing the program's border runs as partials). Returns the run
    left open at this step's end (its sum and key; zeros and -1 when none)."""
    q = s + tl.arange(0, STEP)
    qm = q < t1
    key = tl.load(sorted_keys_ptr + q, mask=qm, other=total_rows)
    kprev = tl.load(sorted_keys_ptr + q - 1, mask=qm & (q > 0), other=-1)
    knext = tl.load(sorted_keys_ptr + q + 1, mask=qm & (q + 1 < N), other=-1)
    kv = qm & (key < total_rows)  # the sentinel key marks out-of-range indices: no update
    starts = (q == s) | (kprev != key)
    # a run ends at its last position or at the program's end; at a step's end it stays open
    run_end = qm & ((knext != key) | (q == t1 - 1))
    # (tl.where + compare keeps every mask a plain boolean, in the interpreter too)
    stays_open = tl.where(qm & (q == s + STEP - 1), 1 - run_end.to(tl.int32), 0) > 0
    in_head = tl.where(key == k0, head.to(tl.int32), 0) > 0
    in_tail = tl.where(key == k1, tail.to(tl.int32), 0) > 0
    cut = tl.where(kv & run_end, in_head.to(tl.int32) + in_tail.to(tl.int32), 0) > 0
    whole = tl.where(kv & run_end, 1 - cut.to(tl.int32), 0) > 0
    bag = _sorted_bags(bags_ptr, perm_ptr, q, qm, kv, BAG_SORTED)
    if HAS_PSW or NEED_DPSW:
        orig = tl.load(perm_ptr + q, mask=qm, other=0)
    mom = _load_mom(mom_ptr, key, whole, OPT)
    if NEED_DPSW:  # d psw needs the row every position read; the update only at run ends
        need_w = kv
    else:
        need_w = whole
    f = bag >> BAG_SHIFT
    D, wrow, ds, dm, w = _load_rows(weights_ptr, f_woff_ptr, f_roff_ptr, f_dim_ptr, key, f,
                                    need_w, STEP, VEC, DIM, BLOCK_D)  # fmt: skip
    g = _grad_rows(go_ptr, go_stride, offsets_ptr, bag, kv, ds, B, BAG_SHIFT, f_dim_ptr,
                   f_doff_ptr, MEAN, VEC, DIM)  # fmt: skip
    if NEED_DPSW:  # every position (0 where the index is out of range): no memset before
        tl.store(dpsw_ptr + orig, tl.sum(g * w, axis=1), mask=qm)
    if HAS_PSW:
        g = g * tl.load(psw_ptr + orig, mask=kv, other=0.0).to(tl.float32)[:, None]
    acc = _run_sums(g, key, starts, REDUCE)
    # the step's first run continues the open one when the keys match (keys are sorted: only
    # the first run can)
    acc += tl.where((key.to(tl.int64) == open_key)[:, None], open_sum[None, :], 0.0)
    # border partials and the open run before the update: stored after it, they keep the whole
    # fp32 step tile alive through the update (~13 more registers in the stepped loop, sm_90)
    slot = 2 * t.to(tl.int64) + (in_head == 0).to(tl.int64)
    tl.store(partial_ptr + slot[:, None] * BLOCK_D + ds[None, :], acc,
             mask=tl.broadcast_to(cut[:, None], [STEP, BLOCK_D]))  # fmt: skip
    open_sum = tl.sum(tl.where(stays_open[:, None], acc, 0.0), axis=0)
    open_key = tl.max(tl.where(stays_open, key.to(tl.int64), -1), axis=0)
    lr, eps, beta1, beta2, wd, c1, c2, seed = _load_scalars(scal_ptr)
    _update_rows(weights_ptr, mom_ptr, m1_ptr, m2_ptr, key, wrow, ds, whole, D, w, acc, mom,
                 lr, eps, beta1, beta2, wd, c1, c2, seed, OPT, SR, SR_DROP, VEC)  # fmt: skip
    return open_sum, open_key


@triton.jit
def _sorted_bags(bags_ptr, perm_ptr, q, qm, rmask, BAG_SORTED: tl.constexpr):
    """Packed bags of sorted positions ``q``: read in order when the bags were gathered into
    sorted order, else through ``perm``."""
    if BAG_SORTED:
        bag = tl.load(bags_ptr + q, mask=rmask, other=0)
    else:
        bag = tl.load(bags_ptr + tl.load(perm_ptr + q, mask=qm, other=0), mask=rmask, other=0)
    return bag


@triton.jit
def _grad_rows(
    go_ptr, go_stride, offsets_ptr, bag, rmask, ds, B, BAG_SHIFT, f_dim_ptr, f_doff_ptr,
    MEAN: tl.constexpr, VEC: tl.constexpr, DIM: tl.constexpr,
):  # fmt: skip
    """fp32 output-gradient rows ``[len(bag), BLOCK_D]`` of packed bags ``bag`` (``rmask``
    selects; 1/len applied for MEAN)."""
    f = bag >> BAG_SHIFT
    b = (bag & ((1 << BAG_SHIFT) - 1)).to(tl.int64)
    if DIM > 0:  # feature f's output columns start at f * DIM
        dq = tl.full(bag.shape, DIM, tl.int32)
        doff = f * DIM
    else:
        dq = tl.load(f_dim_ptr + f, mask=rmask, other=0)
        doff = tl.multiple_of(tl.load(f_doff_ptr + f, mask=rmask, other=0), VEC)
    gm = rmask[:, None] & ((ds[None, :] // VEC) < (dq[:, None] // VEC))
    g = tl.load(go_ptr + b[:, None] * go_stride + doff[:, None] + ds[None, :], mask=gm,
                other=0.0).to(tl.float32)  # fmt: skip
    if MEAN:
        gbag = f.to(tl.int64) * B + b
        n = tl.load(offsets_ptr + gbag + 1, mask=rmask, other=1) - tl.load(
            offsets_ptr + gbag, mask=rmask, other=0
        )
        g = g * (1.0 / tl.maximum(n, 1).to(tl.float32))[:, None]  # one division per row
    return g


@triton.jit
def _hot_block(
    sorted_keys_ptr, partial_ptr, jb, k0, head, N, total_rows,
    TILE: tl.constexpr, HT: tl.constexpr, BLOCK_D: tl.constexpr, REDUCE: tl.constexpr,
):  # fmt: skip
    """The cut segments' fp32 sums over the hot block of tiles ``[jb, jb + HT)``.

    Tile j's share ``X_j`` = its head piece (slot ``2j``, if its first position continues a
    segment) + tile j-1's tail piece (slot ``2j - 1``, if that runs into tile j; not for the
    block's first tile, whose incoming piece belongs to the previous block's carry). Both
    belong to the segment of tile j's first key ``k0[j]``, so the block sum of a segment is a
    run sum of ``X`` over equal ``k0`` (:func:`_run_sums`: O(HT x BLOCK_D), a fixed order).
    ``k0``, ``head``: the block's tiles' first keys and head flags (:func:`_tile_cuts`). Returns
    ``[HT, BLOCK_D]`` sums, valid at each segment's last tile in the block."""
    hs = tl.arange(0, HT)
    j = jb + hs
    ds = tl.arange(0, BLOCK_D)
    jp = tl.maximum(j - 1, 0)
    k0p, k1p, headp, tailp = _tile_cuts(sorted_keys_ptr, jp, N, total_rows, TILE)
    inflow = tl.where(hs > 0, _own_tail_piece(k0p, k1p, headp, tailp).to(tl.int32), 0) > 0
    x = tl.load(partial_ptr + (2 * j)[:, None] * BLOCK_D + ds[None, :],
                mask=tl.broadcast_to(head[:, None], [HT, BLOCK_D]), other=0.0)  # fmt: skip
    x += tl.load(partial_ptr + (2 * j - 1)[:, None] * BLOCK_D + ds[None, :],
                 mask=tl.broadcast_to(inflow[:, None], [HT, BLOCK_D]), other=0.0)  # fmt: skip
    starts = (hs == 0) | (k0 != k0p)
    return _run_sums(x, k0, starts, REDUCE)


@triton.jit
def _bwd_hot_carry_kernel(
    sorted_keys_ptr, partial_ptr, carry_ptr, start_ptr, N, total_rows,
    TILE: tl.constexpr, HT: tl.constexpr, BLOCK_D: tl.constexpr, REDUCE: tl.constexpr,
):  # fmt: skip
    """Hot-row level 1, program b = hot block b (tiles ``[b*HT, (b+1)*HT)``): when a segment runs
    out of the block into the next one, store its fp32 sum over this block in ``carry[b]`` and
    in ``start[b]`` whether the segment started in this block (1) or runs through it (0). Blocks
    no segment leaves write nothing (their rows are never read)."""
    b = tl.program_id(0).to(tl.int64)
    jb = b * HT
    k0l, k1l, headl, taill = _tile_cuts(sorted_keys_ptr, jb + HT - 1, N, total_rows, TILE)
    if taill:
        hs = tl.arange(0, HT)
        ds = tl.arange(0, BLOCK_D)
        k0, k1, head, tail = _tile_cuts(sorted_keys_ptr, jb + hs, N, total_rows, TILE)
        sums = _hot_block(sorted_keys_ptr, partial_ptr, jb, k0, head, N, total_rows,
                          TILE, HT, BLOCK_D, REDUCE)  # fmt: skip
        last = tl.sum(tl.where((hs == HT - 1)[:, None], sums, 0.0), axis=0)
        if _own_tail_piece(k0l, k1l, headl, taill):  # the segment starts in the last tile
            acc = tl.load(partial_ptr + (2 * (jb + HT - 1) + 1) * BLOCK_D + ds)
        else:  # the last tile is one key running through: its run sum so far
            acc = last
        tl.store(carry_ptr + b * BLOCK_D + ds, acc)
        k0f = tl.sum(tl.where(hs == 0, k0, 0), axis=0)  # the block's first tile
        headf = tl.sum(tl.where(hs == 0, head.to(tl.int32), 0), axis=0)
        through = tl.where(k0f == k1l, headf, 0)
        tl.store(start_ptr + b, 1 - through)


@triton.jit
def _bwd_hot_kernel(
    weights_ptr, mom_ptr, m1_ptr, m2_ptr, sorted_keys_ptr, perm_ptr, bags_ptr, partial_ptr,
    carry_ptr, start_ptr, scal_ptr, N, BAG_SHIFT, total_rows, f_woff_ptr, f_roff_ptr, f_dim_ptr,
    OPT: tl.constexpr, SR: tl.constexpr, SR_DROP: tl.constexpr, TILE: tl.constexpr,
    VEC: tl.constexpr, DIM: tl.constexpr, HT: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr, BAG_SORTED: tl.constexpr, REDUCE: tl.constexpr,
):  # fmt: skip
    """Hot-row level 2, program b = hot block b: every cut segment that ends in one of the
    block's tiles (at most one per tile) gets its sum over the block (:func:`_hot_block`);
    the one that ran in from before the block (at most one) adds the carries of the blocks it
    covers, walking back ``BLOCK_T`` blocks at a time to the block where it started; then the
    rows are updated together. Fixed summation order: deterministic."""
    b = tl.program_id(0).to(tl.int64)
    jb = b * HT
    hs = tl.arange(0, HT)
    k0, k1, head, tail = _tile_cuts(sorted_keys_ptr, jb + hs, N, total_rows, TILE)
    own = tl.where(head, tl.where(tail, (k1 != k0).to(tl.int32), 1), 0) > 0  # a segment ends here
    if tl.max(own.to(tl.int32), axis=0) > 0:  # blocks that own no cut segment exit here
        g = _hot_block(sorted_keys_ptr, partial_ptr, jb, k0, head, N, total_rows,
                       TILE, HT, BLOCK_D, REDUCE)  # fmt: skip
        kb = tl.sum(tl.where(hs == 0, k0, 0), axis=0)
        hb = tl.sum(tl.where(hs == 0, head.to(tl.int32), 0), axis=0)
        cont = tl.where(own, tl.where(k0 == kb, hb, 0), 0) > 0  # it ran in from the block before
        ds = tl.arange(0, BLOCK_D)
        carry = tl.zeros([BLOCK_D], dtype=tl.float32)
        if tl.max(cont.to(tl.int32), axis=0) > 0:
            ts = tl.arange(0, BLOCK_T)
            cur = b - 1
            more = cur >= 0
            while more:  # blocks cur, cur-1, ...: up to and including the segment's start
                bs = cur - ts
                bm = bs >= 0
                st = tl.load(start_ptr + bs, mask=bm, other=1)
                cv = tl.load(carry_ptr + bs[:, None] * BLOCK_D + ds[None, :],
                             mask=tl.broadcast_to(bm[:, None], [BLOCK_T, BLOCK_D]),
                             other=0.0)  # fmt: skip
                kst = tl.min(tl.where(st != 0, ts, BLOCK_T), axis=0)
                inc = tl.where(bm, ts, BLOCK_T) <= kst  # up to and including the start block
                carry += tl.sum(tl.where(inc[:, None], cv, 0.0), axis=0)
                cur = cur - BLOCK_T
                more = kst >= BLOCK_T
        g += tl.where(cont[:, None], carry[None, :], 0.0)
        p0 = (jb + hs) * TILE
        if BAG_SORTED:
            bag = tl.load(bags_ptr + p0, mask=own, other=0)
        else:
            bag = tl.load(bags_ptr + tl.load(perm_ptr + p0, mask=own, other=0), mask=own, other=0)
        mom = _load_mom(mom_ptr, k0, own, OPT)
        D, wrow, ds, dm, w = _load_rows(weights_ptr, f_woff_ptr, f_roff_ptr, f_dim_ptr, k0,
                                        bag >> BAG_SHIFT, own, HT, VEC, DIM, BLOCK_D)  # fmt: skip
        lr, eps, beta1, beta2, wd, c1, c2, seed = _load_scalars(scal_ptr)
        _update_rows(weights_ptr, mom_ptr, m1_ptr, m2_ptr, k0, wrow, ds, own, D, w, g, mom,
                     lr, eps, beta1, beta2, wd, c1, c2, seed, OPT, SR, SR_DROP, VEC)  # fmt: skip


_SCAL_LEN = 8  # lr, eps, beta1, beta2, weight decay, c1, c2, seed (int32 bits)


def scalar_values(
    spec: OptimizerSpec, step: int, seed: int, *, stochastic_rounding: bool
) -> tuple[float | int, ...]:
    """This step's optimizer scalars, in ``scal`` order. Values a kernel variant never reads are
    pinned to constants (bias corrections 1.0 unless Adam, seed 0 without stochastic rounding),
    so for SGD / rowwise Adagrad on fp32 weights they are the same every step and the module can
    skip the per-step host-to-device copy (:func:`write_scalars`)."""
    adam = spec.kind == "adam"
    return (
        spec.lr, spec.eps, spec.beta1, spec.beta2, spec.weight_decay,
        1.0 - spec.beta1**step if adam else 1.0, 1.0 - spec.beta2**step if adam else 1.0,
        int(seed) if stochastic_rounding else 0,
    )  # fmt: skip


def write_scalars(scal: torch.Tensor, vals: tuple[float | int, ...]) -> None:
    """Write :func:`scalar_values` into the fp32 [8] device tensor ``scal`` without a host sync.

    The values go through a fresh pinned buffer from torch's caching host allocator, which keeps
    the buffer alive until the asynchronous copy has run, so the host never waits for the GPU
    and a later step cannot overwrite a copy still in flight. The seed travels as int32 bits.
    """
    host = torch.tensor(vals[:7] + (0.0,), dtype=torch.float32,
                        pin_memory=scal.device.type != "cpu")  # fmt: skip
    host.view(torch.int32)[7] = int(vals[7])
    scal.copy_(host, non_blocking=scal.device.type != "cpu")


def fill_scalars(scal: torch.Tensor, spec: OptimizerSpec, step: int, seed: int) -> None:
    """:func:`write_scalars` of this step's values (rounding seed always included)."""
    write_scalars(scal, scalar_values(spec, step, seed, stochastic_rounding=True))


_KEYS, _TILE = Launcher(_keys_kernel), Launcher(_bwd_tile_kernel)
_HOT_CARRY, _HOT = Launcher(_bwd_hot_carry_kernel), Launcher(_bwd_hot_kernel)


# (arch, mean bag length bucket, batch bucket, index dtype) -> keys tile chosen on this GPU
_KEYS_TUNED: dict[tuple, LaunchConfig] = {}


def _keys_tile(dev, info, avg_len: float, B: int, index_dtype, launch) -> LaunchConfig:
    """The keys kernel's tile: on a GPU the fastest of :func:`keys_candidates` at the first
    call per shape class (the kernel only writes ``keys``/``bags``, so timing it repeats
    nothing), else the table's."""
    key = (info.arch, _pow2_bucket(avg_len), _pow2_bucket(B), index_dtype)
    cfg = _KEYS_TUNED.get(key)
    if cfg is None:  # only a tuned choice is kept
        if not autotune_enabled(dev):
            return keys_config(info, avg_len=avg_len)
        cfg = _KEYS_TUNED[key] = fastest(keys_candidates(info, avg_len=avg_len), launch)
    return cfg


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
    scal: torch.Tensor | None = None,
    groups: list[tuple] | None = None,
) -> torch.Tensor | None:
    """Apply the fused optimizer to the rows touched by this batch; return d per_sample_weights.

    A few Triton launches (keys, one per feature group; tiles; hot-row carries, only when the
    batch spans more than one hot block; hot rows) and one ``torch.sort``; no host sync and no
    data-dependent host shape, so the whole call can be captured in a CUDA / HIP graph (the
    first eager call per shape class on a GPU times the keys tiles; a capture uses the table's).
    ``groups`` (the forward's :func:`~.tbe_forward.feature_groups`): the keys kernel runs per
    group with a tile for its mean bag length; None = one launch over all features. ``scal`` (fp32 [8])
    holds the step's optimizer scalars; when None it is filled here (the module passes its own,
    filled by :func:`write_scalars` when the values change, so a graph replays the current ones).
    """
    B = layout.batch_size(offsets)
    N = indices.numel()
    F = layout.num_features
    dev = weights.device
    if N == 0 or B == 0:
        return torch.zeros(N, dtype=torch.float32, device=dev) if need_psw_grad else None
    # every position's d psw is written by the tile kernel (0 for out-of-range indices): no memset
    dpsw = torch.empty(N, dtype=torch.float32, device=dev) if need_psw_grad else None
    meta = layout.meta(dev)
    info = _device_info(dev.index)
    total_rows = layout.total_rows
    cfg, step = backward_config(info, max_dim=layout.max_dim)
    tile = step * cfg.steps  # sorted positions per tile program
    sr = bool(stochastic_rounding and weights.dtype != torch.float32)
    if scal is None:
        scal = torch.empty(_SCAL_LEN, dtype=torch.float32, device=dev)
        write_scalars(scal, scalar_values(spec, step, seed, stochastic_rounding=sr))

    # 1. global row key and bag per position; one sort groups a row's occurrences (int32 keys
    #    when the row ids fit: half the radix passes of int64)
    kdtype = torch.int32 if total_rows < 2**31 - 1 else torch.int64
    keys = torch.empty(N, dtype=kdtype, device=dev)
    shift = max(1, (B - 1).bit_length())  # bag = feature << shift | sample
    bdtype = torch.int32 if F << shift < 2**31 else torch.int64
    bags = torch.empty(N, dtype=bdtype, device=dev)
    for feats, avg_len, _ in groups or [(None, N / (F * B), layout.max_dim)]:
        feats = _all_features(F, dev) if feats is None else feats

        def launch(c: LaunchConfig, feats=feats) -> None:
            _KEYS.run(
                (cdiv(B, c.bags), feats.numel()),
                indices, offsets, keys, bags, meta.rows, meta.row_offset, feats, B, shift,
                total_rows, BAGS=c.bags, BLOCK_L=c.block_l, num_warps=c.num_warps,
            )  # fmt: skip

        launch(_keys_tile(dev, info, avg_len, B, indices.dtype, launch))
    sorted_keys, perm = torch.sort(keys, stable=deterministic)
    if cfg.bag_sorted:
        bags = bags[perm]

    # 2. fixed tiles of sorted positions: segmented reduce + fused update, partials at borders
    n_tiles = cdiv(N, tile)
    partial = torch.empty(2 * n_tiles, cfg.block_d, dtype=torch.float32, device=dev)
    opt = dict(
        OPT=_OPT_CODE[spec.kind], SR=sr,
        SR_DROP=16 if weights.dtype == torch.bfloat16 else 13, TILE=tile,
        VEC=_vec(layout), DIM=_uniform_dim(layout),
    )  # fmt: skip
    dummy = scal
    mom = states.get("momentum", dummy)
    m1 = states.get("exp_avg", dummy)
    m2 = states.get("exp_avg_sq", dummy)
    go = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()
    psw = per_sample_weights
    _TILE.run(
        (n_tiles,),
        weights, mom, m1, m2, go, go.stride(0),
        sorted_keys, perm, bags, offsets, psw if psw is not None else dummy,
        dpsw if dpsw is not None else dummy, partial, scal, N, B, shift, total_rows,
        meta.weights_offset, meta.row_offset, meta.dim, meta.d_offsets,
        HAS_PSW=psw is not None, MEAN=pooling == "mean", NEED_DPSW=dpsw is not None,
        STEP=step, BLOCK_D=cfg.block_d, REDUCE=cfg.reduce, BAG_SORTED=cfg.bag_sorted,
        POS64=N + 2 * tile >= 2**31, PIECE=step * cfg.piece_steps, **opt,
        **cfg.tile_launch_kwargs(spec.kind),
    )  # fmt: skip

    # 3. hot rows (segments across tile borders), two levels: hot blocks of ``hot_tiles`` tiles
    #    sum their share of each cut segment in parallel; the block where a segment ends adds
    #    the carries of the blocks before it (fixed order) and updates the row
    if N > tile:
        ht = cfg.hot_tiles
        n_blocks = cdiv(n_tiles, ht)
        carry = start = scal  # one block: no segment leaves it, no carries
        if n_blocks > 1:
            carry = torch.empty(n_blocks, cfg.block_d, dtype=torch.float32, device=dev)
            start = torch.empty(n_blocks, dtype=torch.int32, device=dev)
            _HOT_CARRY.run(
                (n_blocks,),
                sorted_keys, partial, carry, start, N, total_rows,
                TILE=tile, HT=ht, BLOCK_D=cfg.block_d, REDUCE=cfg.reduce, **cfg.hot_launch_kwargs(),
            )  # fmt: skip
        _HOT.run(
            (n_blocks,),
            weights, mom, m1, m2, sorted_keys, perm, bags, partial, carry, start, scal, N,
            shift, total_rows, meta.weights_offset, meta.row_offset, meta.dim, HT=ht,
            BLOCK_T=cfg.hot_block, BLOCK_D=cfg.block_d, BAG_SORTED=cfg.bag_sorted,
            REDUCE=cfg.reduce, **opt, **cfg.hot_launch_kwargs(),
        )  # fmt: skip
    return dpsw
