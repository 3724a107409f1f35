"""data.cache_batches: a few distinct synthetic batches, generated once and cycled; resume exact."""

import pytest
import torch

from rocmtrain.config.data import DataConfig, DataConfigError
from rocmtrain.data import build_datamodule


def _dm(**kw):
    cfg = DataConfig(batch_size=16, num_train_batches=7, num_val_batches=1, **kw)
    dm = build_datamodule(
        cfg, num_embeddings_per_feature=[50, 80], multi_hot_sizes=[2, 3], num_dense=4, seed=3
    )
    dm.setup()
    return dm


def _key(batch):
    return (batch.dense_features, batch.sparse_features.values(), batch.labels)


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(_key(a), _key(b), strict=True))


def test_cached_batches_cycle_deterministically_and_resume_exactly():
    dm = _dm(cache_batches=3)
    epoch = list(dm.train_dataloader())
    assert len(epoch) == 7
    distinct = []
    for b in epoch:
        if not any(_same(b, d) for d in distinct):
            distinct.append(b)
    assert len(distinct) == 3  # only the cached batches come back
    # the cached batches are the generator's own blocks 0..2 (planted signal intact)
    plain = _dm(cache_batches=0).train_source
    assert all(any(_same(d, plain.block(k, None)) for k in range(3)) for d in distinct)
    assert all(
        _same(a, b)
        for a, b in zip(epoch, list(_dm(cache_batches=3).train_dataloader()), strict=True)
    )
    # resume in the middle of the epoch: the same batches as the uninterrupted run
    resumed = _dm(cache_batches=3)
    resumed.load_state_dict({"epoch": 0, "batch": 4})
    rest = list(resumed.train_dataloader())
    assert len(rest) == 3 and all(_same(a, b) for a, b in zip(rest, epoch[4:], strict=True))


def test_cache_batches_bad_values_name_the_field():
    with pytest.raises(DataConfigError, match="data.cache_batches=-1"):
        DataConfig(cache_batches=-1).validate()
    with pytest.raises(DataConfigError, match="only synthetic"):
        DataConfig(kind="criteo_tsv", path="/", cache_batches=2).validate()
