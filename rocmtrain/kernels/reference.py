"""Pure-torch table-batched embedding bags: the CPU backend and the oracle for the Triton kernels.

Same semantics as the Triton path (fp32 accumulation, out-of-range indices contribute zero when
the bounds check is off, empty bags give zeros, MEAN divides by max(len, 1)). Shapes and the jagged
layout are described in :mod:`rocmtrain.kernels.layout`.

Usage (what :class:`~rocmtrain.kernels.tbe.TableBatchedEmbeddingBags` does with ``backend="torch"``)::

    check_inputs(layout, indices, offsets)                       # clear error on bad input
    out = forward(layout, weights, indices, offsets, psw, pooling="sum", output_dtype=torch.float32)
    dpsw = backward_update(layout, weights, states, grad_out, indices, offsets, psw, ...)
"""

from __future__ import annotations

import torch

from .layout import TBELayout
from .optim import OptimizerSpec, apply_update, stochastic_round


def bag_ids(offsets: torch.Tensor, num_indices: int) -> torch.Tensor:
    """int64 [N]: the (feature-major) bag ``f*B + b`` of every index position."""
    lengths = (offsets[1:] - offsets[:-1]).long()
    bags = torch.arange(lengths.numel(), device=offsets.device)
    return torch.repeat_interleave(bags, lengths, output_size=num_indices)


def check_inputs(layout: TBELayout, indices: torch.Tensor, offsets: torch.Tensor) -> None:
    """Raise a clear error for malformed offsets and out-of-range / negative indices.

    One host sync. The message names the feature, its table, the bad index and its bag.
    """
    B = layout.batch_size(offsets)
    N = indices.numel()
    if offsets.numel() == 1:
        return
    meta = layout.meta(indices.device)
    lengths = offsets[1:] - offsets[:-1]
    flags = torch.stack(
        [
            offsets[0] != 0,
            offsets[-1] != N,
            (lengths < 0).any(),
        ]
    ).tolist()
    if any(flags):
        raise ValueError(
            f"offsets are not valid KJT offsets: need offsets[0] == 0 (got {int(offsets[0])}), "
            f"offsets[-1] == len(indices) == {N} (got {int(offsets[-1])}) and non-decreasing "
            f"values; build them with kjt.offsets()"
        )
    if N == 0:
        return
    feat = torch.div(bag_ids(offsets, N), B, rounding_mode="floor")
    rows = meta.rows[feat]
    bad = (indices < 0) | (indices.long() >= rows)
    if bool(bad.any()):
        p = int(torch.nonzero(bad)[0, 0])
        f = int(feat[p])
        t = layout.feature_table_map[f]
        bag = int(torch.searchsorted(offsets, torch.tensor(p, device=offsets.device), right=True))
        raise IndexError(
            f"embedding index out of range: feature {f} (table {t}, {layout.table_rows[t]} rows) "
            f"has index {int(indices[p])} at position {p} (sample {(bag - 1) % B}); valid indices "
            f"are 0..{layout.table_rows[t] - 1}. Fix the input ids (hash or clamp them to the "
            f"table size) or enlarge the table."
        )


def _bag_scale(offsets: torch.Tensor, pooling: str) -> torch.Tensor | None:
    if pooling != "mean":
        return None
    lengths = (offsets[1:] - offsets[:-1]).to(torch.float32)
    return 1.0 / lengths.clamp(min=1.0)


def _position_scale(
    offsets: torch.Tensor, bags: torch.Tensor, psw: torch.Tensor | None, pooling: str
) -> torch.Tensor | None:
    """fp32 [N] factor applied to each gathered row (per-sample weight x 1/len for MEAN)."""
    scale = None
    inv = _bag_scale(offsets, pooling)
    if inv is not None:
        scale = inv[bags]
    if psw is not None:
        scale = psw.float() if scale is None else scale * psw.float()
    return scale


def _feature_bounds(offsets: torch.Tensor, F: int, B: int) -> list[int]:
    return offsets[:: B if B else 1][: F + 1].tolist() if B else [0] * (F + 1)


def _table_view(layout: TBELayout, weights: torch.Tensor, t: int) -> torch.Tensor:
    lo, hi = layout.weights_offsets[t], layout.weights_offsets[t + 1]
    return weights[lo:hi].view(layout.table_rows[t], layout.table_dims[t])


def forward(
    layout: TBELayout,
    weights: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    *,
    pooling: str,
    output_dtype: torch.dtype,
    bad_count: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pooled lookup ``[B, sum D]`` in ``output_dtype``, accumulated in fp32. ``bad_count``: add
    the number of out-of-range / negative indices (read as zeros) to it, no host sync."""
    B = layout.batch_size(offsets)
    F = layout.num_features
    out = torch.zeros(B, layout.total_dim, dtype=torch.float32, device=weights.device)
    N = indices.numel()
    if N == 0 or B == 0:
        return out.to(output_dtype)
    bags = bag_ids(offsets, N)
    scale = _position_scale(offsets, bags, per_sample_weights, pooling)
    bounds = _feature_bounds(offsets, F, B)
    for f in range(F):
        s, e = bounds[f], bounds[f + 1]
        if s == e:
            continue
        t = layout.feature_table_map[f]
        W = _table_view(layout, weights, t)
        idx = indices[s:e].long()
        valid = (idx >= 0) & (idx < W.shape[0])
        if bad_count is not None:
            bad_count += (~valid).sum().to(bad_count.dtype)
        rows = W[idx.clamp(0, W.shape[0] - 1)].float() * valid[:, None]
        if scale is not None:
            rows = rows * scale[s:e, None]
        d0, d1 = layout.d_offsets[f], layout.d_offsets[f + 1]
        out[:, d0:d1].index_add_(0, bags[s:e] - f * B, rows)
    return out.to(output_dtype)


def _segment_sum(keys: torch.Tensor, vals: torch.Tensor, deterministic: bool):
    """Unique sorted keys and the fp32 sum of ``vals`` rows per key."""
    uniq, inv = torch.unique(keys, return_inverse=True)
    if not deterministic or keys.device.type == "cpu":
        acc = torch.zeros(uniq.numel(), vals.shape[1], dtype=torch.float32, device=vals.device)
        return uniq, acc.index_add_(0, inv, vals)
    # deterministic on GPU: stable sort, then a segmented reduction in a fixed order
    order = torch.sort(inv, stable=True).indices
    counts = torch.bincount(inv, minlength=uniq.numel())
    acc = torch.segment_reduce(vals[order], "sum", lengths=counts, axis=0)
    return uniq, acc


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
    generator: torch.Generator | None,
    need_psw_grad: bool,
    deterministic: bool = False,
) -> torch.Tensor | None:
    """Apply the fused optimizer to the touched rows in place; return d per_sample_weights.

    ``states`` are the flat fp32 optimizer buffers (``momentum`` [total_rows]; ``exp_avg``,
    ``exp_avg_sq`` [total_weights]). The gradient of a row is summed in fp32 over all its
    occurrences (from every feature that reads its table) before one update.
    """
    B = layout.batch_size(offsets)
    F = layout.num_features
    N = indices.numel()
    grad_out = grad_out.float()
    dpsw = torch.zeros(N, dtype=torch.float32, device=weights.device) if need_psw_grad else None
    if N == 0 or B == 0:
        return dpsw
    bags = bag_ids(offsets, N)
    inv_len = _bag_scale(offsets, pooling)
    scale = _position_scale(offsets, bags, per_sample_weights, pooling)
    bounds = _feature_bounds(offsets, F, B)
    per_table: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for f in range(F):
        s, e = bounds[f], bounds[f + 1]
        if s == e:
            continue
        t = layout.feature_table_map[f]
        W = _table_view(layout, weights, t)
        idx = indices[s:e].long()
        valid = (idx >= 0) & (idx < W.shape[0])
        d0, d1 = layout.d_offsets[f], layout.d_offsets[f + 1]
        g = grad_out[bags[s:e] - f * B, d0:d1]
        if dpsw is not None:
            gi = g * inv_len[bags[s:e], None] if inv_len is not None else g
            w = W[idx.clamp(0, W.shape[0] - 1)].float()
            dpsw[s:e] = (gi * w).sum(dim=1) * valid
        if scale is not None:
            g = g * scale[s:e, None]
        keys, vals = per_table.setdefault(t, ([], []))
        keys.append(idx[valid])
        vals.append(g[valid])
    for t, (keys, vals) in per_table.items():
        uniq, gsum = _segment_sum(torch.cat(keys), torch.cat(vals), deterministic)
        W = _table_view(layout, weights, t)
        D = W.shape[1]
        rows = {}
        if spec.kind == "rowwise_adagrad":
            r0 = layout.row_offsets[t]
            rows["momentum"] = states["momentum"][r0 + uniq]
        elif spec.kind == "adam":
            w0 = layout.weights_offsets[t]
            for name in ("exp_avg", "exp_avg_sq"):
                rows[name] = states[name][w0 : w0 + W.numel()].view(-1, D)[uniq]
        new = apply_update(spec, W[uniq].float(), gsum, rows, step=step)
        if spec.kind == "rowwise_adagrad":
            states["momentum"][layout.row_offsets[t] + uniq] = rows["momentum"]
        elif spec.kind == "adam":
            w0 = layout.weights_offsets[t]
            for name in ("exp_avg", "exp_avg_sq"):
                states[name][w0 : w0 + W.numel()].view(-1, D)[uniq] = rows[name]
        if stochastic_rounding and W.dtype != torch.float32:
            bits = torch.randint(
                0, 1 << 16, new.shape, generator=generator, device=new.device, dtype=torch.int32
            )
            W[uniq] = stochastic_round(new, W.dtype, bits)
        else:
            W[uniq] = new.to(W.dtype)
    return dpsw
