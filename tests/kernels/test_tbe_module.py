"""TableBatchedEmbeddingBags (torch and Triton backends) against an independent fp64 oracle."""

from __future__ import annotations

import math
import os

import pytest
import torch
from tbe_oracle import TOL, assert_close, make_case, oracle_forward, oracle_step

from rocmtrain.kernels import OptimizerSpec, TableBatchedEmbeddingBags

# Triton on CPU tensors needs the interpreter (tests/kernels/conftest.py sets it on CPU-only
# machines; on a GPU machine test_tbe_gpu.py covers the compiled kernels instead).
BACKENDS = [
    "torch",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(
            os.environ.get("TRITON_INTERPRET") != "1",
            reason="Triton on CPU tensors needs TRITON_INTERPRET=1 (GPU runs: test_tbe_gpu.py)",
        ),
    ),
]
# D multiple of 4 but not a power of two; feature 2 shares table 0 with feature 0
TABLES = [(40, 12), (30, 20), (25, 36)]
FMAP = [0, 1, 0, 2]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _module(backend, wdtype=torch.float32, **kw):
    return TableBatchedEmbeddingBags(
        TABLES, feature_table_map=FMAP, backend=backend, weights_dtype=wdtype, **kw
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("wdtype", DTYPES)
@pytest.mark.parametrize("pooling,psw", [("sum", False), ("mean", True), ("sum", True)])
def test_forward_matches_oracle(backend, wdtype, pooling, psw):
    m = _module(backend, wdtype, pooling=pooling, output_dtype=torch.float32)
    case = make_case(TABLES, FMAP, B=37, seed=1, psw=psw)
    out = m(case.indices, case.offsets, case.psw)
    assert out.shape == (37, 12 + 20 + 12 + 36) and out.dtype == torch.float32
    ref = oracle_forward([w.clone() for w in m.split_embedding_weights()], case, pooling)
    assert_close(out, ref, torch.float32, f"forward {wdtype} {pooling}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("odtype", DTYPES)
def test_forward_output_dtype_513_bags_int32(backend, odtype):
    m = _module(backend, torch.float32, output_dtype=odtype)
    case = make_case(TABLES, FMAP, B=513, seed=2, max_len=2, idx_dtype=torch.int32)
    out = m(case.indices, case.offsets)
    assert out.dtype == odtype
    ref = oracle_forward([w.clone() for w in m.split_embedding_weights()], case, "sum")
    assert_close(out, ref, odtype, f"forward out={odtype}")


def _oracle_states(m):
    return [{k: v.double().clone() for k, v in s.items()} for s in m.split_optimizer_states()]


OPTS = {
    "sgd": dict(kind="sgd", lr=0.3, weight_decay=0.01),
    "rowwise_adagrad": dict(kind="rowwise_adagrad", lr=0.2, eps=1e-6),
    "adam": dict(kind="adam", lr=0.05, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.01),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", list(OPTS))
@pytest.mark.parametrize("wdtype", DTYPES)
def test_fused_step_matches_oracle(backend, kind, wdtype):
    opt = OPTS[kind]
    m = _module(backend, wdtype, optimizer=OptimizerSpec(**opt), pooling="mean", seed=3)
    for step in (1, 2):  # two steps: Adagrad/Adam state carries over, Adam bias correction
        case = make_case(TABLES, FMAP, B=19, seed=10 + step, psw=True, max_len=5)
        psw = case.psw.clone().requires_grad_(True)
        w0 = [w.clone() for w in m.split_embedding_weights()]
        s0 = _oracle_states(m)
        out = m(case.indices, case.offsets, psw)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(step))
        out.backward(grad)
        ref_w, ref_s, ref_dpsw = oracle_step(w0, s0, case, grad, "mean", opt, step)
        assert m.weights.grad is None
        # fp32 weights round only in fp32; fp16/bf16 stores round (stochastically) once
        for t, w in enumerate(m.split_embedding_weights()):
            assert_close(w, ref_w[t], wdtype, f"{kind} step {step} table {t} weights")
            for name, st in m.split_optimizer_states()[t].items():
                assert st.dtype == torch.float32
                assert_close(st, ref_s[t][name], wdtype, f"{kind} table {t} {name}")
        assert_close(psw.grad, ref_dpsw, torch.float32, "d per_sample_weights")


@pytest.mark.parametrize("backend", BACKENDS)
def test_hot_row_and_duplicates(backend):
    """One row repeated 1e4 times in a bag plus duplicates elsewhere: one exact SGD update."""
    opt = dict(kind="rowwise_adagrad", lr=0.1)
    m = _module(backend, optimizer=OptimizerSpec(**opt))
    case = make_case(TABLES, FMAP, B=8, seed=4, hot_row=10_000, max_len=6)
    w0 = [w.clone() for w in m.split_embedding_weights()]
    s0 = _oracle_states(m)
    out = m(case.indices, case.offsets)
    ref = oracle_forward(w0, case, "sum")
    assert_close(out, ref, torch.float32, "hot-row forward", terms=10_000)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)) * 1e-3
    out.backward(grad)
    ref_w, ref_s, _ = oracle_step(w0, s0, case, grad, "sum", opt, 1)
    for t, w in enumerate(m.split_embedding_weights()):
        assert_close(w, ref_w[t], torch.float32, f"hot-row table {t}", terms=10_000)
        assert_close(m.split_optimizer_states()[t]["momentum"], ref_s[t]["momentum"],
                     torch.float32, "hot-row momentum", terms=10_000)  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [40, -1])
def test_out_of_range_index_names_feature(backend, bad):
    m = _module(backend)
    case = make_case(TABLES, FMAP, B=4, seed=5, empty_frac=0.0, max_len=2)
    idx = case.indices.clone()
    B = 4
    pos = int(case.offsets[2 * B + 1])  # first index of feature 2, sample 1 (table 0: 40 rows)
    idx[pos] = bad
    with pytest.raises(IndexError, match=rf"feature 2 \(table 0, 40 rows\) has index {bad}"):
        m(idx, case.offsets)


def _count_host_syncs(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")


@pytest.mark.parametrize("backend", BACKENDS)
def test_deferred_bounds_check_counts_on_device_and_reports_within_k(backend):
    """bounds_check_every=3: no host sync on the forwards in between, a bad id pools as zero and
    is reported on the 3rd forward by count (it was in an earlier batch) or by name (in this
    one); the count starts again after a report."""
    from tbe_oracle import Case

    m = _module(backend, bounds_check_every=3)
    case = make_case(TABLES, FMAP, B=4, seed=5, empty_frac=0.0, max_len=2)
    pos = int(case.offsets[2 * 4 + 1])  # feature 2, sample 1 (table 0: 40 rows)
    bad = case.indices.clone()
    bad[pos] = 40
    w = [w.clone() for w in m.split_embedding_weights()]
    out = m(bad, case.offsets)  # forward 1: the bad id, no error yet
    padded = [torch.cat([w[0], torch.zeros(1, 12)])] + w[1:]  # row 40 of table 0 reads zeros
    ref = oracle_forward(padded, Case([(41, 12)] + TABLES[1:], FMAP, 4, bad, case.offsets, None),
                         "sum")  # fmt: skip
    assert_close(out, ref, torch.float32, "bad id pooled as zero")
    assert _count_host_syncs(lambda: m(case.indices, case.offsets)) == 0  # forward 2
    with pytest.raises(IndexError, match=r"1 embedding indices out of range .* last 3 forwards"):
        m(case.indices, case.offsets)  # forward 3 reads the count: one sync
    m(case.indices, case.offsets)  # forwards 4, 5: the count was reset
    m(case.indices, case.offsets)
    with pytest.raises(IndexError, match=r"feature 2 \(table 0, 40 rows\) has index 40"):
        m(bad, case.offsets)  # forward 6 has the bad id in its own batch: named
    with pytest.raises(ValueError, match="bounds_check_every=0: use an int >= 1"):
        _module(backend, bounds_check_every=0)


def test_bad_offsets_and_args_are_clear():
    m = _module("torch")
    with pytest.raises(ValueError, match="F\\*B\\+1"):
        m(torch.zeros(3, dtype=torch.int64), torch.zeros(6, dtype=torch.int64))
    with pytest.raises(ValueError, match="offsets\\[-1\\] == len\\(indices\\)"):
        m(torch.zeros(3, dtype=torch.int64), torch.zeros(9, dtype=torch.int64))
    with pytest.raises(TypeError, match="int32 or int64"):
        m(torch.zeros(3), torch.zeros(9, dtype=torch.int64))
    with pytest.raises(ValueError, match="feature_table_map\\[1\\]=5"):
        TableBatchedEmbeddingBags([(4, 4)], feature_table_map=[0, 5])
    with pytest.raises(ValueError, match="OptimizerSpec.kind='lamb'"):
        OptimizerSpec(kind="lamb")


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_update_without_backward_and_views(backend):
    m = _module(backend, optimizer=OptimizerSpec("adam", lr=0.1))
    case = make_case(TABLES, FMAP, B=6, seed=6)
    before = m.weights.detach().clone()
    with torch.no_grad():
        m(case.indices, case.offsets)
    m(case.indices, case.offsets)  # forward with grad, no backward
    assert torch.equal(m.weights, before)
    # split views alias the flat buffers
    m.split_embedding_weights()[1][3].fill_(7.0)
    off = m.layout.weights_offsets[1] + 3 * 20
    assert torch.all(m.weights[off : off + 20] == 7.0)
    m.split_optimizer_states()[2]["exp_avg"][0, 0] = 5.0
    assert m.exp_avg[m.layout.weights_offsets[2]] == 5.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_stochastic_rounding_is_unbiased(backend):
    """bf16 weight 1.0, SGD step of +0.001 (1/8 of an ulp): round-to-nearest never moves it; the
    mean of stochastically rounded results is 1.001."""
    rows = 4096
    res = {}
    for sr in (True, False):
        m = TableBatchedEmbeddingBags([(rows, 4)], optimizer=OptimizerSpec("sgd", lr=1.0),
                                      weights_dtype=torch.bfloat16, stochastic_rounding=sr,
                                      backend=backend, seed=11)  # fmt: skip
        m.weights.data.fill_(1.0)
        idx = torch.arange(rows)
        off = torch.arange(rows + 1)
        out = m(idx, off)
        out.backward(torch.full_like(out, -0.001))
        res[sr] = m.weights.double()
    assert torch.all(res[False] == 1.0)
    vals = res[True]
    assert set(vals.unique().tolist()) <= {1.0, 1.0078125}
    # mean 1.001; std of the mean = ulp*sqrt(p(1-p)/n) ~ 4e-5 -> 5 sigma = 2e-4
    assert abs(vals.mean().item() - 1.001) < 2e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_deterministic_mode_is_bitwise_repeatable(backend):
    case = make_case(TABLES, FMAP, B=16, seed=8, hot_row=700)
    results = []
    for _ in range(2):
        m = _module(backend, optimizer=OptimizerSpec("rowwise_adagrad", lr=0.1),
                    deterministic=True, seed=1)  # fmt: skip
        out = m(case.indices, case.offsets)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
        results.append((m.weights.clone(), m.momentum.clone()))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_tolerance_table_covers_dtypes():
    assert set(TOL) == set(DTYPES)


def test_state_dict_round_trip_resumes_identically():
    """weights, fp32 states and the step count travel in state_dict: a resumed module takes the
    same next step as the uninterrupted one (Adam's bias correction depends on the step)."""
    opt = OptimizerSpec("adam", lr=0.05)
    a = _module("torch", optimizer=opt, seed=2)
    cases = [make_case(TABLES, FMAP, B=6, seed=s) for s in (20, 21)]
    out = a(cases[0].indices, cases[0].offsets)
    out.backward(torch.ones_like(out))
    sd = {k: v.clone() if torch.is_tensor(v) else v for k, v in a.state_dict().items()}
    assert {"weights", "exp_avg", "exp_avg_sq"} <= set(sd)
    b = _module("torch", optimizer=opt, seed=99)
    b.load_state_dict(sd)
    assert b.step == 1
    for m in (a, b):
        out = m(cases[1].indices, cases[1].offsets)
        out.backward(torch.ones_like(out))
    assert torch.equal(a.weights, b.weights) and torch.equal(a.exp_avg_sq, b.exp_avg_sq)


# Stochastic rounding, every optimizer x 16-bit dtype: all rows start at 1.0 and get the same
# gradient, so every element's fp32 update is the same value v (fp64 oracle). SR stores one of the
# two dtype neighbours lo <= v < hi = lo + ulp, hi with probability p = (v - lo) / ulp, so the
# mean of n stored elements has E = v and std ulp * sqrt(p (1 - p) / n); the bound is 5 std plus
# the fp32 arithmetic of v (a few fp32 ulps, 1e-6 here). Round-to-nearest must store the nearer
# neighbour every time.
SR_OPTS = {  # lr = None: set to 0.37 ulp (an Adagrad/Adam first step moves by ~lr)
    "sgd": dict(kind="sgd", lr=1.0),
    "rowwise_adagrad": dict(kind="rowwise_adagrad", lr=None, eps=1e-8),
    "adam": dict(kind="adam", lr=None, beta1=0.9, beta2=0.999, eps=1e-8),
}
ULP_AT_1 = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("wdtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", list(SR_OPTS))
def test_stochastic_rounding_statistics(backend, wdtype, kind):
    rows, D = 2048, 4
    ulp = ULP_AT_1[wdtype]
    opt = dict(SR_OPTS[kind])
    if opt["lr"] is None:
        opt["lr"] = 0.37 * ulp
    g_val = -0.37 * ulp if kind == "sgd" else -0.5  # v = 1 + ~0.37 ulp
    one = make_case([(1, D)], [0], B=1, max_len=1, empty_frac=0.0)
    one.indices, one.offsets = torch.zeros(1, dtype=torch.int64), torch.tensor([0, 1])
    s0 = [{"sgd": {}, "rowwise_adagrad": {"momentum": torch.zeros(1, dtype=torch.float64)},
           "adam": {"exp_avg": torch.zeros(1, D, dtype=torch.float64),
                    "exp_avg_sq": torch.zeros(1, D, dtype=torch.float64)}}[kind]]  # fmt: skip
    ref_w, _, _ = oracle_step([torch.ones(1, D)], s0, one, torch.full((1, D), g_val), "sum", opt, 1)
    v = float(ref_w[0][0, 0])
    lo = 1.0 + math.floor((v - 1.0) / ulp) * ulp
    p = (v - lo) / ulp
    assert 0.05 < p < 0.95, "pick g/lr so that v falls strictly between two neighbours"
    res = {}
    for sr in (True, False):
        m = TableBatchedEmbeddingBags([(rows, D)], optimizer=OptimizerSpec(**opt),
                                      weights_dtype=wdtype, stochastic_rounding=sr,
                                      backend=backend, seed=5)  # fmt: skip
        m.weights.data.fill_(1.0)
        out = m(torch.arange(rows), torch.arange(rows + 1))
        out.backward(torch.full_like(out, g_val))
        res[sr] = m.weights.double()
    nearest = lo if p < 0.5 else lo + ulp
    assert torch.all(res[False] == nearest), "round-to-nearest must store the nearer neighbour"
    vals = res[True]
    assert set(vals.unique().tolist()) <= {lo, lo + ulp}
    n = vals.numel()
    bound = 5 * ulp * math.sqrt(p * (1 - p) / n) + 1e-6
    assert abs(vals.mean().item() - v) < bound, (vals.mean().item(), v, bound)
    frac_up = (vals == lo + ulp).double().mean().item()  # the same check on P(round up) = p
    assert abs(frac_up - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("D", [8, 12])
def test_stochastic_rounding_columns_are_independent(backend, D):
    """Each element of a row draws its own rounding: P(two columns both round up) = p^2 for
    columns of one 4-column noise group, of neighbouring groups and of neighbouring rows (noise
    shared between them would make it p). D=12: rows not a power of two wide (padded tiles)."""
    rows, wdtype = 4096, torch.float16
    ulp = ULP_AT_1[wdtype]
    g_val = -0.37 * ulp  # SGD lr=1: v = 1 + 0.37 ulp
    m = TableBatchedEmbeddingBags([(rows, D)], optimizer=OptimizerSpec(kind="sgd", lr=1.0),
                                  weights_dtype=wdtype, backend=backend, seed=11)  # fmt: skip
    m.weights.data.fill_(1.0)
    out = m(torch.arange(rows), torch.arange(rows + 1))
    out.backward(torch.full_like(out, g_val))
    up = (m.split_embedding_weights()[0].double() > 1.0).double()  # [rows, D]
    p = up.mean().item()
    assert abs(p - 0.37) < 5 * math.sqrt(0.37 * 0.63 / up.numel())
    pairs = {"same group": (up[:, 0], up[:, 1]), "group edge": (up[:, 3], up[:, 4]),
             "row edge": (up[:-1, D - 1], up[1:, 0]), "far": (up[:, 2], up[:, D - 1])}  # fmt: skip
    for what, (a, b) in pairs.items():
        both, n = (a * b).mean().item(), a.numel()
        sigma = math.sqrt(p * p * (1 - p * p) / n)
        assert abs(both - p * p) < 5 * sigma, (what, both, p * p)


@pytest.mark.parametrize("backend", BACKENDS)
def test_forward_feature_groups_one_hot_and_multi_hot(backend):
    """pooling_factors split the features into a one-hot and a multi-hot launch, each with its
    own tile; the output (every column block in place) matches the oracle."""
    tables = [(40, 12), (30, 20), (25, 36)]
    fmap = [0, 1, 0, 2]
    m = TableBatchedEmbeddingBags(tables, feature_table_map=fmap, backend=backend,
                                  pooling_factors=[1.0, 3.0, 1.0, 2.5])  # fmt: skip
    case = make_case(tables, fmap, B=23, seed=31, max_len=4)
    out = m(case.indices, case.offsets)
    ref = oracle_forward([w.clone() for w in m.split_embedding_weights()], case, "sum")
    assert_close(out, ref, torch.float32, "grouped forward")
    with pytest.raises(ValueError, match="one mean bag length per feature"):
        TableBatchedEmbeddingBags(tables, feature_table_map=fmap, pooling_factors=[1.0])


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the interpreter")
def test_backward_launches(monkeypatch):
    """One Triton backward = the keys kernel once per feature group, then 2 kernel launches
    (tile reduce + update, hot-row combine) and one torch.sort; no flags / nonzero_static /
    gather passes and no host sync."""
    import rocmtrain.kernels.tbe_backward as tb

    launched = []
    for k in (tb._keys_kernel, tb._bwd_tile_kernel, tb._bwd_hot_kernel):
        orig = k.run

        def run(*a, _orig=orig, _name=k.__name__, **kw):
            launched.append(_name)
            return _orig(*a, **kw)

        monkeypatch.setattr(k, "run", run)
    m = _module("triton", optimizer=OptimizerSpec("rowwise_adagrad", lr=0.1))
    case = make_case(TABLES, FMAP, B=16, seed=9, hot_row=600)
    out = m(case.indices, case.offsets)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out.backward(grad)
    n_groups = len(m._groups[torch.device("cpu")])
    assert n_groups == 2  # the case mixes one-hot and multi-hot features
    assert launched == ["_keys_kernel"] * n_groups + ["_bwd_tile_kernel", "_bwd_hot_kernel"]
    ops = [e.key for e in prof.key_averages()]
    assert sum(e.count for e in prof.key_averages() if e.key == "aten::sort") == 1
    for banned in ("aten::nonzero_static", "aten::nonzero", "aten::index", "aten::item",
                   "aten::_local_scalar_dense"):  # fmt: skip
        assert banned not in ops, f"{banned} in the backward"


def _fixed_length_case(lengths_per_feature, B, seed):
    """A KJT batch whose feature f has exactly ``lengths_per_feature[f]`` ids in every bag."""
    from tbe_oracle import Case

    g = torch.Generator().manual_seed(seed)
    vals = [torch.randint(0, TABLES[FMAP[f]][0], (B * n,), generator=g)
            for f, n in enumerate(lengths_per_feature)]  # fmt: skip
    lengths = torch.tensor(lengths_per_feature).repeat_interleave(B)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return Case(list(TABLES), list(FMAP), B, torch.cat(vals), offsets, None)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the interpreter")
def test_forward_launch_plan_built_once_per_shape(monkeypatch):
    """The Triton forward builds its launches (tiles, grids, constexprs) once per batch shape and
    reuses them: later calls of a seen (B, per-sample weights) shape build nothing, a new batch
    size or adding per-sample weights builds its own plan, and every call matches the oracle."""
    import rocmtrain.kernels.tbe_forward as tf

    built = []
    orig = tf._launch_step
    monkeypatch.setattr(tf, "_launch_step", lambda *a, **k: built.append(a[5]) or orig(*a, **k))
    m = _module("triton", pooling_factors=[1.0, 3.0, 1.0, 3.0])  # two feature groups
    calls = [(16, 1, False), (16, 2, False), (8, 3, False), (16, 4, True), (16, 5, False)]
    for B, seed, psw in calls:
        case = make_case(TABLES, FMAP, B=B, seed=seed, psw=psw)
        out = m(case.indices, case.offsets, case.psw)
        ref = oracle_forward([w.clone() for w in m.split_embedding_weights()], case, "sum")
        assert_close(out, ref, torch.float32, f"forward B={B} seed={seed} psw={psw}")
    assert built == [16, 16, 8, 8, 16, 16]  # two launches (groups) per new shape, none on repeats


def test_feature_groups_measured_on_first_batch():
    """Without pooling_factors the Triton module splits the features by the first non-empty
    batch's mean bag lengths (features 0 and 2 one-hot, 1 and 3 multi-hot here) and keeps that
    split for later batches of other lengths; forward and fused step still match the oracle."""
    opt = dict(kind="rowwise_adagrad", lr=0.1)
    m = _module("triton", optimizer=OptimizerSpec(**opt))
    empty = torch.zeros(1, dtype=torch.int64)  # F*B + 1 offsets with B = 0
    m(torch.zeros(0, dtype=torch.int64), empty)  # B = 0: nothing measured
    assert torch.device("cpu") not in m._groups
    first = _fixed_length_case([1, 3, 1, 2], B=6, seed=40)
    m(first.indices, first.offsets)
    got = [(ids.tolist(), avg) for ids, avg, _ in m._groups[torch.device("cpu")]]
    assert got == [([0, 2], 1.0), ([1, 3], 2.5)]
    later = make_case(TABLES, FMAP, B=9, seed=41, max_len=5, hot_row=300)  # other lengths
    w0 = [w.clone() for w in m.split_embedding_weights()]
    s0 = _oracle_states(m)
    out = m(later.indices, later.offsets)
    assert [ids.tolist() for ids, _, _ in m._groups[torch.device("cpu")]] == [[0, 2], [1, 3]]
    assert_close(out, oracle_forward(w0, later, "sum"), torch.float32, "forward", terms=300)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    out.backward(grad)
    ref_w, ref_s, _ = oracle_step(w0, s0, later, grad, "sum", opt, 1)
    for t, w in enumerate(m.split_embedding_weights()):
        assert_close(w, ref_w[t], torch.float32, f"table {t}", terms=300)
        assert_close(m.split_optimizer_states()[t]["momentum"], ref_s[t]["momentum"],
                     torch.float32, f"momentum {t}", terms=300)  # fmt: skip


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the interpreter")
def test_every_keys_tile_candidate_writes_the_same_keys_and_bags():
    """Each keys-kernel tile the GPU autotuner may pick (one-hot and multi-hot, H200 and MI300X
    tables) writes, per feature group, exactly the row keys and packed bags computed here from
    the offsets by plain loops (out-of-range ids get the sentinel)."""
    import rocmtrain.kernels.tbe_backward as tb
    from rocmtrain.kernels.arch import keys_candidates
    from rocmtrain.platform import DeviceInfo

    m = _module("triton")
    case = make_case(TABLES, FMAP, B=13, seed=42, max_len=6, hot_row=40)
    idx = case.indices.clone()
    idx[3], idx[-1] = -1, 10_000  # out of range: sentinel keys
    F, B, N = len(FMAP), case.B, idx.numel()
    lay, meta = m.layout, m.layout.meta(torch.device("cpu"))
    shift = max(1, (B - 1).bit_length())
    off = case.offsets.tolist()
    want_keys, want_bags = [0] * N, [0] * N
    for f in range(F):
        t = FMAP[f]
        for b in range(B):
            for p in range(off[f * B + b], off[f * B + b + 1]):
                i = int(idx[p])
                ok = 0 <= i < TABLES[t][0]
                want_keys[p] = sum(r for r, _ in TABLES[:t]) + i if ok else lay.total_rows
                want_bags[p] = f << shift | b
    groups = [([0, 2], 1.0), ([1, 3], 3.5)]
    h200 = DeviceInfo(0, "H200", "cuda", "sm_90", 32, 132, 0)
    mi300 = DeviceInfo(0, "MI300X", "rocm", "gfx942", 64, 304, 0)
    for info in (h200, mi300):
        for feats, avg in groups:
            cands = keys_candidates(info, avg_len=avg)
            assert len(cands) >= 4 and len(set(cands)) == len(cands)
            for c in cands:
                keys = torch.full((N,), -7, dtype=torch.int32)
                bags = torch.full((N,), -7, dtype=torch.int32)
                ft = torch.tensor(feats, dtype=torch.int32)
                tb._KEYS.run(
                    (tb.cdiv(B, c.bags), len(feats)), idx, case.offsets, keys, bags, meta.rows,
                    meta.row_offset, ft, B, shift, lay.total_rows, BAGS=c.bags,
                    BLOCK_L=c.block_l, num_warps=c.num_warps,
                )  # fmt: skip
                mine = [p for f in feats for p in range(off[f * B], off[(f + 1) * B])]
                assert [int(keys[p]) for p in mine] == [want_keys[p] for p in mine], c
                assert [int(bags[p]) for p in mine] == [want_bags[p] for p in mine], c
                others = sorted(set(range(N)) - set(mine))
                assert (keys[others] == -7).all() and (bags[others] == -7).all(), c


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the interpreter")
@pytest.mark.parametrize("kind,steps", [("rowwise_adagrad", 1), ("adam", 1),
                                        ("rowwise_adagrad", 3), ("sgd", 4)])  # fmt: skip
def test_backward_gpu_tiles_and_scan_match_oracle(monkeypatch, kind, steps):
    """The GPU configuration of the backward (sm_90 tiles, the segmented tl.associative_scan that
    the interpreter normally replaces) in the interpreter on a tiny case: duplicates, a row cut
    across several tiles (partials + hot-row kernel), psw, mean pooling, vs the fp64 oracle;
    one step per tile program, or several (runs carried from step to step)."""
    import dataclasses

    import rocmtrain.kernels.arch as arch
    import rocmtrain.kernels.tbe_backward as tb
    import rocmtrain.kernels.tbe_forward as tf
    from rocmtrain.platform import DeviceInfo

    h200 = DeviceInfo(0, "H200", "cuda", "sm_90", 32, 132, 1 << 37)
    monkeypatch.setattr(tb, "_device_info", lambda idx: h200)
    monkeypatch.setattr(tf, "_device_info", lambda idx: h200)
    p = dataclasses.replace(arch.ARCH_TABLE["sm_90"], bwd_steps=steps)
    monkeypatch.setitem(arch.ARCH_TABLE, "sm_90", p)
    tables, fmap = [(50, 4), (9, 4)], [0, 1, 0]
    opt = OPTS[kind]
    m = TableBatchedEmbeddingBags(tables, feature_table_map=fmap, backend="triton",
                                  optimizer=OptimizerSpec(**opt), pooling="mean", seed=2)  # fmt: skip
    case = make_case(tables, fmap, B=10, seed=41, psw=True, max_len=6, hot_row=150)
    assert tb.backward_config(h200, max_dim=4)[1] == 8  # 150 hot positions span 18+ tiles
    psw = case.psw.clone().requires_grad_(True)
    w0 = [w.clone() for w in m.split_embedding_weights()]
    s0 = _oracle_states(m)
    out = m(case.indices, case.offsets, psw)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    out.backward(grad)
    ref_w, ref_s, ref_dpsw = oracle_step(w0, s0, case, grad, "mean", opt, 1)
    for t, w in enumerate(m.split_embedding_weights()):
        assert_close(w, ref_w[t], torch.float32, f"{kind} table {t}", terms=150)
        for name, st in m.split_optimizer_states()[t].items():
            assert_close(st, ref_s[t][name], torch.float32, f"{kind} {name}", terms=150)
    assert_close(psw.grad, ref_dpsw, torch.float32, "d psw")


def _very_hot_case(tables, fmap, *, B, L0, hot, seed, psw=True):
    """Feature 0: B bags of L0 uniform indices with ``hot`` positions (scattered over the bags)
    overwritten by row 7, plus a warm row (L0 * 2 // 5 occurrences) and a medium one (40);
    the other features: short uniform bags. Returns an oracle Case."""
    from tbe_oracle import Case

    g = torch.Generator().manual_seed(seed)
    F = len(fmap)
    lengths = torch.randint(0, 4, (F * B,), generator=g)
    lengths[:B] = L0
    vals = []
    for f in range(F):
        rows = tables[fmap[f]][0]
        n = int(lengths[f * B : (f + 1) * B].sum())
        v = torch.randint(0, rows, (n,), generator=g)
        if f == 0:
            pos = torch.randperm(n, generator=g)
            v[pos[:hot]] = 7
            v[pos[hot : hot + L0 * 2 // 5]] = 11
            v[pos[hot + L0 * 2 // 5 : hot + L0 * 2 // 5 + 40]] = 13
        vals.append(v)
    indices = torch.cat(vals)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    w = torch.rand(indices.numel(), generator=g) * 2 - 0.5 if psw else None
    return Case(list(tables), list(fmap), B, indices, offsets, w)


def _check_step_vs_oracle(m, case, opt, pooling, terms, what):
    psw = case.psw.clone().requires_grad_(True) if case.psw is not None else None
    w0 = [w.clone() for w in m.split_embedding_weights()]
    s0 = _oracle_states(m)
    out = m(case.indices, case.offsets, psw)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)) * 1e-3
    out.backward(grad)
    ref_w, ref_s, ref_dpsw = oracle_step(w0, s0, case, grad, pooling, opt, 1)
    wdtype = m.weights.dtype
    for t, w in enumerate(m.split_embedding_weights()):
        assert_close(w, ref_w[t], wdtype, f"{what}: table {t} weights", terms=terms)
        for name, st in m.split_optimizer_states()[t].items():
            assert_close(st, ref_s[t][name], wdtype, f"{what}: table {t} {name}", terms=terms)
    if psw is not None:
        assert_close(psw.grad, ref_dpsw, torch.float32, f"{what}: d psw")
    return m.weights.detach().clone()


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the interpreter")
@pytest.mark.parametrize("kind,wdtype", [("sgd", torch.float32), ("rowwise_adagrad", torch.float32),
                                         ("adam", torch.float32),
                                         ("rowwise_adagrad", torch.bfloat16)])  # fmt: skip
def test_very_hot_row_among_uniform_matches_oracle(kind, wdtype):
    """One row 1e4 times at random positions among uniform indices, a warm row (~1/3 of a tile
    at the interpreter's 128-position tiles x 4-tile hot blocks) and a medium one: the hot row
    spans ~20 hot blocks (carries walked 4 blocks at a time), the others end inside a block.
    Every optimizer, fp32 and bf16 weights, psw grads, vs the fp64 oracle; deterministic mode
    is bitwise repeatable."""
    tables, fmap = [(5000, 12), (3000, 20), (2000, 36)], [0, 1, 0, 2]
    case = _very_hot_case(tables, fmap, B=48, L0=240, hot=10_000, seed=21)
    opt = OPTS[kind]
    mods = [TableBatchedEmbeddingBags(tables, feature_table_map=fmap, backend="triton",
                                      optimizer=OptimizerSpec(**opt), weights_dtype=wdtype,
                                      deterministic=True, seed=3) for _ in range(2)]  # fmt: skip
    w = _check_step_vs_oracle(mods[0], case, opt, "sum", 10_000, f"very hot {kind}")
    out = mods[1](case.indices, case.offsets, case.psw)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(5)) * 1e-3)
    assert torch.equal(w, mods[1].weights), "deterministic mode is not bitwise repeatable"


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the interpreter")
@pytest.mark.parametrize("hot_tiles,hot_block,kind,steps,piece", [
    (16, 32, "rowwise_adagrad", 1, 2), (2, 2, "adam", 1, 1), (2, 2, "rowwise_adagrad", 4, 1),
    (2, 2, "rowwise_adagrad", 4, 2), (4, 2, "sgd", 8, 2), (4, 2, "adam", 8, 4)])  # fmt: skip
def test_hot_row_gpu_tiles_two_level_reduction(monkeypatch, hot_tiles, hot_block, kind, steps,
                                               piece):  # fmt: skip
    """The GPU configuration (8-position steps, scan) in the interpreter with a row seen 600
    times: at one step per tile program 75 tiles = 5 hot blocks of 16 (the H200 table), or 38
    blocks of 2 with the carry walk taking 2 blocks per step (19 steps); at 4 or 8 steps per
    program (32 / 64 positions) 19 / 10 programs in blocks of 2 / 4, their interior pieces
    gathering 1, 2 or 4 steps per loop iteration; plus rows ending inside one block; vs the
    oracle."""
    import dataclasses

    import rocmtrain.kernels.arch as arch
    import rocmtrain.kernels.tbe_backward as tb
    import rocmtrain.kernels.tbe_forward as tf
    from rocmtrain.platform import DeviceInfo

    h200 = DeviceInfo(0, "H200", "cuda", "sm_90", 32, 132, 1 << 37)
    monkeypatch.setattr(tb, "_device_info", lambda idx: h200)
    monkeypatch.setattr(tf, "_device_info", lambda idx: h200)
    p = dataclasses.replace(arch.ARCH_TABLE["sm_90"], hot_tiles=hot_tiles, hot_block=hot_block,
                            bwd_steps=steps, bwd_piece_steps=piece)  # fmt: skip
    monkeypatch.setitem(arch.ARCH_TABLE, "sm_90", p)
    cfg, step = tb.backward_config(h200, max_dim=4)
    assert (step, cfg.steps, cfg.hot_tiles, cfg.hot_block) == (8, steps, hot_tiles, hot_block)
    assert cfg.piece_steps == min(piece, steps)
    tables, fmap = [(300, 4), (9, 4)], [0, 1, 0]
    case = _very_hot_case(tables, fmap, B=6, L0=110, hot=600, seed=4)
    opt = OPTS[kind]
    m = TableBatchedEmbeddingBags(tables, feature_table_map=fmap, backend="triton",
                                  optimizer=OptimizerSpec(**opt), seed=2)  # fmt: skip
    _check_step_vs_oracle(m, case, opt, "sum", 600, f"gpu tiles {kind} ht={hot_tiles}")


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the interpreter")
@pytest.mark.parametrize("arch_name", ["sm_90", "gfx942"])
def test_every_forward_candidate_matches_oracle(arch_name):
    """Every tile the autotuner may pick (bags, BLOCK_L, lanes, waves_per_eu, and each with and
    without the next-step index prefetch) gives the oracle's pooled rows on bags of 0 to 9 ids,
    where a bag takes several loop steps and the prefetch reads past a bag's last step."""
    import rocmtrain.kernels.tbe_forward as tf
    from rocmtrain.kernels.arch import forward_candidates
    from rocmtrain.platform import DeviceInfo

    info = {"sm_90": DeviceInfo(0, "H200", "cuda", "sm_90", 32, 132, 1 << 37),
            "gfx942": DeviceInfo(0, "MI300X", "rocm", "gfx942", 64, 304, 1 << 37)}[arch_name]  # fmt: skip
    m = _module("triton")
    case = make_case(TABLES, FMAP, B=11, seed=17, max_len=9)
    lay, w = m.layout, m.weights.data
    cands = forward_candidates(info, max_dim=lay.max_dim, avg_len=4.0, elem_bytes=4)
    assert {c.prefetch for c in cands} == {False, True}
    ref = oracle_forward([t.clone() for t in m.split_embedding_weights()], case, "sum")
    for cfg in cands:
        out = torch.full((case.B, lay.total_dim), float("nan"))
        tf._launch(cfg, lay, w, case.indices, case.offsets, None, out, "sum", case.B)
        assert_close(out, ref, torch.float32, f"forward {cfg}")


def test_keys_kernel_keeps_its_measured_tile():
    """The backward's keys kernel does not follow the forward's tile table: on sm_90 it keeps
    128 lanes and up to 16 positions x 16 bags per program (the forward's 64-lane, 2-position
    multi-hot tile doubled its time on the H200); elsewhere the two tables agree."""
    from rocmtrain.kernels.arch import FWD_TILES, KEYS_TILES, forward_config, keys_config
    from rocmtrain.platform import DeviceInfo

    h200 = DeviceInfo(0, "H200", "cuda", "sm_90", 32, 132, 1 << 37)
    k = keys_config(h200, avg_len=32.0)
    assert (k.bags, k.block_l, k.num_warps) == (16, 16, 4)
    assert keys_config(h200, avg_len=1.0).block_l == 1
    f = forward_config(h200, max_dim=1, avg_len=32.0, elem_bytes=4)
    assert (f.block_l, f.num_warps) == (2, 2)  # the forward's own tile moved on
    assert {a for a in FWD_TILES if FWD_TILES[a] != KEYS_TILES[a]} == {"sm_90"}
