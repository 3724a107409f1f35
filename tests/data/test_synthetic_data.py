"""Synthetic planted-signal data: layout, determinism, id popularity, and that a model can learn it."""

from __future__ import annotations

import math

import pytest
import torch
from torchmetrics.functional.classification import binary_auroc
from torchrec.datasets.criteo import DEFAULT_CAT_NAMES
from torchrec.datasets.utils import Batch

from rocmtrain.config.data import DataConfig, DataConfigError
from rocmtrain.data import build_datamodule

ROWS = [1000, 50, 7, 20000, 300, 3]
MULTI_HOT = [1, 3, 2, 1, 5, 1]


def _dm(rank=0, world_size=1, seed=0, multi_hot=MULTI_HOT, rows=ROWS, **cfg):
    cfg = {"batch_size": 64, "num_train_batches": 6, "num_val_batches": 2, **cfg}
    dm = build_datamodule(
        DataConfig(**cfg),
        num_embeddings_per_feature=rows,
        multi_hot_sizes=multi_hot,
        num_dense=13,
        seed=seed,
        rank=rank,
        world_size=world_size,
    )
    dm.setup("fit")
    return dm


def _same(a: Batch, b: Batch) -> bool:
    return (
        torch.equal(a.dense_features, b.dense_features)
        and torch.equal(a.labels, b.labels)
        and torch.equal(a.sparse_features.values(), b.sparse_features.values())
        and torch.equal(a.sparse_features.lengths(), b.sparse_features.lengths())
    )


def test_batch_layout_matches_the_contract():
    batch = next(iter(_dm().train_dataloader()))
    assert isinstance(batch, Batch)
    assert batch.dense_features.shape == (64, 13) and batch.dense_features.dtype == torch.float32
    assert batch.labels.shape == (64,) and batch.labels.dtype == torch.float32
    assert set(batch.labels.unique().tolist()) <= {0.0, 1.0}
    assert (batch.dense_features >= 0).all()  # softplus, like log-transformed counts
    kjt = batch.sparse_features
    assert kjt.keys() == DEFAULT_CAT_NAMES[: len(ROWS)]
    assert kjt.stride() == 64
    # key-major: all of cat_0's lengths, then cat_1's ...
    expected_lengths = torch.cat([torch.full((64,), m) for m in MULTI_HOT])
    assert torch.equal(kjt.lengths().long(), expected_lengths)
    assert kjt.values().dtype == torch.int64
    for f, (rows, m) in enumerate(zip(ROWS, MULTI_HOT, strict=True)):
        ids = kjt[f"cat_{f}"].values()
        assert ids.numel() == 64 * m
        assert ids.min() >= 0 and ids.max() < rows


def test_deterministic_per_seed_and_different_across_seeds_and_splits():
    a = list(_dm(seed=7).train_dataloader())
    b = list(_dm(seed=7).train_dataloader())
    c = list(_dm(seed=8).train_dataloader())
    assert len(a) == 6 and all(_same(x, y) for x, y in zip(a, b, strict=True))
    assert not _same(a[0], c[0])
    val = list(_dm(seed=7).val_dataloader())
    assert len(val) == 2 and not any(_same(v, t) for v in val for t in a)


def test_each_epoch_draws_new_training_samples_by_default():
    loader = _dm().train_dataloader()
    epoch0, epoch1 = list(loader), list(loader)
    rows = lambda ep: {tuple(r) for b in ep for r in b.dense_features.tolist()}  # noqa: E731
    assert len(epoch1) == 6 and not rows(epoch0) & rows(epoch1)
    again = _dm().train_dataloader()
    list(again)
    assert all(_same(x, y) for x, y in zip(epoch1, list(again), strict=True))  # deterministic


def test_fixed_training_set_is_reshuffled_every_epoch():
    loader = _dm(resample_each_epoch=False).train_dataloader()
    epoch0, epoch1 = list(loader), list(loader)
    assert not all(_same(x, y) for x, y in zip(epoch0, epoch1, strict=True))
    # the same batches each epoch, in a new order (a permutation of this rank's blocks)
    sigs = lambda ep: sorted(float(b.dense_features.sum()) for b in ep)  # noqa: E731
    assert sigs(epoch0) == sigs(epoch1)
    no_shuffle = _dm(resample_each_epoch=False, shuffle=False).train_dataloader()
    assert all(_same(x, y) for x, y in zip(list(no_shuffle), list(no_shuffle), strict=True))


def test_ranks_get_disjoint_blocks_that_match_a_single_rank_run():
    """Rank r of W owns global blocks r, r+W, ...: the 2-rank union equals a 1-rank run's blocks."""
    single = _dm(shuffle=False, num_train_batches=6).train_source
    r0 = _dm(rank=0, world_size=2, shuffle=False, num_train_batches=3).train_source
    r1 = _dm(rank=1, world_size=2, shuffle=False, num_train_batches=3).train_source
    for k in range(3):
        assert _same(r0.batch(0, k), single.batch(0, 2 * k))
        assert _same(r1.batch(0, k), single.batch(0, 2 * k + 1))
        assert not _same(r0.batch(0, k), r1.batch(0, k))


def test_id_popularity_is_zipf_like():
    dm = _dm(rows=[20000], multi_hot=[50], batch_size=512, num_train_batches=4)
    ids = torch.cat([b.sparse_features.values() for b in dm.train_dataloader()])
    counts = torch.bincount(ids, minlength=20000).double()
    n, a = 20000, 1.05
    # P(id = k) ~ integral of x^-a over [k+1, k+2) / normalisation, computed independently
    norm = (1.0 - (n + 1.0) ** (1 - a)) / (a - 1)
    expected_p0 = (1.0 - 2.0 ** (1 - a)) / (a - 1) / norm
    assert counts[0] / ids.numel() == pytest.approx(expected_p0, rel=0.1)
    head = counts[:10].sum() / ids.numel()
    assert head > 0.25  # the 10 most popular of 20000 ids carry a quarter of all lookups
    assert (counts > 0).sum() > 5000  # ... while the tail is still visited


def test_mean_ctr_is_calibrated_and_the_hidden_logit_is_informative():
    dm = _dm(rows=[1000] * 26, multi_hot=None, batch_size=512, num_val_batches=8)
    signal = dm.train_source.signal
    val = list(dm.val_dataloader())
    labels = torch.cat([b.labels for b in val])
    logits = torch.cat([signal.logit(b) for b in val])
    assert labels.mean().item() == pytest.approx(0.25, abs=0.03)
    assert binary_auroc(logits, labels.long()).item() > 0.85
    # the recomputed logit matches the label rate it implies (labels ~ Bernoulli(sigmoid))
    assert torch.sigmoid(logits).mean().item() == pytest.approx(labels.mean().item(), abs=0.03)
    noise = _dm(rows=[1000] * 26, multi_hot=None, batch_size=512, signal_strength=0.0)
    noise_val = list(noise.val_dataloader())
    noise_logits = torch.cat([noise.train_source.signal.logit(b) for b in noise_val])
    assert torch.allclose(noise_logits, noise_logits[0].expand_as(noise_logits))


def test_a_small_model_learns_the_signal_to_auc_070_within_60_steps():
    """The planted signal is learnable: embedding bags + MLP, 60 steps of 256 samples on CPU."""
    torch.manual_seed(0)
    rows = [500] * 8
    dm = _dm(rows=rows, multi_hot=None, batch_size=256, num_train_batches=60, num_val_batches=8)
    embs = torch.nn.ModuleList(torch.nn.EmbeddingBag(n, 4, mode="sum") for n in rows)
    for e in embs:
        torch.nn.init.uniform_(e.weight, -0.01, 0.01)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(13 + 8 * 4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    )
    dense_opt = torch.optim.Adam(mlp.parameters(), lr=3e-3)
    sparse_opt = torch.optim.SGD(embs.parameters(), lr=0.5)

    def forward(b: Batch) -> torch.Tensor:
        ids = b.sparse_features.values().view(8, -1)  # one id per feature: key-major [F, B]
        pooled = [embs[f](ids[f].unsqueeze(1)) for f in range(8)]
        return mlp(torch.cat([b.dense_features, *pooled], 1)).squeeze(1)

    for b in dm.train_dataloader():
        loss = torch.nn.functional.binary_cross_entropy_with_logits(forward(b), b.labels)
        dense_opt.zero_grad()
        sparse_opt.zero_grad()
        loss.backward()
        dense_opt.step()
        sparse_opt.step()
    with torch.no_grad():
        val = list(dm.val_dataloader())
        preds = torch.cat([forward(b) for b in val])
    labels = torch.cat([b.labels for b in val]).long()
    auc = binary_auroc(preds, labels).item()
    assert auc >= 0.70, auc
    assert math.isfinite(loss.item())


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"batch_size": 0}, "data.batch_size=0"),
        ({"num_train_batches": -1}, "data.num_train_batches=-1"),
        ({"kind": "parquet"}, "data.kind='parquet'"),
        ({"base_ctr": 1.5}, "data.base_ctr=1.5"),
        ({"val_fraction": 1.0}, "data.val_fraction=1.0"),
    ],
)
def test_bad_values_name_the_field_the_value_and_the_fix(override, field):
    with pytest.raises(DataConfigError, match=field.replace("(", r"\(")) as err:
        _dm(**override)
    assert ": " in str(err.value) and ("use" in str(err.value) or "choose" in str(err.value))


def test_bad_table_specs_are_rejected():
    with pytest.raises(DataConfigError, match=r"has 27 tables.*use 1-26 tables"):
        _dm(rows=[5] * 27, multi_hot=None)
    with pytest.raises(DataConfigError, match="multi_hot_sizes"):
        _dm(multi_hot=[1, 2])
    with pytest.raises(DataConfigError, match=r"model\.num_embeddings_per_feature\[1\]=0"):
        _dm(rows=[5, 0], multi_hot=None)


def test_compiled_batch_making_is_the_eager_arithmetic():
    """What a GPU run compiles (ids, key-major values, hidden logit, dense features from the
    draws) against the eager function on the same draws: the same ids and dense features, the
    logit to fp64 rounding (Inductor may sum the effects in another order). Compiled here on the
    CPU: the same graph a GPU run compiles, another code generator."""
    signal = _dm().train_source.signal
    gen = torch.Generator().manual_seed(3)
    z, u = signal._draws(128, gen)
    want = signal._made_from_draws(u, z)
    got = torch.compile(signal._made_from_draws, dynamic=False)(u, z)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-12)
    assert torch.equal(got[2], want[2])
    # and the eager function is what generate() packs: its values are the batch's KJT values
    batch = signal.generate(128, torch.Generator().manual_seed(3))
    assert torch.equal(batch.sparse_features.values(), want[0])
    assert torch.equal(batch.dense_features, want[2])
