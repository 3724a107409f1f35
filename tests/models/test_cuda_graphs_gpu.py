"""``model.compile_mode=reduce-overhead`` (and ``max-autotune``: the same graphs around Inductor's
autotuned GEMMs) on a real GPU: the dense parts replayed as CUDA graphs train what the eager model
trains.

Reference: the same dense model run eagerly in fp64 from the same weights, stepping the same SGD
updates. Several steps, with a no-grad (validation) forward in between, so a replay that read
stale weights (the optimizer updates them in place, outside the graphs) or an output buffer that
a later replay overwrote would show as a wrong loss or gradient. Tolerance: fp32 (TF32 off) vs
fp64 through a few layers, ~1e-5 relative. Skipped without a GPU:

    python -m pytest tests/models/test_cuda_graphs_gpu.py -m gpu -q
"""

from __future__ import annotations

import copy

import pytest
import torch
from dense_models import D, F, dense_forward, dense_params, small_cfg

from rocmtrain.models.dlrm import build_dlrm, mark_step

pytestmark = pytest.mark.gpu

B, STEPS, LR = 64, 4, 0.1


def _on(model, device: torch.device):
    """The dense parts moved to ``device`` (the tables stay on meta: they are not used here)."""
    for part in (model.dense_arch, model.inter_arch, model.over_arch):
        part.to(device)
    return model


def _train(model, cfg, batches) -> list[tuple]:
    """STEPS SGD steps; per step the loss, the pooled-embedding grad and a no-grad forward."""
    params = dense_params(model)
    out = []
    for dense, sparse, labels in batches:
        mark_step(cfg)
        sparse = sparse.clone().requires_grad_(True)
        logits = dense_forward(model, dense, sparse).squeeze(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        for p in params.values():
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p in params.values():
                p -= LR * p.grad
            mark_step(cfg)
            val = dense_forward(model, dense, sparse.detach()).squeeze(-1).double().clone()
        out.append((loss.detach().double(), sparse.grad.double(), val))
    return out


@pytest.mark.parametrize(
    ("interaction", "mode"),
    [("dcn", "reduce-overhead"), ("dot", "reduce-overhead"), ("dcn", "max-autotune")],
)
def test_cuda_graph_replays_train_like_fp64_eager(interaction: str, mode: str) -> None:
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # no TF32: compare fp32 with fp64
    try:
        _check_against_fp64(interaction, mode)
    finally:
        torch.set_float32_matmul_precision(precision)


def _check_against_fp64(interaction: str, mode: str) -> None:
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    eager_cfg = small_cfg(interaction, dcn_num_layers=2)
    graph_cfg = small_cfg(
        interaction, dcn_num_layers=2, compile_dense=True, compile_mode=mode
    )
    graph_cfg.validate()
    assert graph_cfg.uses_cuda_graphs
    dev = torch.device("cuda")
    eager, graphed = _on(build_dlrm(eager_cfg), dev), _on(build_dlrm(graph_cfg), dev)
    graphed.load_state_dict(eager.state_dict())
    ref = copy.deepcopy(eager).double()
    batches = [
        (
            torch.randn(B, 13, device=dev),
            torch.randn(B, F, D, device=dev),
            torch.randint(0, 2, (B,), device=dev).float(),
        )
        for _ in range(STEPS)
    ]
    counters.clear()
    got = _train(graphed, graph_cfg, batches)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    want = _train(ref, eager_cfg, [tuple(t.double() for t in b) for b in batches])
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        for name, a, b in zip(("loss", "embedding grad", "no-grad forward"), g, w, strict=True):
            torch.testing.assert_close(a, b, rtol=2e-5, atol=1e-6, msg=f"step {step}: {name}")
    for name, p in dense_params(graphed).items():
        torch.testing.assert_close(
            p.double(), dict(ref.named_parameters())[name], rtol=2e-5, atol=1e-6, msg=name
        )
