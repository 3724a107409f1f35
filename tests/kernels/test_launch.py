"""The direct relaunch of compiled Triton kernels: its key on the CPU (what Triton specializes
on), and on a GPU that it launches the binary Triton's own dispatch picks, without the dispatch."""

from __future__ import annotations

import pytest
import torch
from tbe_oracle import assert_close, make_case, oracle_forward, oracle_step

from rocmtrain.kernels import OptimizerSpec, TableBatchedEmbeddingBags, launch
from rocmtrain.kernels.launch import arg_key, has_hook


def test_arg_key_separates_what_triton_specializes_on():
    buf = torch.zeros(64)
    aligned, unaligned = buf[4:], buf[1:]  # 16-byte and 4-byte aligned
    assert arg_key(aligned, False) == (torch.float32, True)
    assert arg_key(unaligned, False) == (torch.float32, False)
    assert arg_key(buf.to(torch.float16), False) != arg_key(buf, False)
    assert arg_key(buf, True) == (torch.float32, True, True)  # AMD: storage < 2 GiB
    ints = [arg_key(x, False) for x in (1, 2, 3, 16, 32, 2**31 - 16, 2**31, -(2**31), 2**63)]
    assert ints[1] == ints[2] and ints[3] == ints[4]  # 2 ~ 3 (no property), 16 ~ 32 (% 16)
    assert len({ints[0], ints[1], ints[3]}) == 3  # == 1 and % 16 are specializations
    assert ints[5] != ints[6] and ints[5] == ints[7]  # i32 vs i64 width
    assert ints[8] != ints[6]  # u64
    assert arg_key(True, False) != arg_key(1, False) and arg_key(True, False) == True  # noqa: E712
    assert arg_key(0.1, False) == arg_key(2.5, False)  # floats go by value, not specialized


def test_has_hook_sees_through_an_empty_hook_chain():
    """Triton 3.6 sets launch_enter_hook to an empty HookChain by default: that is no hook (taking
    it for one kept the fast path off on the H200)."""
    knobs = pytest.importorskip("triton.knobs")
    chain = knobs.HookChain()
    assert not has_hook(chain) and not has_hook(None)
    chain.add(print)
    assert has_hook(chain) and has_hook(print)


def test_launch_mode_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv("ROCMTRAIN_TRITON_LAUNCH", "fastest")
    launch.launch_mode.cache_clear()
    try:
        with pytest.raises(ValueError, match="ROCMTRAIN_TRITON_LAUNCH='fastest'.*'check'"):
            launch.launch_mode()
    finally:
        monkeypatch.delenv("ROCMTRAIN_TRITON_LAUNCH")
        launch.launch_mode.cache_clear()


@pytest.mark.gpu
def test_gpu_relaunch_skips_dispatch_and_matches_oracle(monkeypatch):
    """Steps 2.. of training launch every kernel directly (Triton's dispatch runs only on a key's
    first launch), in "check" mode every direct launch is the binary Triton picks, and a batch
    whose index tensor is not 16-byte aligned (a new key) still matches the fp64 oracle."""
    import rocmtrain.kernels.tbe_backward as tb
    import rocmtrain.kernels.tbe_forward as tf

    assert launch._fast_supported(), "a GPU with Triton >= 3.4 relaunches directly"
    monkeypatch.setenv("ROCMTRAIN_TRITON_LAUNCH", "check")
    launch.launch_mode.cache_clear()
    dispatched = []
    for ln in (tf._FWD, tb._KEYS, tb._TILE, tb._HOT):
        orig = ln.fn.run

        def run(*a, _orig=orig, _name=ln.fn.__name__, **kw):
            if not kw.get("warmup"):
                dispatched.append(_name)
            return _orig(*a, **kw)

        monkeypatch.setattr(ln.fn, "run", run)
    tables, fmap = [(3000, 20), (5000, 128)], [0, 1, 0]
    opt = dict(kind="rowwise_adagrad", lr=0.2, eps=1e-6)
    try:
        m = TableBatchedEmbeddingBags(tables, feature_table_map=fmap, backend="triton",
                                      optimizer=OptimizerSpec(**opt), device="cuda",
                                      cuda_graph=False)  # fmt: skip
        case = make_case(tables, fmap, B=257, seed=1, max_len=6, hot_row=900)
        for step in range(4):
            idx = case.indices.cuda()
            if step == 3:  # same values at a 4-byte offset: another key, Triton dispatches
                idx = torch.cat([idx.new_zeros(1), idx])[1:]
            w0 = [w.cpu().clone() for w in m.split_embedding_weights()]
            s0 = [{k: v.cpu().double() for k, v in s.items()} for s in m.split_optimizer_states()]
            out = m(idx, case.offsets.cuda())
            assert_close(out.cpu(), oracle_forward(w0, case, "sum"), torch.float32, "forward")
            grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(step)) * 1e-2
            out.backward(grad.cuda())
            ref_w, _, _ = oracle_step(w0, s0, case, grad, "sum", opt, 1)
            for t, w in enumerate(m.split_embedding_weights()):
                assert_close(w.cpu(), ref_w[t], torch.float32, f"step {step} table {t}", terms=900)
            if step == 0:
                first = list(dispatched)
        torch.cuda.synchronize()
    finally:
        monkeypatch.delenv("ROCMTRAIN_TRITON_LAUNCH")
        launch.launch_mode.cache_clear()
    assert set(first) == {"_tbe_fwd_kernel", "_keys_kernel", "_bwd_tile_kernel", "_bwd_hot_kernel"}
    # steps 1 and 2 dispatched nothing; step 3: the two kernels that read the unaligned indices
    assert dispatched[len(first) :] == ["_tbe_fwd_kernel", "_keys_kernel"], dispatched
