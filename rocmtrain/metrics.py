"""Training metrics beyond torchmetrics' own: normalized entropy (NE) for click prediction.

NE = mean binary cross-entropy of the predictions / entropy of the base click rate::

    NE = (-1/N * sum_i [y_i log p_i + (1 - y_i) log(1 - p_i)]) / (-(c log c + (1 - c) log(1 - c)))
    c  = mean label

NE < 1 means the model beats always predicting the base rate ``c``; lower is better. Sums are
kept in float64 and reduced by summation across ranks (``dist_reduce_fx="sum"``), so NE over a
distributed validation set equals NE over the concatenated data. Use it like any torchmetric::

    ne = NormalizedEntropy()                # logits in, like BCEWithLogits
    ne.update(logits, labels); ne.compute()
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchmetrics import Metric


class NormalizedEntropy(Metric):
    """Normalized entropy of binary predictions (see the module docstring).

    Args:
        from_logits: ``update`` receives logits (default) instead of probabilities.
        eps: clamp of the base rate inside the logs (NE of a constant-label set stays finite).
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, *, from_logits: bool = True, eps: float = 1e-12, **kwargs) -> None:
        super().__init__(**kwargs)
        self.from_logits = from_logits
        self.eps = eps
        zero = torch.tensor(0.0, dtype=torch.float64)
        self.add_state("cross_entropy_sum", default=zero.clone(), dist_reduce_fx="sum")
        self.add_state("positives", default=zero.clone(), dist_reduce_fx="sum")
        self.add_state("count", default=zero.clone(), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """Add a batch: ``preds`` logits (or probabilities) and ``target`` labels in {0, 1}."""
        preds = preds.detach().reshape(-1).to(torch.float64)
        target = target.detach().reshape(-1).to(torch.float64)
        if preds.shape != target.shape:
            raise ValueError(
                f"NormalizedEntropy.update: preds has {preds.numel()} values but target has "
                f"{target.numel()}; pass one prediction per label"
            )
        if self.from_logits:
            ce = F.binary_cross_entropy_with_logits(preds, target, reduction="sum")
        else:
            ce = F.binary_cross_entropy(preds, target, reduction="sum")
        self.cross_entropy_sum += ce
        self.positives += target.sum()
        self.count += target.numel()

    def compute(self) -> torch.Tensor:
        """NE over everything seen (all ranks after sync); NaN before any update."""
        if self.count == 0:
            return torch.tensor(float("nan"), dtype=torch.float64)
        rate = self.positives / self.count
        base = -(
            rate * torch.log(rate.clamp(min=self.eps))
            + (1 - rate) * torch.log((1 - rate).clamp(min=self.eps))
        )
        return (self.cross_entropy_sum / self.count) / base.clamp(min=self.eps)
