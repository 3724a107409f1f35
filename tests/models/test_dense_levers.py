"""Dense-step levers (``model.compile_dense``, ``model.dcn_autocast_residual``,
``model.dense_optimizer_impl``) compute what the eager fp32 model does.

Reference: the same dense model (bottom MLP, interaction, top MLP) run eagerly in fp64 from the
same weights. Tolerances: fp32 paths (compiled or not) must agree with fp64 to ~1e-5 relative
(a few fp32 ulps times the depth of the net; Inductor reorders sums and fuses bias/ReLU, so not
bitwise); the bf16 residual is judged against fp64 at bf16's resolution (8-bit mantissa: 2^-8 per
rounding, a few roundings per layer, three layers -> 3e-2) and against TorchRec's own autocast
cross net, whose GEMMs round their inputs to bf16 too.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from dense_models import D, F, dense_forward, dense_params, small_cfg

import rocmtrain.models.dlrm as dlrm
from rocmtrain.models.dlrm import AutocastResidualCrossNet, build_dlrm, dense_optimizer
from rocmtrain.precision.policy import apply_submodule_policy

B = 32


def _nonzero_biases(model) -> None:
    with torch.no_grad():
        for name, p in dense_params(model).items():
            if "bias" in name:
                p.normal_(0.0, 0.1)


def _run(model, dense, sparse, grad_out):
    dense = dense.clone().requires_grad_(True)
    sparse = sparse.clone().requires_grad_(True)
    for p in dense_params(model).values():
        p.grad = None
    out = dense_forward(model, dense, sparse)
    out.backward(grad_out.to(out.dtype))
    grads = {k: p.grad.double() for k, p in dense_params(model).items()}
    return out.detach().double(), dense.grad.double(), sparse.grad.double(), grads


@pytest.mark.parametrize("interaction", ["dcn", "dot"])
def test_compile_dense_matches_fp64_eager_forward_and_backward(interaction: str) -> None:
    torch.manual_seed(0)
    eager = build_dlrm(small_cfg(interaction))
    _nonzero_biases(eager)
    compiled = build_dlrm(small_cfg(interaction, compile_dense=True))
    assert list(compiled.state_dict()) == list(eager.state_dict())  # same keys, no _orig_mod
    compiled.load_state_dict(eager.state_dict())
    ref = copy.deepcopy(eager).double()

    dense, sparse, grad_out = torch.randn(B, 13), torch.randn(B, F, D), torch.randn(B, 1)
    want = _run(ref, dense.double(), sparse.double(), grad_out.double())
    for name, model in (("eager", eager), ("compiled", compiled)):
        got = _run(model, dense, sparse, grad_out)
        for g, w in zip(got[:3], want[:3], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=name)
        for k, w in want[3].items():
            torch.testing.assert_close(got[3][k], w, rtol=1e-5, atol=1e-5, msg=f"{name} {k}")
    # validation (no grad, another batch size): its own graph, same values
    with torch.no_grad():
        x2, s2 = torch.randn(8, 13), torch.randn(8, F, D)
        torch.testing.assert_close(
            dense_forward(compiled, x2, s2), dense_forward(eager, x2, s2), rtol=1e-5, atol=1e-5
        )


def test_compile_dense_keeps_fp32_islands_outside_the_graph() -> None:
    """policy interaction=fp32 under bf16 autocast: the compiled interaction still runs in fp32."""
    torch.manual_seed(1)
    eager = build_dlrm(small_cfg("dcn"))
    compiled = build_dlrm(small_cfg("dcn", compile_dense=True))
    compiled.load_state_dict(eager.state_dict())
    policy = {"embeddings": "fp32", "dense_arch": "autocast", "interaction": "fp32",
              "over_arch": "autocast"}  # fmt: skip
    for m in (eager, compiled):
        apply_submodule_policy(m, policy)
    dense, sparse = torch.randn(B, 13), torch.randn(B, F, D)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        inter = {n: m.inter_arch(m.dense_arch(dense), sparse) for n, m in
                 (("eager", eager), ("compiled", compiled))}  # fmt: skip
    assert inter["eager"].dtype == inter["compiled"].dtype == torch.float32
    torch.testing.assert_close(inter["compiled"], inter["eager"], rtol=1e-5, atol=1e-5)


def _crossnet(residual: bool, compile_dense: bool = False):
    model = build_dlrm(
        small_cfg("dcn", dcn_autocast_residual=residual, compile_dense=compile_dense)
    )
    return model


def test_autocast_residual_is_torchrec_without_autocast_and_bf16_under_it() -> None:
    torch.manual_seed(2)
    base = _crossnet(False)
    _nonzero_biases(base)
    lever = _crossnet(True)
    lever.load_state_dict(base.state_dict())
    assert isinstance(lever.inter_arch.crossnet, AutocastResidualCrossNet)
    assert list(lever.state_dict()) == list(base.state_dict())
    dense, sparse, grad_out = torch.randn(B, 13), torch.randn(B, F, D), torch.randn(B, 1)
    # no autocast: TorchRec's forward, bitwise
    a, b = _run(base, dense, sparse, grad_out), _run(lever, dense, sparse, grad_out)
    for x, y in zip(a[:3], b[:3], strict=True):
        assert torch.equal(x, y)

    ref = copy.deepcopy(base).double()
    want = _run(ref, dense.double(), sparse.double(), grad_out.double())
    scale = want[0].abs().max()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x0 = torch.randn(B, (F + 1) * D)
        assert lever.inter_arch.crossnet(x0).dtype == torch.bfloat16  # the stream stays bf16
        assert base.inter_arch.crossnet(x0).dtype == torch.float32
        for name, model in (("torchrec autocast", base), ("bf16 residual", lever),
                            ("bf16 residual compiled", _compiled_copy(lever))):  # fmt: skip
            got = _run(model, dense, sparse, grad_out)
            torch.testing.assert_close(got[0], want[0], rtol=3e-2, atol=3e-2 * scale, msg=name)
            gscale = want[2].abs().max()
            torch.testing.assert_close(got[2], want[2], rtol=5e-2, atol=5e-2 * gscale, msg=name)
            for k, w in want[3].items():
                torch.testing.assert_close(
                    got[3][k], w, rtol=5e-2, atol=5e-2 * w.abs().max(), msg=f"{name} {k}"
                )


def _compiled_copy(model):
    out = _crossnet(True, compile_dense=True)
    out.load_state_dict(model.state_dict())
    return out


@pytest.mark.parametrize("optimizer", ["adagrad", "adam", "sgd"])
def test_dense_optimizer_impls_match_fp64_for_loop(optimizer: str) -> None:
    torch.manual_seed(3)
    shapes = [(16, 13), (16,), (8, 16), (1,)]
    init = [torch.randn(s) for s in shapes]
    grads = [[torch.randn(s) for s in shapes] for _ in range(4)]

    def steps(impl: str, dtype: torch.dtype) -> list[torch.Tensor]:
        cfg = small_cfg(dense_optimizer=optimizer, dense_optimizer_impl=impl, dense_lr=0.05)
        params = [torch.nn.Parameter(p.to(dtype, copy=True)) for p in init]
        opt = dense_optimizer(params, cfg)
        if impl == "fused":
            assert opt.param_groups[0]["fused"] is True
        for k, gs in enumerate(grads):

            def closure(gs=gs, k=k) -> torch.Tensor:  # as Lightning steps: backward inside
                assert torch.is_grad_enabled()
                for p, g in zip(params, gs, strict=True):
                    p.grad = g.to(dtype)
                return torch.tensor(float(k))

            assert opt.step(closure).item() == k
        return [p.detach().double() for p in params]

    want = steps("for_loop", torch.float64)
    for impl in ("auto", "for_loop", "foreach", "fused", "compiled"):
        # compiled: Adam's bias corrections are computed in fp32 on the device, where the eager
        # step takes them as host doubles: ~1e-6 on parameters that move 0.05 a step
        atol = 5e-6 if impl == "compiled" else 1e-6
        for g, w in zip(steps(impl, torch.float32), want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=atol, msg=impl)


def test_fused_without_a_kernel_runs_foreach_and_says_so(monkeypatch, caplog) -> None:
    monkeypatch.setitem(dlrm._FUSED_SUPPORT, (torch.optim.Adagrad, "cpu"), False)
    params = [torch.nn.Parameter(torch.randn(4))]
    with caplog.at_level(logging.WARNING, logger="rocmtrain.models.dlrm"):
        opt = dense_optimizer(params, small_cfg(dense_optimizer_impl="fused"))
    assert opt.param_groups[0]["foreach"] is True and not opt.param_groups[0]["fused"]
    assert "running foreach" in caplog.text


def test_config_rejects_unknown_impl() -> None:
    from rocmtrain.config import ConfigError

    with pytest.raises(ConfigError, match="dense_optimizer_impl"):
        small_cfg(dense_optimizer_impl="fast").validate()


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_embedding_output_dtype_reaches_the_kernels_fused_params(dtype: str) -> None:
    """TorchRec merges each table's in-backward optimizer kwargs into its kernel's fused_params;
    rocmtrain's kernel options accept what lands there."""
    from fbgemm_gpu.split_embedding_configs import SparseType

    from rocmtrain.embedding.params import tbe_options
    from rocmtrain.models.dlrm import apply_embedding_optimizer

    cfg = small_cfg(embedding_output_dtype=dtype, embedding_optimizer="rowwise_adagrad")
    model = build_dlrm(cfg)
    apply_embedding_optimizer(model, cfg)
    want = {"bf16": SparseType.BF16, "fp16": SparseType.FP16}[dtype]
    params = list(model.sparse_arch.parameters())
    assert params and all(p._optimizer_kwargs[-1]["output_dtype"] == want for p in params)
    assert all(p._optimizer_kwargs[-1]["lr"] == cfg.embedding_lr for p in params)
    _, extra = tbe_options({"optimizer": "rowwise_adagrad", **params[0]._optimizer_kwargs[-1]})
    assert extra["output_dtype"] == {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    # fp32 (the default) leaves the kwargs alone
    plain = build_dlrm(small_cfg())
    apply_embedding_optimizer(plain, small_cfg())
    assert all(
        "output_dtype" not in p._optimizer_kwargs[-1] for p in plain.sparse_arch.parameters()
    )


@pytest.mark.parametrize(
    ("mode", "interaction", "accelerator", "want"),
    [
        ("bf16-mixed", "autocast", "gpu", "bf16"),
        ("16-mixed", "autocast", "gpu", "fp16"),
        ("bf16-mixed", "fp32", "gpu", "fp32"),  # the cross net would read fp32: keep it
        ("32", "autocast", "gpu", "fp32"),  # an fp32 run stays fp32
        ("bf16-mixed", "autocast", "cpu", "fp32"),  # FBGEMM's CPU kernels: no bf16 output
    ],
)
def test_autocast_embedding_output_follows_the_run(mode, interaction, accelerator, want) -> None:
    import dataclasses

    from rocmtrain.config.schema import RunConfig, resolve_model_config

    cfg = RunConfig()
    cfg.model = dataclasses.replace(cfg.model, embedding_output_dtype="autocast")
    cfg.precision.mode = mode
    cfg.precision.policy.interaction = interaction
    cfg.trainer.accelerator = accelerator
    cfg.model.validate()
    resolved = resolve_model_config(cfg)
    assert resolved.embedding_output_dtype == want
    assert cfg.model.embedding_output_dtype == "autocast"  # the run config is not changed


def test_unresolved_autocast_output_is_a_config_error() -> None:
    from rocmtrain.config import ConfigError
    from rocmtrain.models.dlrm import apply_embedding_optimizer

    cfg = small_cfg(embedding_output_dtype="autocast")
    with pytest.raises(ConfigError, match="resolve_model_config"):
        apply_embedding_optimizer(build_dlrm(cfg), cfg)


def test_config_rejects_a_compile_mode_without_compiled_parts() -> None:
    from rocmtrain.config import ConfigError

    with pytest.raises(ConfigError, match="compile_mode.*compile_dense=true"):
        small_cfg("dot", compile_mode="reduce-overhead").validate()
    with pytest.raises(ConfigError, match="compile_mode"):
        small_cfg(compile_dense=True, compile_mode="max-speed").validate()
    graphed = small_cfg(compile_interaction=True, compile_mode="reduce-overhead")
    graphed.validate()
    assert graphed.uses_cuda_graphs and not small_cfg(compile_dense=True).uses_cuda_graphs
    assert small_cfg(compile_dense=True, compile_mode="max-autotune").uses_cuda_graphs


def test_cuda_graphs_without_a_gpu_are_a_warning(caplog) -> None:
    from rocmtrain.models.dlrm import warn_without_cuda_graphs

    graphed = small_cfg(compile_dense=True, compile_mode="reduce-overhead")
    with caplog.at_level(logging.WARNING, logger="rocmtrain.models.dlrm"):
        assert warn_without_cuda_graphs(graphed, torch.device("cpu"))
        assert not warn_without_cuda_graphs(graphed, torch.device("cuda"))
        assert not warn_without_cuda_graphs(small_cfg(compile_dense=True), torch.device("cpu"))
        tuned = small_cfg(compile_dense=True, compile_mode="max-autotune")
        assert warn_without_cuda_graphs(tuned, torch.device("cpu"))
    assert caplog.text.count("compile_mode=reduce-overhead") == 1 and "cpu" in caplog.text
    assert caplog.text.count("compile_mode=max-autotune") == 1


@pytest.mark.parametrize("interaction", ["dcn", "dot"])
def test_compiled_interaction_hands_the_embeddings_a_contiguous_gradient(interaction) -> None:
    """Eagerly the pooled embeddings' gradient is a strided slice of the concatenation's (the
    embedding kernel would copy it); the compiled interaction returns it contiguous, same values."""
    torch.manual_seed(0)
    eager = build_dlrm(small_cfg(interaction))
    compiled = build_dlrm(small_cfg(interaction, compile_dense=True))
    compiled.load_state_dict(eager.state_dict())
    grads = {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        torch.manual_seed(1)
        dense, leaf = torch.randn(B, 13), torch.randn(B, F, D, requires_grad=True)
        sparse = leaf.clone()  # a non-leaf, like the kernel's output: its hook sees the gradient
        sparse.register_hook(lambda g, name=name: grads.__setitem__(name, g))  # as handed on
        dense_forward(model, dense, sparse).sum().backward()
    assert not grads["eager"].is_contiguous()  # what the kernel would have to copy
    assert grads["compiled"].is_contiguous()
    torch.testing.assert_close(grads["compiled"], grads["eager"], rtol=1e-5, atol=1e-6)
