"""Fused embedding optimizers: the spec, fp32 state allocation, and the pure-torch row update.

The update is the one FBGEMM's TBE applies, on the rows a batch touched (lazy / sparse semantics):

- ``sgd`` (FBGEMM ``EXACT_SGD``): ``w -= lr * (g + wd * w)``.
- ``rowwise_adagrad``: one fp32 accumulator per row,
  ``m += mean_d((g + wd*w)^2)``; ``w -= lr * (g + wd*w) / (sqrt(m) + eps)``.
- ``adam`` (lazy Adam, FBGEMM ``ADAM``): fp32 ``exp_avg``/``exp_avg_sq`` per element, bias
  correction with the module's global step count, ``w -= lr * (m_hat / (sqrt(v_hat) + eps) + wd*w)``.

``g`` is the row's gradient summed in fp32 over every occurrence in the batch. The new weight is
computed in fp32 and stored once; fp16/bf16 weights are stored with stochastic rounding when asked
(see :func:`stochastic_round`), else round-to-nearest.

Usage::

    spec = OptimizerSpec(kind="rowwise_adagrad", lr=0.01)
    states = allocate_states(spec, rows=[100, 200], dims=[16, 16], device="cpu")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

OptimizerKind = Literal["sgd", "rowwise_adagrad", "adam"]
OPTIMIZER_KINDS: tuple[str, ...] = ("sgd", "rowwise_adagrad", "adam")


@dataclass(frozen=True)
class OptimizerSpec:
    """The fused optimizer applied in the embedding backward."""

    kind: OptimizerKind = "sgd"
    """``"sgd"`` (exact SGD), ``"rowwise_adagrad"`` or ``"adam"``."""
    lr: float = 0.01
    """Learning rate."""
    eps: float = 1.0e-8
    """Denominator epsilon of Adagrad / Adam."""
    beta1: float = 0.9
    """Adam first-moment decay."""
    beta2: float = 0.999
    """Adam second-moment decay."""
    weight_decay: float = 0.0
    """L2 weight decay added to the gradient of touched rows (Adam: decoupled, AdamW style)."""

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZER_KINDS:
            raise ValueError(
                f"OptimizerSpec.kind={self.kind!r} is not supported; use one of {OPTIMIZER_KINDS}"
            )
        if not self.lr >= 0.0:
            raise ValueError(f"OptimizerSpec.lr={self.lr} must be >= 0")
        if not self.eps > 0.0:
            raise ValueError(f"OptimizerSpec.eps={self.eps} must be > 0")
        for name in ("beta1", "beta2"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise ValueError(f"OptimizerSpec.{name}={v} must be in [0, 1)")
        if not self.weight_decay >= 0.0:
            raise ValueError(f"OptimizerSpec.weight_decay={self.weight_decay} must be >= 0")

    @property
    def state_names(self) -> tuple[str, ...]:
        """Names of the fp32 state tensors, per table (rowwise: [rows]; elementwise: [rows, D])."""
        return {
            "sgd": (),
            "rowwise_adagrad": ("momentum",),
            "adam": ("exp_avg", "exp_avg_sq"),
        }[self.kind]


def state_numel(spec: OptimizerSpec, rows: int, dim: int) -> int:
    """fp32 elements of ONE state tensor of a table with ``rows`` x ``dim`` weights."""
    if spec.kind == "rowwise_adagrad":
        return rows
    if spec.kind == "adam":
        return rows * dim
    return 0


def stochastic_round(x: torch.Tensor, dtype: torch.dtype, rand_bits: torch.Tensor) -> torch.Tensor:
    """Round fp32 ``x`` to fp16/bf16 stochastically: ``E[result] == x`` (for normal numbers).

    Adds uniform random bits below the target mantissa to the fp32 bit pattern and truncates
    (round toward zero on the magnitude), so a value ``p`` of the way between two neighbours rounds
    up with probability ``p``. ``rand_bits`` is an int32/int64 tensor of random bits, one per
    element (only its low 16 / 13 bits are used). fp16 values in the subnormal range fall back to
    round-to-nearest (the fp32 truncation is not exact there).
    """
    if dtype == torch.float32:
        return x
    drop = 16 if dtype == torch.bfloat16 else 13
    mask = (1 << drop) - 1
    bits = x.contiguous().view(torch.int32)
    noise = (rand_bits & mask).to(torch.int32)
    finite = torch.isfinite(x)
    rounded = ((bits + noise) & ~mask).view(torch.float32)
    rounded = torch.where(finite, rounded, x)
    return rounded.to(dtype)


def apply_update(
    spec: OptimizerSpec,
    w: torch.Tensor,
    g: torch.Tensor,
    states: dict[str, torch.Tensor],
    *,
    step: int,
) -> torch.Tensor:
    """Return the new fp32 rows for fp32 rows ``w`` [N, D] and summed fp32 grads ``g`` [N, D].

    ``states`` holds this table's fp32 state rows gathered for the same N rows; they are updated
    in place (the caller scatters them back). ``step`` is the 1-based global step (Adam bias
    correction).
    """
    wd = spec.weight_decay
    if spec.kind == "sgd":
        return w - spec.lr * (g + wd * w)
    if spec.kind == "rowwise_adagrad":
        gw = g + wd * w
        m = states["momentum"] + (gw * gw).mean(dim=1)
        states["momentum"].copy_(m)
        return w - spec.lr * gw / (m.sqrt() + spec.eps)[:, None]
    m1 = states["exp_avg"].mul_(spec.beta1).add_(g, alpha=1.0 - spec.beta1)
    m2 = states["exp_avg_sq"].mul_(spec.beta2).addcmul_(g, g, value=1.0 - spec.beta2)
    c1 = 1.0 - spec.beta1**step
    c2 = 1.0 - spec.beta2**step
    return w - spec.lr * ((m1 / c1) / ((m2 / c2).sqrt() + spec.eps) + wd * w)
