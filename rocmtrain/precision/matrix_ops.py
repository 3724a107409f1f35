"""Ops, inputs and error metrics of the precision matrix (see :mod:`rocmtrain.precision.matrix`).

Each op gets fixed, seeded inputs (generated in fp64 on the CPU, so every platform sees the same
numbers). For a tested dtype the inputs are rounded to that dtype, the op runs in that dtype on the
device, and the result is compared with the op computed in fp64 on the CPU **from the same rounded
inputs** — so the error is the op's own error, not the input rounding.

Metrics per (op, dtype):

- ``max_rel`` / ``mean_rel``: ``|y - r| / max(|r|, 1e-3 * max|r|)``. The floor (0.1 % of the output's
  scale) keeps outputs that are ~0 by cancellation (layer_norm, softmax tails) from dominating.
- ``max_ulp``: ``|y - r|`` in units in the last place of the tested dtype at ``max(|r|, floor)`` (same
  floor; fp16: 10 mantissa bits, bf16: 7, fp32 and tf32 results: 23). A correctly rounded op has
  ``max_ulp <= 0.5``; a reduction (matmul, layer_norm) a few ULP more per rounding step it keeps.
- ``n``: number of output elements compared.

``tf32`` is the fp32 op with TF32/XF32 matmuls allowed (``set_float32_matmul_precision("high")``);
it exists only for GEMM ops on GPUs with TF32/XF32 (sm_80+, gfx942).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

DTYPES: dict[str, torch.dtype] = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "tf32": torch.float32,
}
#: explicit mantissa bits and minimum normal exponent of the result type
_FORMAT = {"fp16": (10, -14), "bf16": (7, -126), "fp32": (23, -126), "tf32": (23, -126)}
#: machine epsilon of the tested dtype (tf32 is judged against its 10-bit input rounding)
EPS = {"fp16": 2.0**-10, "bf16": 2.0**-7, "fp32": 2.0**-23, "tf32": 2.0**-10}
REL_FLOOR = 1e-3


@dataclass(frozen=True)
class Op:
    """One row of the matrix."""

    name: str
    make_inputs: Callable[[torch.Generator], list[torch.Tensor]]
    """fp64 CPU inputs from a seeded generator."""
    fn: Callable[..., torch.Tensor]
    """The op; float inputs arrive in the tested dtype, index inputs unchanged."""
    gemm: bool = False
    """Uses matmuls (gets a tf32 column where available)."""


def _u(g: torch.Generator, shape: tuple[int, ...], lo: float, hi: float) -> torch.Tensor:
    return torch.rand(shape, generator=g, dtype=torch.float64) * (hi - lo) + lo


def _n(
    g: torch.Generator, shape: tuple[int, ...], mean: float = 0.0, std: float = 1.0
) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float64) * std + mean


def _log1p_inputs(g: torch.Generator) -> list[torch.Tensor]:
    small = 10.0 ** _u(g, (4096,), -4, 1)  # 1e-4 .. 10: where log1p vs log(1+x) matters
    neg = -_u(g, (1024,), 0, 0.5)
    return [torch.cat([small, neg])]


def _embedding_bag_inputs(g: torch.Generator) -> list[torch.Tensor]:
    weight = _n(g, (1000, 64))
    indices = torch.randint(0, 1000, (128 * 32,), generator=g)
    offsets = torch.arange(0, 128 * 32 + 1, 32)
    return [weight, indices, offsets]


def _embedding_bag(
    weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    return F.embedding_bag(indices, weight, offsets[:-1], mode="sum")


def dot_interaction(x: torch.Tensor) -> torch.Tensor:
    """DLRM dot interaction: ``x`` [B, F+1, D] → strictly-lower-triangular pairwise dots [B, F(F+1)/2]."""
    z = torch.bmm(x, x.transpose(1, 2))
    rows, cols = torch.tril_indices(x.shape[1], x.shape[1], offset=-1, device=x.device)
    return z[:, rows, cols]


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


OPS: tuple[Op, ...] = (
    Op("exp", lambda g: [_u(g, (8192,), -8, 8)], torch.exp),
    Op("log1p", _log1p_inputs, torch.log1p),
    Op("sqrt", lambda g: [10.0 ** _u(g, (8192,), -4, 4)], torch.sqrt),
    Op("rsqrt", lambda g: [10.0 ** _u(g, (8192,), -3, 3)], torch.rsqrt),
    Op("sigmoid", lambda g: [_u(g, (8192,), -12, 12)], torch.sigmoid),
    Op("tanh", lambda g: [_u(g, (8192,), -5, 5)], torch.tanh),
    Op("softmax", lambda g: [_n(g, (64, 512), 0, 3)], lambda x: torch.softmax(x, dim=-1)),
    Op(
        "layer_norm",
        lambda g: [_n(g, (64, 512), 1, 2), _n(g, (512,), 1, 0.1), _n(g, (512,), 0, 0.1)],
        _layer_norm,
    ),
    Op("matmul", lambda g: [_n(g, (128, 512)), _n(g, (512, 128))], torch.matmul, gemm=True),
    Op("embedding_bag_sum", _embedding_bag_inputs, _embedding_bag),
    Op("dlrm_interaction", lambda g: [_n(g, (64, 27, 64), 0, 0.5)], dot_interaction, gemm=True),
)


def ulp(ref: torch.Tensor, fmt: str) -> torch.Tensor:
    """Spacing of the ``fmt`` floating-point grid at ``ref`` (fp64 tensor), subnormals included."""
    mant, emin = _FORMAT[fmt]
    exp = torch.floor(torch.log2(ref.abs().clamp_min(2.0 ** (emin - mant))))
    return torch.exp2(exp.clamp_min(emin) - mant)


def error_metrics(out: torch.Tensor, ref: torch.Tensor, fmt: str) -> dict[str, float]:
    """max/mean relative error and max ULP of ``out`` against the fp64 reference ``ref``."""
    out = out.detach().to("cpu", torch.float64).reshape(-1)
    ref = ref.to(torch.float64).reshape(-1)
    err = (out - ref).abs()
    nonfinite = int((~torch.isfinite(out)).sum())
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    denom = ref.abs().clamp_min(max(REL_FLOOR * scale, torch.finfo(torch.float64).tiny))
    rel = err / denom
    return {
        "max_rel": float(rel.max()) if nonfinite == 0 else math.inf,
        "mean_rel": float(rel.mean()) if nonfinite == 0 else math.inf,
        "max_ulp": float((err / ulp(denom, fmt)).max()) if nonfinite == 0 else math.inf,
        "n": int(ref.numel()),
        "nonfinite": nonfinite,
    }


def _cast(inputs: list[torch.Tensor], dtype: torch.dtype, device: str) -> list[torch.Tensor]:
    return [
        t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device) for t in inputs
    ]


def run_op(op: Op, dtype_name: str, *, device: str, seed: int) -> dict[str, float]:
    """Error metrics of ``op`` in ``dtype_name`` on ``device`` against fp64 on the CPU."""
    g = torch.Generator().manual_seed(seed)
    inputs = op.make_inputs(g)
    dtype = DTYPES[dtype_name]
    rounded = [t.to(dtype).to(torch.float64) if t.is_floating_point() else t for t in inputs]
    ref = op.fn(*rounded)
    out = op.fn(*_cast(inputs, dtype, device))
    if device != "cpu":
        torch.cuda.synchronize()
    return error_metrics(out, ref, dtype_name)
