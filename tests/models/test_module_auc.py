"""DLRMModule's AUC metrics: exact by default, binned (O(B) update) with auc_num_thresholds.

Reference: torchmetrics' own BinaryAUROC on the same predictions (exact = sorted ranks, binned =
its T-threshold loop), on a batch above torchmetrics' 50k-sample vectorisation cut.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torchmetrics.classification import BinaryAUROC


@pytest.mark.parametrize("thresholds", [None, 200])
def test_module_auc_matches_torchmetrics(thresholds):
    from rocmtrain.config.model import ModelConfig
    from rocmtrain.metrics import BinnedBinaryAUROC
    from rocmtrain.models.module import DLRMModule

    cfg = dataclasses.replace(
        ModelConfig(),
        num_embeddings_per_feature=[50, 40],
        embedding_dim=8,
        dense_arch_layer_sizes=[8, 8],
        over_arch_layer_sizes=[8, 1],
        auc_num_thresholds=thresholds,
    )
    module = DLRMModule(cfg, verbose=False)
    assert isinstance(module.val_auc, BinnedBinaryAUROC)  # binned: O(B) update, no T-loop
    gen = torch.Generator().manual_seed(0)
    reference = BinaryAUROC(thresholds=thresholds)
    for _ in range(2):
        labels = (torch.rand(60_000, generator=gen) < 0.3).long()
        probs = (torch.rand(60_000, generator=gen) * 0.7 + 0.3 * labels).clamp(0, 1)
        module.val_auc.update(probs, labels)
        reference.update(probs, labels)
    got, want = float(module.val_auc.compute()), float(reference.compute())
    assert 0.6 < want < 0.99
    assert got == pytest.approx(want, abs=1e-6)
