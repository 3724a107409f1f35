"""model.compile_interaction: the compiled DCN cross net computes what the eager one does.

Reference: the cross-net recurrence ``x_{l+1} = x0 * (W V x_l + b) + x_l`` written out in fp64.
The compiled and the eager module must both match it (fp32 tolerances), forward and backward,
and keep TorchRec's parameter names (checkpoints and sharding plans do not change).
"""

from __future__ import annotations

import torch
from tiny_config import tiny_model_config

from rocmtrain.config.model import ModelConfig
from rocmtrain.models.dlrm import build_dlrm


def _cfg(compile_interaction: bool) -> ModelConfig:
    return tiny_model_config("dcn", compile_interaction=compile_interaction)


def _reference(crossnet: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    x0 = x.double()
    xl = x0
    for v, w, b in zip(crossnet.V_kernels, crossnet.W_kernels, crossnet.bias, strict=True):
        xl = x0 * (xl @ v.double().T @ w.double().T + b.double()) + xl
    return xl


def test_compiled_crossnet_matches_fp64_reference_forward_and_backward() -> None:
    torch.manual_seed(0)
    eager = build_dlrm(_cfg(False)).inter_arch.crossnet
    compiled = build_dlrm(_cfg(True)).inter_arch.crossnet
    assert list(compiled.state_dict()) == list(eager.state_dict())  # same names, no _orig_mod
    compiled.load_state_dict(eager.state_dict())
    for p in (*eager.bias, *compiled.bias):  # non-zero biases so their path is exercised
        torch.nn.init.normal_(p)
    compiled.load_state_dict(eager.state_dict())

    x = torch.randn(64, 4 * 8)
    grad_out = torch.randn(64, 4 * 8)
    results = {}
    for name, net in (("eager", eager), ("compiled", compiled)):
        xi = x.clone().requires_grad_(True)
        out = net(xi)
        out.backward(grad_out)
        results[name] = (out.detach(), xi.grad, [b.grad.clone() for b in net.bias])

    xr = x.double().requires_grad_(True)
    ref = _reference(eager, xr)
    ref.backward(grad_out.double())
    ref_bias = torch.autograd.grad(
        _reference(eager, x.double()), list(eager.bias), grad_out.double()
    )
    for name, (out, gx, gb) in results.items():
        torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-5, msg=name)
        torch.testing.assert_close(gx.double(), xr.grad, rtol=1e-4, atol=1e-4, msg=name)
        for g, r in zip(gb, ref_bias, strict=True):
            torch.testing.assert_close(g.double(), r.double(), rtol=1e-4, atol=1e-4, msg=name)
    # a second batch size compiles a second graph and still matches
    x2 = torch.randn(16, 32)
    torch.testing.assert_close(compiled(x2), eager(x2), rtol=1e-5, atol=1e-5)
