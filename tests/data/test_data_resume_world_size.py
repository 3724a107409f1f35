"""A data position saved on one world size resumes on another at the same global sample.

Each kind (synthetic, criteo_npy, criteo_tsv, criteo_multihot): 2 ranks train a few batches of
an epoch, rank 0's position is saved, and 1, 3 or 4 ranks finish the epoch from it; every
sample of the epoch is trained exactly once across the change (checked by sample, not count),
and a second change inside the resumed epoch keeps that true.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_criteo_multihot import write_day

from rocmtrain.config.data import DataConfig
from rocmtrain.data import build_datamodule

TABLES = [50, 40, 30, 20]


def _dm(cfg: dict, rank: int, world: int, hot=None):
    dm = build_datamodule(
        DataConfig(**cfg),
        num_embeddings_per_feature=TABLES,
        multi_hot_sizes=hot,
        num_dense=13,
        seed=5,
        rank=rank,
        world_size=world,
    )
    dm.setup("fit")
    return dm


def _samples(batch) -> list[tuple]:
    """One key per sample (its dense features: distinct for every sample here)."""
    return [tuple(row) for row in batch.dense_features.tolist()]


def _train(cfg: dict, world: int, state: dict | None, steps: int | None, hot=None):
    """``world`` ranks train ``steps`` batches each (None: to the epoch's end) from ``state``;
    returns the samples seen and rank 0's position after."""
    seen: list[tuple] = []
    position = None
    for rank in range(world):
        dm = _dm(cfg, rank, world, hot)
        if state is not None:
            dm.load_state_dict(state)
        loader = dm.train_dataloader()
        for i, batch in enumerate(loader):
            seen += _samples(batch)
            if steps is not None and i + 1 == steps:
                break
        if rank == 0:
            position = dm.state_dict()
    return seen, position


def _epoch(cfg: dict, world: int, hot=None) -> list[tuple]:
    return _train(cfg, world, None, None, hot)[0]


def _npy(folder: Path, rows: int) -> None:
    rng = np.random.default_rng(1)
    dense = rng.random((rows, 13), dtype=np.float32)
    dense[:, 0] = np.arange(rows)
    sparse = np.zeros((rows, 26), dtype=np.int64)
    for f, n in enumerate(TABLES):
        sparse[:, f] = rng.integers(0, n, rows)
    np.save(folder / "day_0_dense.npy", dense)
    np.save(folder / "day_0_sparse.npy", sparse)
    np.save(folder / "day_0_labels.npy", rng.integers(0, 2, (rows, 1)))


def _tsv(folder: Path, rows: int) -> Path:
    lines = [
        "\t".join([str(i % 2), str(i), *["1"] * 12, *[format(i * 7 + c, "x") for c in range(26)]])
        for i in range(rows)
    ]
    (folder / "train.tsv").write_text("\n".join(lines) + "\n")
    return folder / "train.tsv"


@pytest.fixture
def kinds(tmp_path):
    """name -> (data config, multi_hot sizes) of every kind, with shuffling on."""
    (tmp_path / "npy").mkdir()
    _npy(tmp_path / "npy", 203)
    tsv = _tsv(tmp_path, 197)
    (tmp_path / "mh").mkdir()
    write_day(tmp_path / "mh", 0, 211, hot=[3, 1, 2, 5])
    write_day(tmp_path / "mh", 1, 20, hot=[3, 1, 2, 5])  # the last day validates
    common = {"batch_size": 8, "val_fraction": 0.0, "drop_last": False, "shuffle": True}
    return {
        "synthetic": (
            {"kind": "synthetic", "batch_size": 8, "num_train_batches": 6,
             "resample_each_epoch": False},
            [1, 2, 1, 3],
        ),
        "synthetic_resample": (
            {"kind": "synthetic", "batch_size": 8, "num_train_batches": 6}, [1, 2, 1, 3],
        ),
        "criteo_npy": ({"kind": "criteo_npy", "path": str(tmp_path / "npy"), **common}, None),
        "criteo_tsv": ({"kind": "criteo_tsv", "path": str(tsv), **common}, None),
        "criteo_multihot": (
            {"kind": "criteo_multihot", "path": str(tmp_path / "mh"), **common},
            [3, 1, 2, 5],
        ),
    }  # fmt: skip


@pytest.mark.parametrize(
    "kind", ["synthetic", "synthetic_resample", "criteo_npy", "criteo_tsv", "criteo_multihot"]
)
@pytest.mark.parametrize("new_world", [1, 3, 4])
def test_epoch_seen_once_across_world_size_change(kinds, kind, new_world):
    cfg, hot = kinds[kind]
    whole = _epoch(cfg, 2, hot)
    assert len(set(whole)) == len(whole)
    before, state = _train(cfg, 2, None, 2, hot)
    assert state["world_size"] == 2 and state["samples"] == 2 * 2 * 8
    after, _ = _train(cfg, new_world, state, None, hot)
    assert sorted(before + after) == sorted(whole)


@pytest.mark.parametrize("kind", ["synthetic", "criteo_npy"])
def test_second_change_inside_a_resumed_epoch(kinds, kind):
    cfg, hot = kinds[kind]
    whole = _epoch(cfg, 2, hot)
    first, state = _train(cfg, 2, None, 2, hot)
    second, state = _train(cfg, 3, state, 1, hot)
    assert state["resumed"] and state["samples"] > 2 * 2 * 8
    back, state = _train(cfg, 2, state, None, hot)  # the old world size, mid resumed epoch
    assert sorted(first + second + back) == sorted(whole)


def test_same_world_size_keeps_the_batch_index(kinds):
    cfg, hot = kinds["criteo_npy"]
    _, state = _train(cfg, 2, None, 3, hot)
    dm = _dm(cfg, 0, 2, hot)
    dm.load_state_dict(state)
    assert dm.state_dict() == state


def test_finished_epoch_resumes_with_the_next(kinds):
    cfg, hot = kinds["criteo_npy"]
    _, state = _train(cfg, 2, None, None, hot)
    dm = _dm(cfg, 0, 3, hot)
    dm.load_state_dict(state)
    loader = dm.train_dataloader()
    assert dm.state_dict()["epoch"] == 0 and dm.state_dict()["batch"] == len(dm.train_source)
    first = next(iter(loader))
    assert dm.state_dict()["epoch"] == 1 and len(first.labels) == 8


@pytest.mark.parametrize("kind", ["synthetic", "synthetic_resample"])
def test_rest_of_a_larger_epoch_fits_by_growing_batches(kinds, kind):
    """Synthetic epochs are num_train_batches per rank: the rest of a 4-rank epoch is longer than
    a 1-rank epoch, so its batches grow rather than drop samples."""
    cfg, hot = kinds[kind]
    whole = _epoch(cfg, 4, hot)
    before, state = _train(cfg, 4, None, 1, hot)
    after, _ = _train(cfg, 1, state, None, hot)
    assert sorted(before + after) == sorted(whole)
