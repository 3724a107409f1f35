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
from torchmetrics.classification import BinaryAUROC


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


class BinnedBinaryAUROC(BinaryAUROC):
    """``torchmetrics.classification.BinaryAUROC(thresholds=T)`` with an O(B) update.

    torchmetrics' own binned update loops over all ``T`` thresholds (several kernels each) once a
    batch has more than 50k predictions, i.e. ~``4 T`` kernel launches per step for a GPU batch
    of 65536 (seconds per step at ``T = 10000``). This update adds the identical confusion-matrix
    state with one ``bucketize`` and one ``scatter_add_`` and never syncs with the device::

        auc = BinnedBinaryAUROC(thresholds=10000)
        auc.update(probs, labels); auc.compute()       # same value as BinaryAUROC
    """

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        if self.thresholds is None:  # exact (unbinned) mode: torchmetrics' own update
            super().update(preds, target)
            return
        self.confmat += binned_confmat(preds, target, self.thresholds).to(self.confmat.device)


def binned_confmat(
    preds: torch.Tensor, target: torch.Tensor, thresholds: torch.Tensor
) -> torch.Tensor:
    """``[T, 2, 2]`` counts ``[[TN, FP], [FN, TP]]`` with ``pred >= thresholds[t]`` as positive."""
    probs = preds.detach().reshape(-1).to(thresholds.dtype)
    pos = target.reshape(-1) == 1
    t = thresholds.numel()
    # bucket k = number of thresholds <= p, so p >= thresholds[i] <=> k >= i + 1
    bucket = torch.bucketize(probs, thresholds, right=True)
    # scatter_add_ into a fixed-size histogram: torch.bincount would read max(input) back to the
    # host to size its output (one device sync per update on CUDA/ROCm)
    index = bucket + (t + 1) * pos.long()
    hist = torch.zeros(2 * (t + 1), dtype=torch.long, device=probs.device)
    hist.scatter_add_(0, index, torch.ones_like(index))
    hist = hist.view(2, t + 1)
    ge = hist.flip(1).cumsum(1).flip(1)[:, 1:]  # [neg/pos, T]: count with p >= thresholds[i]
    total = hist.sum(1, keepdim=True)
    confmat = torch.empty(t, 2, 2, dtype=torch.long, device=probs.device)
    confmat[:, 0, 1] = ge[0]
    confmat[:, 0, 0] = total[0] - ge[0]
    confmat[:, 1, 1] = ge[1]
    confmat[:, 1, 0] = total[1] - ge[1]
    return confmat
