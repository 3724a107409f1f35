"""Data-parallel fused embedding update: all-gather the sparse gradient, apply one global update.

Every rank holds the same tables. :func:`gathered_update` returns the local forward output; in
backward it all-gathers each rank's ``(grad_output, ids, offsets, per_sample_weights)``,
rebuilds one key-major KJT batch of ``sum_r B_r`` bags (feature f: rank 0's bags, rank 1's, ...),
and runs the kernel's fused backward on it with ``grad / world_size``, which is exactly DDP's
averaged gradient. Every rank applies the identical update, so the replicas stay equal.

Implementation note: the update goes through the kernel's public autograd path (forward over the
global batch + ``backward``), so each step costs one extra forward over the global batch; a
public "apply this output gradient" entry point on ``TableBatchedEmbeddingBags`` would remove it.

Usage (what ``rocmtrain.embedding.EmbeddingBagCollection(process_group=pg)`` does)::

    out = gathered_update(tbe, kjt.values(), kjt.offsets(), None, pg)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rocmtrain.kernels import TableBatchedEmbeddingBags


def _all_gather_var(t: torch.Tensor, pg: dist.ProcessGroup) -> list[torch.Tensor]:
    """All-gather tensors whose first dim differs per rank."""
    world = dist.get_world_size(pg)
    n = torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n, group=pg)
    counts = [int(s.item()) for s in sizes]
    pad = t.new_zeros((max(counts), *t.shape[1:]))
    pad[: t.shape[0]] = t
    out = [torch.empty_like(pad) for _ in range(world)]
    dist.all_gather(out, pad, group=pg)
    return [o[:c] for o, c in zip(out, counts, strict=True)]


def merge_batches(
    values: list[torch.Tensor], offsets: list[torch.Tensor], num_features: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Concatenate per-rank key-major KJT batches into one: ``(values, offsets, perm)`` where
    ``values == torch.cat(values_per_rank)[perm]``."""
    F = num_features
    base = 0
    lengths, segments = [], []
    bounds_per_rank = []
    for v, o in zip(values, offsets, strict=True):
        B = (o.numel() - 1) // F
        lengths.append(torch.diff(o).view(F, B))
        bounds_per_rank.append((base, o[::B].tolist() if B else [0] * (F + 1)))
        base += v.numel()
    for f in range(F):
        for rank_base, bounds in bounds_per_rank:
            segments.append(
                torch.arange(rank_base + bounds[f], rank_base + bounds[f + 1], dtype=torch.int64)
            )
    device = values[0].device
    perm = torch.cat(segments).to(device) if segments else torch.zeros(0, dtype=torch.int64)
    all_lengths = torch.cat(lengths, dim=1).reshape(-1)
    merged_offsets = torch.zeros(all_lengths.numel() + 1, dtype=offsets[0].dtype, device=device)
    merged_offsets[1:] = torch.cumsum(all_lengths, 0)
    return torch.cat(values)[perm], merged_offsets, perm


class _GatheredUpdate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tbe, pg, anchor, values, offsets, psw):  # type: ignore[override]
        ctx.tbe, ctx.pg = tbe, pg
        ctx.save_for_backward(values, offsets, psw)
        ctx.has_psw = psw is not None
        with torch.no_grad():
            return tbe(values, offsets, psw)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        values, offsets, psw = ctx.saved_tensors
        tbe: TableBatchedEmbeddingBags = ctx.tbe
        pg = ctx.pg
        rank, world = dist.get_rank(pg), dist.get_world_size(pg)
        all_values = _all_gather_var(values.to(torch.int64), pg)
        all_offsets = _all_gather_var(offsets.to(torch.int64), pg)
        all_grads = _all_gather_var(grad_out.contiguous(), pg)
        merged_v, merged_o, perm = merge_batches(all_values, all_offsets, tbe.layout.num_features)
        merged_psw = None
        if ctx.has_psw:
            all_psw = _all_gather_var(psw.detach(), pg)
            merged_psw = torch.cat(all_psw)[perm].requires_grad_(ctx.needs_input_grad[5])
        with torch.enable_grad():
            out = tbe(merged_v, merged_o, merged_psw)
            out.backward(torch.cat(all_grads) / world)
        dpsw = None
        if merged_psw is not None and merged_psw.grad is not None:
            flat = torch.zeros_like(merged_psw.grad)
            flat[perm] = merged_psw.grad
            start = sum(v.numel() for v in all_values[:rank])
            dpsw = flat[start : start + values.numel()] * world  # undo /world for the local loss
        return None, None, None, None, None, dpsw


def gathered_update(
    tbe: TableBatchedEmbeddingBags,
    values: torch.Tensor,
    offsets: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    pg: dist.ProcessGroup,
) -> torch.Tensor:
    """Forward of ``tbe`` on the local batch; backward = one fused update over all ranks' batches."""
    if not torch.is_grad_enabled():
        return tbe(values, offsets, per_sample_weights)
    anchor = torch.empty(0, device=tbe.weights.device, requires_grad=True)
    return _GatheredUpdate.apply(tbe, pg, anchor, values, offsets, per_sample_weights)
