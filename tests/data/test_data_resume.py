"""The data position is saveable: a resumed run sees exactly the batches of an uninterrupted one."""

from __future__ import annotations

import pytest
import torch

from rocmtrain.config.data import DataConfig
from rocmtrain.data import build_datamodule


def _dm(**cfg):
    cfg = {"batch_size": 32, "num_train_batches": 7, "num_val_batches": 2, **cfg}
    dm = build_datamodule(
        DataConfig(**cfg),
        num_embeddings_per_feature=[100] * 4,
        multi_hot_sizes=[1, 2, 1, 3],
        num_dense=13,
        seed=3,
    )
    return dm


def _key(batch) -> tuple:
    return (
        batch.dense_features.sum().item(),
        tuple(batch.labels.tolist()),
        tuple(batch.sparse_features.values().tolist()),
    )


def _take(loader, n_epochs: int, stop_after: int | None = None) -> list[tuple]:
    out: list[tuple] = []
    for _ in range(n_epochs):
        for batch in loader:
            out.append(_key(batch))
            if stop_after is not None and len(out) == stop_after:
                return out
    return out


@pytest.mark.parametrize("stop_after", [3, 7, 10, 14])
def test_resume_continues_exactly_like_an_uninterrupted_run(stop_after):
    reference = _take(_dm().train_dataloader(), n_epochs=3)
    assert len(reference) == 21 and len(set(reference[:7])) == 7

    first = _dm()
    first.setup()
    seen = _take(first.train_dataloader(), n_epochs=3, stop_after=stop_after)
    state = first.state_dict()
    assert state == {"epoch": (stop_after - 1) // 7, "batch": (stop_after - 1) % 7 + 1}

    resumed = _dm()
    resumed.load_state_dict(state)  # before setup, as Lightning does on restore
    loader = resumed.train_dataloader()
    rest = _take(loader, n_epochs=3 - stop_after // 7)
    assert seen + rest == reference


def test_load_after_setup_and_epoch_end_state_moves_to_next_epoch():
    reference = _take(_dm().train_dataloader(), n_epochs=2)
    dm = _dm()
    dm.setup()
    dm.load_state_dict({"epoch": 0, "batch": 7})  # saved at the end of epoch 0
    assert _take(dm.train_dataloader(), n_epochs=1) == reference[7:]


def test_resume_with_dataloader_workers_gives_the_same_batches():
    reference = _take(_dm().train_dataloader(), n_epochs=1)
    dm = _dm(num_workers=2)
    dm.load_state_dict({"epoch": 0, "batch": 2})
    assert _take(dm.train_dataloader(), n_epochs=1) == reference[2:]
    full = _dm(num_workers=2)
    assert _take(full.train_dataloader(), n_epochs=1) == reference


def test_validation_data_is_fixed_across_epochs():
    dm = _dm()
    loader = dm.val_dataloader()
    a, b = _take(loader, 1), _take(loader, 1)
    assert a == b and len(a) == 2
    assert torch.is_tensor(next(iter(loader)).labels)
