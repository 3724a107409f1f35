"""Independent fp64 oracle for table-batched embedding bags (plain loops over bags and rows).

Written from the semantics in rocmtrain/kernels/KERNELS.md, sharing no code with the package, so a
bug in the package's reference or kernels cannot hide in the oracle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# dtype -> (atol, rtol) for outputs / updated weights compared with the fp64 oracle.
TOL = {
    torch.float32: (2e-5, 2e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


@dataclass
class Case:
    tables: list[tuple[int, int]]
    fmap: list[int]
    B: int
    indices: torch.Tensor
    offsets: torch.Tensor
    psw: torch.Tensor | None


def make_case(
    tables,
    fmap,
    B,
    *,
    max_len=4,
    seed=0,
    psw=False,
    empty_frac=0.2,
    hot_row=None,
    idx_dtype=torch.int64,
) -> Case:
    """Random KJT input: lengths in [0, max_len], some empty bags, optional hot row (row 0 of
    feature 0 repeated ``hot_row`` times in bag 0)."""
    g = torch.Generator().manual_seed(seed)
    F = len(fmap)
    lengths = torch.randint(0, max_len + 1, (F * B,), generator=g)
    lengths[torch.rand(F * B, generator=g) < empty_frac] = 0
    vals = []
    for f in range(F):
        rows = tables[fmap[f]][0]
        for b in range(B):
            n = int(lengths[f * B + b])
            if hot_row is not None and f == 0 and b == 0:
                n = hot_row
                lengths[0] = n
                vals.append(torch.full((n,), rows // 2, dtype=torch.int64))
                continue
            vals.append(torch.randint(0, rows, (n,), generator=g))
    indices = torch.cat(vals).to(idx_dtype)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(idx_dtype)
    w = torch.rand(indices.numel(), generator=g) * 2 - 0.5 if psw else None
    return Case(list(tables), list(fmap), B, indices, offsets, w)


def oracle_forward(weights: list[torch.Tensor], case: Case, pooling: str) -> torch.Tensor:
    """fp64 [B, sum D]."""
    F, B = len(case.fmap), case.B
    dims = [weights[t].shape[1] for t in case.fmap]
    out = torch.zeros(B, sum(dims), dtype=torch.float64)
    off = case.offsets.tolist()
    idx = case.indices.tolist()
    col = 0
    for f in range(F):
        W = weights[case.fmap[f]].double()
        for b in range(B):
            s, e = off[f * B + b], off[f * B + b + 1]
            acc = torch.zeros(dims[f], dtype=torch.float64)
            for p in range(s, e):
                c = 1.0 if case.psw is None else float(case.psw[p])
                acc += c * W[idx[p]]
            if pooling == "mean" and e > s:
                acc /= e - s
            out[b, col : col + dims[f]] = acc
        col += dims[f]
    return out


def oracle_step(weights, states, case: Case, grad_out, pooling: str, opt: dict, step: int):
    """One fused step in fp64. Returns (new weights list, new states list, dpsw or None).

    ``states[t]`` is a dict of fp64 tensors (``momentum`` [rows] or ``exp_avg``/``exp_avg_sq``).
    """
    F, B = len(case.fmap), case.B
    off = case.offsets.tolist()
    idx = case.indices.tolist()
    grads: list[dict[int, torch.Tensor]] = [dict() for _ in weights]
    dpsw = None if case.psw is None else torch.zeros(len(idx), dtype=torch.float64)
    col = 0
    go = grad_out.double()
    for f in range(F):
        t = case.fmap[f]
        D = weights[t].shape[1]
        for b in range(B):
            s, e = off[f * B + b], off[f * B + b + 1]
            g_bag = go[b, col : col + D]
            if pooling == "mean" and e > s:
                g_bag = g_bag / (e - s)
            for p in range(s, e):
                r = idx[p]
                c = 1.0 if case.psw is None else float(case.psw[p])
                if dpsw is not None:
                    dpsw[p] = float((g_bag * weights[t][r].double()).sum())
                grads[t][r] = grads[t].get(r, torch.zeros(D, dtype=torch.float64)) + c * g_bag
        col += D
    new_w = [w.double().clone() for w in weights]
    new_s = [{k: v.double().clone() for k, v in s.items()} for s in states]
    lr, eps, wd = opt["lr"], opt.get("eps", 1e-8), opt.get("weight_decay", 0.0)
    for t, rows in enumerate(grads):
        for r, g in rows.items():
            w = new_w[t][r]
            if opt["kind"] == "sgd":
                new_w[t][r] = w - lr * (g + wd * w)
            elif opt["kind"] == "rowwise_adagrad":
                gw = g + wd * w
                m = new_s[t]["momentum"][r] + float((gw * gw).sum()) / gw.numel()
                new_s[t]["momentum"][r] = m
                new_w[t][r] = w - lr * gw / (math.sqrt(m) + eps)
            else:
                b1, b2 = opt["beta1"], opt["beta2"]
                m1 = b1 * new_s[t]["exp_avg"][r] + (1 - b1) * g
                m2 = b2 * new_s[t]["exp_avg_sq"][r] + (1 - b2) * g * g
                new_s[t]["exp_avg"][r], new_s[t]["exp_avg_sq"][r] = m1, m2
                mh, vh = m1 / (1 - b1**step), m2 / (1 - b2**step)
                new_w[t][r] = w - lr * (mh / (vh.sqrt() + eps) + wd * w)
    return new_w, new_s, dpsw


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str, *, terms: int = 1
):
    """Compare with the dtype's tolerance; ``terms`` widens rtol for long fp32 sums (n*eps)."""
    atol, rtol = TOL[dtype]
    rtol = max(rtol, terms * 6e-8)
    a = actual.double()
    assert torch.isfinite(a).all(), f"{what}: non-finite values"
    torch.testing.assert_close(
        a, expected.double(), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}"
    )
