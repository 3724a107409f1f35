"""The CUDA-graph policy of TableBatchedEmbeddingBags' backward (``cuda_graph``), on CPU.

``torch.cuda``'s graph API is replaced by a fake that records the work a capture enqueues and
re-runs it on replay, and the Triton backward by a fake step, so the bookkeeping (warm-up on
static buffers, capture, replay, the LRU, "auto"'s give-up, a failed capture, the shared pool,
every step applied exactly once on the current inputs) is checked without a GPU. The real
graphs are checked bitwise against eager in test_tbe_gpu.py.
"""

from __future__ import annotations

import contextlib
import logging
import os

import pytest
import torch

from rocmtrain.kernels import OptimizerSpec, TableBatchedEmbeddingBags


class _FakeCuda:
    def __init__(self, monkeypatch):
        self.captures, self.replays, self.pools = 0, 0, []
        self.capturing, self.fail = None, False
        fake = self

        class Graph:
            def __init__(self):
                self.work = []

            def replay(self):
                fake.replays += 1
                for w in self.work:
                    w()

        @contextlib.contextmanager
        def graph(g, pool=None, capture_error_mode=None):
            assert capture_error_mode == "thread_local"
            fake.pools.append(pool)
            fake.capturing = g
            try:
                yield
            finally:
                fake.capturing = None
            if fake.fail:
                raise RuntimeError("operation not permitted when stream is capturing")
            fake.captures += 1

        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)

    def backward(self, layout, weights, states, go, idx, off, psw, *, scal, need_psw_grad, **kw):
        """A stand-in step: weights += sum(grad); d psw = idx + sum(offsets) (of the inputs it
        was given, i.e. the static buffers under a graph)."""
        out = torch.empty(idx.numel(), dtype=torch.float64) if need_psw_grad else None

        def work():
            weights.add_(go.sum())
            if out is not None:
                out.copy_(idx.double() + off.sum())

        if self.capturing is not None:
            self.capturing.work.append(work)  # a capture records, it does not run
        else:
            work()
        return out


def _module(mode):
    m = TableBatchedEmbeddingBags([(50, 4)], optimizer=OptimizerSpec("sgd"), backend="torch",
                                  cuda_graph=mode)  # fmt: skip
    m.weights.data.zero_()
    m._scal = torch.empty(8)
    return m


def _step(m, fake, n, seed, need_psw_grad=True):
    """One backward as the module runs it: graph path unless off, else eager. Returns how it
    ran ('eager' / 'graph-path') and checks the step was applied once, on these inputs."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 50, (n,), generator=g)
    off = torch.tensor([0, n])
    go = torch.randn(1, 4, generator=g)
    psw = torch.rand(n, generator=g)
    kw = dict(pooling="sum", spec=m.optimizer, step=1, stochastic_rounding=False,
              need_psw_grad=need_psw_grad, deterministic=True, seed=0)  # fmt: skip
    before = m.weights.detach().clone()
    done, out, how = False, None, "eager"
    if m.cuda_graph is not False:
        done, out = m._graphed_backward(fake.backward, (go, idx, off, psw), **kw)
        how = "graph-path" if done else "eager"
    if not done:
        out = fake.backward(m.layout, m.weights.data, m.states(), go, idx, off, psw,
                            scal=m._scal, **kw)  # fmt: skip
    torch.testing.assert_close(m.weights, before + go.sum(), rtol=0, atol=1e-6)
    if need_psw_grad:
        assert torch.equal(out, idx.double() + n), "d psw is not this step's"
    return how


def test_auto_captures_after_two_consecutive_calls_and_replays(monkeypatch):
    fake = _FakeCuda(monkeypatch)
    m = _module("auto")
    assert _step(m, fake, 30, 0) == "eager"  # first sight of the signature
    assert _step(m, fake, 30, 1) == "graph-path" and fake.captures == 0  # warm-up, static buffers
    assert _step(m, fake, 30, 2) == "graph-path" and (fake.captures, fake.replays) == (1, 1)
    assert _step(m, fake, 30, 3) == "graph-path" and (fake.captures, fake.replays) == (1, 2)
    assert _step(m, fake, 20, 4) == "eager"  # new signature
    assert _step(m, fake, 30, 5) == "graph-path" and fake.replays == 3  # captured one: replay
    assert _step(m, fake, 20, 6) == "eager"  # not consecutive: no warm-up yet
    assert _step(m, fake, 20, 7) == "graph-path"  # consecutive: warm-up
    assert _step(m, fake, 20, 8) == "graph-path" and fake.captures == 2
    assert _step(m, fake, 20, 9, need_psw_grad=False) == "eager"  # another kernel variant
    assert len(fake.pools) == 2 and fake.pools[0] is fake.pools[1], "graphs share one pool"
    assert len(m._graphs) == 2


def test_true_captures_every_signature_lru_bounded(monkeypatch):
    fake = _FakeCuda(monkeypatch)
    m = _module(True)
    for n in (10, 11, 12, 13, 14, 15):
        assert _step(m, fake, n, n) == "graph-path"  # warm-up on static buffers
        assert _step(m, fake, n, n + 100) == "graph-path"  # capture + replay
        assert _step(m, fake, n, n + 200) == "graph-path"  # replay
        assert len(m._graphs) <= TableBatchedEmbeddingBags._MAX_GRAPHS
    assert fake.captures == 6 and fake.replays == 12
    assert _step(m, fake, 10, 7) == "graph-path" and fake.captures == 6  # evicted: warm again


def test_auto_gives_up_after_many_signatures_with_one_log_line(monkeypatch, caplog):
    fake = _FakeCuda(monkeypatch)
    m = _module("auto")
    _step(m, fake, 5, 0), _step(m, fake, 5, 1), _step(m, fake, 5, 2)  # one graph
    assert fake.captures == 1
    limit = TableBatchedEmbeddingBags._AUTO_MAX_SIGNATURES
    with caplog.at_level(logging.WARNING, logger="rocmtrain.kernels.tbe"):
        for n in range(6, 6 + limit + 5):  # every batch a new length
            assert _step(m, fake, n, n) == "eager"
    msgs = [r.getMessage() for r in caplog.records if "distinct backward input" in r.getMessage()]
    assert len(msgs) == 1, msgs
    assert m.cuda_graph is False and not m._graphs
    assert _step(m, fake, 5, 3) == "eager"


def test_failed_capture_warns_and_runs_the_step_eagerly_once(monkeypatch):
    fake = _FakeCuda(monkeypatch)
    m = _module("auto")
    _step(m, fake, 8, 0), _step(m, fake, 8, 1)
    fake.fail = True
    with pytest.warns(UserWarning, match="capturing the backward failed .*eagerly from now on"):
        assert _step(m, fake, 8, 2) == "graph-path"  # applied exactly once (checked in _step)
    assert m.cuda_graph is False and not m._graphs
    assert _step(m, fake, 8, 3) == "eager"


def test_graph_signature_covers_what_the_capture_bakes_in():
    """Moving the states (e.g. a new tensor assigned) or the weights changes the signature, as do
    the kernel variant's switches; the step's scalars are not in it (they live in _scal)."""
    m = _module("auto")
    go, idx, off = torch.zeros(1, 4), torch.zeros(3, dtype=torch.int64), torch.tensor([0, 3])
    kw = dict(need_psw_grad=False, stochastic_rounding=False)
    k0 = m._graph_signature((go, idx, off, None), kw)
    assert k0 == m._graph_signature((go.clone(), idx.clone(), off.clone(), None), kw)
    assert k0 != m._graph_signature((go, idx.int(), off, None), kw)
    assert k0 != m._graph_signature((go, idx, off, torch.ones(3)), kw)
    assert k0 != m._graph_signature((go, idx, off, None), {**kw, "stochastic_rounding": True})
    m.weights.data = m.weights.data.clone()
    assert k0 != m._graph_signature((go, idx, off, None), kw)
    m2 = TableBatchedEmbeddingBags([(50, 4)], optimizer=OptimizerSpec("adam"), backend="torch")
    m2._scal = torch.empty(8)
    k2 = m2._graph_signature((go, idx, off, None), kw)
    m2.exp_avg = torch.zeros_like(m2.exp_avg)
    k3 = m2._graph_signature((go, idx, off, None), kw)
    assert k2 != k3
    m2.optimizer = OptimizerSpec("adam", lr=0.5)  # lr travels in _scal, not in the graph
    m2.step = 7  # so do Adam's bias corrections
    assert m2._graph_signature((go, idx, off, None), kw) == k3


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the interpreter")
def test_graph_modes_do_nothing_on_cpu():
    """On CPU (the interpreter) every mode runs the same eager backward: no graph, same bits."""
    res = []
    for mode in ("auto", True, False):
        m = TableBatchedEmbeddingBags([(40, 8), (30, 4)], optimizer=OptimizerSpec("adam"),
                                      backend="triton", cuda_graph=mode, seed=1)  # fmt: skip
        for step in range(3):
            g = torch.Generator().manual_seed(step)
            idx = torch.cat([torch.randint(0, 40, (12,), generator=g),
                             torch.randint(0, 30, (12,), generator=g)])  # fmt: skip
            out = m(idx, torch.arange(0, 25, 3))
            out.backward(torch.randn(out.shape, generator=g))
        assert not m._graphs and m._graph_pool is None
        res.append(m.weights.detach().clone())
    assert torch.equal(res[0], res[1]) and torch.equal(res[0], res[2])


@pytest.mark.parametrize("bad", ["yes", 1, "true", 0.0])
def test_cuda_graph_argument_is_validated(bad):
    with pytest.raises(ValueError, match=r"cuda_graph=.*: use one of \('auto', True, False\)"):
        TableBatchedEmbeddingBags([(4, 4)], cuda_graph=bad)


def test_cuda_graph_default_and_environment(monkeypatch):
    monkeypatch.delenv("ROCMTRAIN_TBE_CUDA_GRAPH", raising=False)
    assert TableBatchedEmbeddingBags([(4, 4)]).cuda_graph == "auto"
    for env, mode in (("0", False), ("1", True), ("auto", "auto"), ("AUTO", "auto")):
        monkeypatch.setenv("ROCMTRAIN_TBE_CUDA_GRAPH", env)
        assert TableBatchedEmbeddingBags([(4, 4)]).cuda_graph == mode
        assert TableBatchedEmbeddingBags([(4, 4)], cuda_graph=False).cuda_graph is False
    monkeypatch.setenv("ROCMTRAIN_TBE_CUDA_GRAPH", "2")
    with pytest.raises(ValueError, match=r"ROCMTRAIN_TBE_CUDA_GRAPH='2': use one of"):
        TableBatchedEmbeddingBags([(4, 4)])


def test_auto_runs_large_inputs_eagerly_and_true_still_graphs_them(monkeypatch):
    """A replay copies its inputs into the static buffers: "auto" keeps inputs above
    _AUTO_MAX_GRAPH_BYTES eager (no signature tracked either), an explicit True graphs them."""
    fake = _FakeCuda(monkeypatch)
    n = 30
    big = 8 * n + 8 * 2 + 4 * 4 + 4 * n  # idx (int64), offsets, grad (fp32 [1, 4]), psw (fp32)
    monkeypatch.setattr(TableBatchedEmbeddingBags, "_AUTO_MAX_GRAPH_BYTES", big - 1)
    m = _module("auto")
    assert [_step(m, fake, n, s) for s in range(4)] == ["eager"] * 4
    assert fake.captures == 0 and not m._graphs and m._sig_last is None
    assert [_step(m, fake, n - 1, s) for s in range(3)] == ["eager", "graph-path", "graph-path"]
    assert fake.captures == 1  # one index less: under the cap, graphed as before
    m = _module(True)
    assert [_step(m, fake, n, s) for s in range(3)] == ["graph-path"] * 3
    assert fake.captures == 2
