"""NormalizedEntropy against an independent float64 formula written with Python's math module."""

from __future__ import annotations

import math

import pytest
import torch

from rocmtrain.metrics import NormalizedEntropy


def reference_ne(logits: list[float], labels: list[float]) -> float:
    """NE = mean BCE / entropy of the mean label, in plain Python floats (float64)."""
    ce = 0.0
    for x, y in zip(logits, labels, strict=True):
        p = 1.0 / (1.0 + math.exp(-x))
        ce -= y * math.log(p) + (1.0 - y) * math.log(1.0 - p)
    c = sum(labels) / len(labels)
    return (ce / len(labels)) / -(c * math.log(c) + (1.0 - c) * math.log(1.0 - c))


def test_matches_the_fp64_formula_over_several_updates():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(1000, generator=gen, dtype=torch.float32) * 2
    labels = (torch.rand(1000, generator=gen) < 0.3).float()
    ne = NormalizedEntropy()
    for chunk in range(4):
        ne.update(logits[chunk * 250 : (chunk + 1) * 250], labels[chunk * 250 : (chunk + 1) * 250])
    want = reference_ne(logits.double().tolist(), labels.double().tolist())
    assert ne.compute().item() == pytest.approx(want, rel=1e-9)


def test_probabilities_input_and_known_values():
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0])
    base = NormalizedEntropy(from_logits=False)
    base.update(torch.full((4,), 0.5), labels)  # predicting the base rate exactly -> NE = 1
    assert base.compute().item() == pytest.approx(1.0, rel=1e-12)
    good = NormalizedEntropy(from_logits=False)
    good.update(torch.tensor([0.9, 0.1, 0.2, 0.8]), labels)
    want = -(2 * math.log(0.9) + 2 * math.log(0.8)) / 4 / math.log(2.0)
    assert good.compute().item() == pytest.approx(want, rel=1e-7)
    assert good.compute().item() < 1.0


def test_empty_is_nan_and_shape_mismatch_is_explained():
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert math.isnan(NormalizedEntropy().compute().item())
    with pytest.raises(ValueError, match="one prediction per label"):
        NormalizedEntropy().update(torch.zeros(3), torch.zeros(4))
