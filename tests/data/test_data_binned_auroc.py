"""BinnedBinaryAUROC adds exactly torchmetrics' own binned state (its loop path, > 50k preds)."""

import torch
import torchmetrics

from rocmtrain.metrics import BinnedBinaryAUROC


def test_binned_auroc_equals_torchmetrics_loop_and_vectorized_paths():
    g = torch.Generator().manual_seed(0)
    for n, t in [(60_000, 64), (1_000, 7)]:  # > 50k: torchmetrics loops; <= 50k: vectorised
        ref = torchmetrics.classification.BinaryAUROC(thresholds=t)
        fast = BinnedBinaryAUROC(thresholds=t)
        for _ in range(2):
            p = torch.rand(n, generator=g)
            p[:11] = torch.linspace(0, 1, 11)  # values exactly on thresholds and the ends
            y = (torch.rand(n, generator=g) < p).long()
            ref.update(p, y)
            fast.update(p, y)
        assert torch.equal(ref.confmat, fast.confmat)
        assert float(fast.compute()) == float(ref.compute()) > 0.6
