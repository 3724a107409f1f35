"""Synthetic batches made on the GPU (the GPU recipes' default): on the device, deterministic
per batch, no host sync per batch, and the planted signal intact. Skipped without a GPU; run on
the benchmark machine with ``python -m pytest tests/data/test_synthetic_gpu.py -m gpu``."""

from __future__ import annotations

import pytest
import torch

from rocmtrain.config.data import DataConfig
from rocmtrain.data.synthetic import synthetic_factory

pytestmark = pytest.mark.gpu

MULTI_HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]


def _source(device: torch.device, batch: int = 65536):
    cfg = DataConfig(batch_size=batch, num_train_batches=4, num_val_batches=1)
    rows = [min(r, 10_000_000) for r in [40_000_000, 39060, 17295, 7424, 20265, 3, 7122, 1543,
            63, 40_000_000, 3067956, 405282, 10, 2209, 11938, 155, 4, 976, 14, 40_000_000,
            40_000_000, 40_000_000, 590152, 12973, 108, 36]]  # fmt: skip
    factory = synthetic_factory(cfg, rows=rows, multi_hot=MULTI_HOT, num_dense=13, seed=1234)
    return factory("train", 0, 1, device), rows


def _auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    order = scores.argsort()
    ranks = torch.empty_like(order, dtype=torch.float64)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64, device=scores.device)
    pos = labels.bool()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def test_batches_are_made_on_the_gpu_deterministically_without_host_syncs():
    device = torch.device("cuda", torch.cuda.current_device())
    source, rows = _source(device)
    first = source.batch(0, 1)  # copies the generator's constants to the device once
    kjt = first.sparse_features
    for t in (first.dense_features, kjt.values(), kjt.lengths(), first.labels):
        assert t.device == device
    assert kjt.values().numel() == 65536 * sum(MULTI_HOT)
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = source.batch(0, 1)
        other = source.batch(1, 1)  # the next epoch's batch 1: new samples
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.equal(again.sparse_features.values(), kjt.values())
    assert torch.equal(again.labels, first.labels)
    assert not torch.equal(other.sparse_features.values(), kjt.values())
    by_key = kjt.to_dict()
    for f, r in enumerate(rows):
        ids = by_key[f"cat_{f}"].values()
        assert 0 <= int(ids.min()) and int(ids.max()) < r


def test_the_planted_signal_survives_the_move_to_the_gpu():
    device = torch.device("cuda", torch.cuda.current_device())
    gpu, _ = _source(device)
    cpu, _ = _source(torch.device("cpu"), batch=65536)
    for source in (gpu, cpu):
        batch = source.batch(0, 0)
        labels = batch.labels.double()
        assert abs(float(labels.mean()) - 0.25) < 0.01  # the calibrated click rate
        auc = _auc(source.signal.logit(batch), labels)
        assert 0.85 < auc < 0.95, auc  # Bayes-optimal AUC of the planted signal ~0.9


def test_the_compiled_gpu_batch_is_the_eager_arithmetic():
    """The GPU batch (made by the compiled function) against the eager function on the same
    draws, on the GPU: the same ids and dense features, the labels from the same logit."""
    from rocmtrain.data.batch import generator

    device = torch.device("cuda", torch.cuda.current_device())
    source, _ = _source(device)
    batch = source.global_block_batch(0)
    gen = generator(source.signal.seed, source.split_code, 0, device=device)
    z, u = source.signal._draws(65536, gen)
    values, logit, dense = source.signal._made_from_draws(u, z)
    assert torch.equal(batch.sparse_features.values(), values)
    assert torch.equal(batch.dense_features, dense)
    labels = torch.bernoulli(torch.sigmoid(logit), generator=gen)
    assert torch.equal(batch.labels, labels)
