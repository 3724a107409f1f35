"""The Triton kernels compiled on a real GPU (NVIDIA or AMD) against the fp64 oracle and the
torch reference backend. Skipped on CPU-only machines; the lead runs them on the GPU machine:

    python -m pytest tests/kernels/test_tbe_gpu.py -m gpu -q
"""

from __future__ import annotations

import pytest
import torch
from tbe_oracle import assert_close, make_case, oracle_forward, oracle_step

from rocmtrain.kernels import OptimizerSpec, TableBatchedEmbeddingBags

pytestmark = pytest.mark.gpu
TABLES = [(4000, 12), (3000, 20), (2500, 36), (5000, 128)]
FMAP = [0, 1, 0, 2, 3]
OPTS = {
    "sgd": dict(kind="sgd", lr=0.3, weight_decay=0.01),
    "rowwise_adagrad": dict(kind="rowwise_adagrad", lr=0.2, eps=1e-6),
    "adam": dict(kind="adam", lr=0.05, beta1=0.8, beta2=0.95, eps=1e-6),
}


def _cuda(case):
    case.indices = case.indices.cuda()
    case.offsets = case.offsets.cuda()
    if case.psw is not None:
        case.psw = case.psw.cuda()
    return case


@pytest.mark.parametrize("kind", list(OPTS))
@pytest.mark.parametrize("wdtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_gpu_step_matches_oracle(kind, wdtype, pooling):
    opt = OPTS[kind]
    m = TableBatchedEmbeddingBags(TABLES, feature_table_map=FMAP, optimizer=OptimizerSpec(**opt),
                                  weights_dtype=wdtype, pooling=pooling, backend="triton",
                                  device="cuda")  # fmt: skip
    case = make_case(TABLES, FMAP, B=513, seed=3, psw=True, max_len=7, hot_row=3000)
    w0 = [w.cpu().clone() for w in m.split_embedding_weights()]
    s0 = [{k: v.cpu().double() for k, v in s.items()} for s in m.split_optimizer_states()]
    _cuda(case)
    psw = case.psw.clone().requires_grad_(True)
    out = m(case.indices, case.offsets, psw)
    case.indices, case.offsets, case.psw = case.indices.cpu(), case.offsets.cpu(), case.psw.cpu()
    assert_close(out.cpu(), oracle_forward(w0, case, pooling), torch.float32, "gpu forward",
                 terms=3000)  # fmt: skip
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)) * 1e-2
    out.backward(grad.cuda())
    ref_w, ref_s, ref_dpsw = oracle_step(w0, s0, case, grad, pooling, opt, 1)
    torch.cuda.synchronize()
    for t, w in enumerate(m.split_embedding_weights()):
        assert_close(w.cpu(), ref_w[t], wdtype, f"gpu {kind} table {t}", terms=3000)
        for name, st in m.split_optimizer_states()[t].items():
            assert_close(st.cpu(), ref_s[t][name], wdtype, f"gpu {kind} {name}", terms=3000)
    assert_close(psw.grad.cpu(), ref_dpsw, torch.float32, "gpu d per_sample_weights")


@pytest.mark.parametrize("kind", ["sgd", "rowwise_adagrad"])
def test_gpu_large_hot_row_matches_torch_backend(kind):
    """B=4096, L=32, D=128 and one row 1e5 times: Triton == torch reference, deterministic.

    Every row but the hot one must agree tightly between the backends. The hot row sums 1e5 fp32
    gradient rows, so any two fp32 summation orders legitimately differ by ~eps32 * sqrt(n) * |sum|;
    both backends are therefore checked against the fp64 update of that row instead.
    """
    tables = [(100_000, 128), (50_000, 64)]
    g = torch.Generator().manual_seed(0)
    B, L, HOT, lr = 4096, 32, 7, 0.1
    idx0 = torch.randint(0, 100_000, (B * L,), generator=g)
    idx0[:100_000] = HOT
    idx1 = torch.randint(0, 50_000, (B * L,), generator=g)
    indices = torch.cat([idx0, idx1]).cuda()
    offsets = torch.arange(0, 2 * B * L + 1, L).cuda()
    grad = torch.randn((B, 128 + 64), generator=torch.Generator().manual_seed(1))
    res = []
    for backend, det in (("torch", False), ("triton", True), ("triton", True), ("triton", False)):
        m = TableBatchedEmbeddingBags(tables, optimizer=OptimizerSpec(kind, lr=lr),
                                      backend=backend, deterministic=det, device="cuda")  # fmt: skip
        w0_hot = m.split_embedding_weights()[0][HOT].double().cpu()
        out = m(indices, offsets)
        out.backward(grad.cuda())
        res.append((out.detach(), m.weights.detach().clone()))
        # fp64 update of the hot row: bag b holds positions b*L .. b*L+L-1 of feature 0
        g_hot = grad[(idx0 == HOT).nonzero().squeeze(1) // L, :128].double().sum(0)
        if kind == "sgd":
            want = w0_hot - lr * g_hot
        else:
            want = w0_hot - lr * g_hot / ((g_hot * g_hot).mean().sqrt() + 1e-8)
        got = m.split_embedding_weights()[0][HOT].double().cpu()
        # fp32 sums of n terms of size ~|g|: error ~ eps32 * sqrt(n) * |partial sum| <= eps32 * n * |g|
        n_hot = int((idx0 == HOT).sum())
        tol = lr * 12 * 2.0**-24 * n_hot * grad[:, :128].abs().max().item() + 1e-5
        assert (got - want).abs().max().item() <= tol, f"{backend}: hot row vs fp64"
    hot = torch.zeros_like(res[0][1], dtype=torch.bool)
    hot[HOT * 128 : (HOT + 1) * 128] = True
    ref_out, ref_w = res[0]
    for out, w in res[1:]:
        torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(w[~hot], ref_w[~hot], atol=1e-4, rtol=1e-3)
    assert torch.equal(res[1][1], res[2][1]), "deterministic mode is not bitwise repeatable"


def test_gpu_stochastic_rounding_unbiased():
    rows = 1 << 16
    m = TableBatchedEmbeddingBags([(rows, 4)], optimizer=OptimizerSpec("sgd", lr=1.0),
                                  weights_dtype=torch.bfloat16, backend="triton", device="cuda")  # fmt: skip
    m.weights.data.fill_(1.0)
    idx = torch.arange(rows, device="cuda")
    out = m(idx, torch.arange(rows + 1, device="cuda"))
    out.backward(torch.full_like(out, -0.001))
    vals = m.weights.double()
    assert set(vals.unique().tolist()) <= {1.0, 1.0078125}
    assert abs(vals.mean().item() - 1.001) < 5e-5


def test_gpu_bounds_check():
    m = TableBatchedEmbeddingBags([(10, 8)], backend="triton", device="cuda")
    with pytest.raises(IndexError, match="feature 0 \\(table 0, 10 rows\\) has index 10"):
        m(torch.tensor([1, 10], device="cuda"), torch.tensor([0, 1, 2], device="cuda"))


@pytest.mark.parametrize("mode", [True, "auto"])
@pytest.mark.parametrize("kind,wdtype", [("adam", torch.bfloat16), ("rowwise_adagrad", torch.float32),
                                         ("sgd", torch.float16)])  # fmt: skip
def test_gpu_cuda_graph_backward_is_bitwise_the_eager_one(kind, wdtype, mode):
    """cuda_graph=True / "auto" (eager runs, warm-up on static buffers, captures, replays) gives
    bitwise the eager module's weights, states and psw gradients over 11 steps with new inputs
    each step (Adam's bias correction and the rounding seed change per step, so the device
    scalars must reach the graph) and batch sizes switching between three signatures: 257 and
    130 get graphs (shared pool), 64 comes once (True: warm-up only; "auto": eager)."""
    opt = OPTS[kind]
    mods = [TableBatchedEmbeddingBags(TABLES, feature_table_map=FMAP,
                                      optimizer=OptimizerSpec(**opt), weights_dtype=wdtype,
                                      backend="triton", deterministic=True, cuda_graph=cg,
                                      device="cuda", seed=4) for cg in (False, mode)]  # fmt: skip
    g = torch.Generator().manual_seed(0)
    L = 3
    for step, B in enumerate([257, 257, 257, 257, 130, 130, 257, 130, 130, 64, 257]):
        idx = torch.cat([torch.randint(0, TABLES[t][0], (B * L,), generator=g) for t in FMAP])
        idx[:50] = 7  # a hot row across tiles
        off = torch.arange(0, len(FMAP) * B * L + 1, L)
        psw = torch.rand(idx.numel(), generator=g)
        grad = torch.randn(B, sum(TABLES[t][1] for t in FMAP), generator=g)
        dpsw = []
        for m in mods:
            p = psw.cuda().requires_grad_(True)
            out = m(idx.cuda(), off.cuda(), p)
            out.backward(grad.cuda())
            dpsw.append(p.grad)
        torch.cuda.synchronize()
        assert torch.equal(mods[0].weights, mods[1].weights), f"step {step}: weights differ"
        for name in mods[0].optimizer.state_names:
            assert torch.equal(getattr(mods[0], name), getattr(mods[1], name)), name
        assert torch.equal(dpsw[0], dpsw[1]), f"step {step}: d psw differs"
    graphs = [e["graph"] for e in mods[1]._graphs.values()]
    assert mods[1].cuda_graph == mode, "graph replay was switched off (capture failed?)"
    assert sum(gr is not None for gr in graphs) == 2, graphs
    assert not mods[0]._graphs


def _zipf_indices(rows, n, g, s=1.15):
    """Zipf(s) ranks scattered over the table (hot rows of every size)."""
    p = torch.arange(1, rows + 1, dtype=torch.float64) ** -s
    idx = torch.multinomial(p / p.sum(), n, replacement=True, generator=g)
    return torch.randperm(rows, generator=g)[idx]


@pytest.mark.parametrize("kind", ["sgd", "rowwise_adagrad"])
def test_gpu_zipf_hot_rows_match_fp64_and_graph(kind):
    """Zipf(1.15) over 200k rows, B=4096, L=32, D=128 (top row ~21k times: ~80 hot blocks, a
    3-step carry walk; thousands of rows cut across tiles): every touched row vs its fp64
    update (tolerance: fp32 sums of n terms), bitwise repeatable in deterministic mode, and the
    "auto" graph bitwise the eager step over 4 steps (captured on the 3rd, replayed on the 4th)."""
    rows, D, B, L, lr = 200_000, 128, 4096, 32, 0.1
    g = torch.Generator().manual_seed(3)
    steps = []
    for _ in range(4):
        idx = _zipf_indices(rows, B * L, g)
        steps.append((idx.cuda(), torch.arange(0, B * L + 1, L).cuda(),
                      torch.randn(B, D, generator=g).cuda()))  # fmt: skip
    mods = [TableBatchedEmbeddingBags([(rows, D)], optimizer=OptimizerSpec(kind, lr=lr),
                                      backend="triton", deterministic=True, cuda_graph=cg,
                                      device="cuda", seed=1)
            for cg in (False, False, "auto")]  # fmt: skip
    for i, (idx, off, grad) in enumerate(steps):
        w0 = mods[0].weights.detach().double().view(rows, D).clone()
        m0 = mods[0].momentum.double().clone() if kind == "rowwise_adagrad" else None
        for m in mods:
            m(idx, off).backward(grad)
        torch.cuda.synchronize()
        assert torch.equal(mods[0].weights, mods[1].weights), "deterministic: not repeatable"
        assert torch.equal(mods[0].weights, mods[2].weights), f"step {i}: graph != eager"
        # fp64 reference of this step from the eager module's weights before it
        G = torch.zeros(rows, D, dtype=torch.float64, device="cuda")
        G.index_add_(0, idx, grad.double()[torch.arange(B * L, device="cuda") // L])
        n = torch.bincount(idx, minlength=rows)
        t = n > 0
        gmax = grad.abs().max().item()
        err = 12 * 2.0**-24 * n[t].double() * gmax  # fp32 sum of n terms, worst case
        if kind == "sgd":
            want = w0[t] - lr * G[t]
            tol = lr * err + 1e-5
        else:
            mom = m0[t] + (G[t] ** 2).mean(1)
            want = w0[t] - lr * G[t] / (mom.sqrt() + 1e-8)[:, None]
            tol = 4 * lr * err / mom.sqrt() + 1e-5  # G error also enters the momentum
            torch.testing.assert_close(mods[0].momentum.double()[t], mom, rtol=1e-4, atol=1e-6)
        got = mods[0].weights.double().view(rows, D)[t]
        bad = ((got - want).abs().amax(1) > tol).nonzero()
        assert bad.numel() == 0, f"step {i}: {bad.numel()} rows off, e.g. n={n[t][bad[0]].item()}"
    assert any(e["graph"] is not None for e in mods[2]._graphs.values())


def test_gpu_forward_feature_groups_and_backward_kernel_count():
    """pooling_factors: one-hot and multi-hot features in two launches, output vs the oracle;
    once the first step has tuned the keys tiles, one backward runs 5 Triton kernels (keys per
    feature group, tiles, hot-row carries - ~3,000 positions span several hot blocks -, hot
    rows) plus torch.sort's passes, no compaction, and one gather of the bags into sorted
    order where the arch table asks for it (``bwd_bag_sorted``)."""
    import rocmtrain.kernels.tbe_backward as tb

    cfg, _ = tb.backward_config(tb._device_info(0), max_dim=max(d for _, d in TABLES))
    fmap = [0, 1, 0, 2, 3]
    m = TableBatchedEmbeddingBags(TABLES, feature_table_map=fmap, backend="triton",
                                  pooling_factors=[1, 4, 1, 4, 2], cuda_graph=False,
                                  device="cuda")  # fmt: skip
    case = make_case(TABLES, fmap, B=300, seed=12, max_len=5)
    m(case.indices.cuda(), case.offsets.cuda()).sum().backward()  # tunes the keys tiles
    w0 = [w.cpu().clone() for w in m.split_embedding_weights()]
    out = m(case.indices.cuda(), case.offsets.cuda())
    assert_close(out.cpu(), oracle_forward(w0, case, "sum"), torch.float32, "grouped forward")
    from torch.profiler import ProfilerActivity, profile

    grad = torch.randn(out.shape, device="cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out.backward(grad)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if "CUDA" in str(getattr(e, "device_type", ""))]
    triton_k = [n for n in names if n.startswith("_")]
    assert sorted(triton_k) == ["_bwd_hot_carry_kernel", "_bwd_hot_kernel", "_bwd_tile_kernel",
                                "_keys_kernel", "_keys_kernel"], names  # fmt: skip
    assert not any("nonzero" in n or "flag_kernel" in n for n in names), names
    assert sum("index_elementwise" in n for n in names) == int(cfg.bag_sorted), names
    print(f"backward GPU launches: {len(names)}: {names}")


@pytest.mark.parametrize("wdtype", [torch.float32, torch.float16])
def test_gpu_every_forward_candidate_matches_oracle(wdtype):
    """Every tile the autotuner may pick on this GPU (each with and without the next-step index
    prefetch) compiles and gives the fp64 oracle's pooled rows, bags of 0 to 40 ids."""
    import rocmtrain.kernels.tbe_forward as tf
    from rocmtrain.kernels.arch import forward_candidates

    m = TableBatchedEmbeddingBags(TABLES, feature_table_map=FMAP, weights_dtype=wdtype,
                                  backend="triton", device="cuda")  # fmt: skip
    case = make_case(TABLES, FMAP, B=301, seed=5, max_len=40)
    w0 = [w.cpu().clone() for w in m.split_embedding_weights()]
    ref = oracle_forward(w0, case, "sum")
    lay, w = m.layout, m.weights.data
    idx, off = case.indices.cuda(), case.offsets.cuda()
    cands = forward_candidates(tf._device_info(0), max_dim=lay.max_dim, avg_len=20.0,
                               elem_bytes=w.element_size())  # fmt: skip
    assert {c.prefetch for c in cands} == {False, True}
    for cfg in cands:
        out = torch.full((case.B, lay.total_dim), float("nan"), device="cuda")
        tf._launch(cfg, lay, w, idx, off, None, out, "sum", case.B)
        assert_close(out.cpu(), ref, torch.float32, f"gpu forward {cfg}", terms=40)
