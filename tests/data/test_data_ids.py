"""Categorical ids are never wrapped silently: a negative id (any source) or an id outside its
table (contiguous ``.npy`` ids) is a DataConfigError naming the file, row, feature and value.

Real files written here: ``.npy`` days with numpy (contiguous ids as a preprocessing step would
write them, and TorchRec-style raw ids), and a TSV with a negative id.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rocmtrain.config.data import DataConfig, DataConfigError
from rocmtrain.data import build_datamodule, criteo

ROWS = [50] * 26
N = 40


def _write_day(folder: Path, sparse: np.ndarray, day: int = 0) -> Path:
    """``day_<day>_{dense,sparse,labels}.npy`` in ``folder``; returns the sparse file."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(day)
    np.save(folder / f"day_{day}_dense.npy", rng.random((len(sparse), 13), dtype=np.float32))
    np.save(folder / f"day_{day}_labels.npy", (np.arange(len(sparse)) % 2).reshape(-1, 1))
    sparse_file = folder / f"day_{day}_sparse.npy"
    np.save(sparse_file, sparse)
    return sparse_file


def _ids(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, ROWS[0], size=(N, 26), dtype=np.int64)


def _train_ids(path: Path | str, **cfg: object) -> torch.Tensor:
    cfg = {"kind": "criteo_npy", "path": str(path), "batch_size": 8, "shuffle": False, **cfg}
    dm = build_datamodule(
        DataConfig(val_fraction=0.0, **cfg),  # type: ignore[arg-type]
        num_embeddings_per_feature=ROWS,
        multi_hot_sizes=None,
        num_dense=13,
        seed=0,
        rank=0,
        world_size=1,
    )
    dm.setup("fit")
    return torch.cat(
        [b.sparse_features.values().reshape(26, -1).t() for b in dm.train_dataloader()]
    )


def test_contiguous_ids_in_range_read_back_unchanged(tmp_path: Path) -> None:
    ids = _ids()
    ids[0, :] = ROWS[0] - 1  # the last row of every table is in range
    _write_day(tmp_path, ids)
    assert torch.equal(_train_ids(tmp_path), torch.from_numpy(ids))


@pytest.mark.parametrize("npy_ids", ["contiguous", "raw"])
@pytest.mark.parametrize("eager", [True, False], ids=["at-start", "per-batch"])
def test_negative_npy_id_names_file_feature_and_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, npy_ids: str, eager: bool
) -> None:
    if not eager:  # a memory-mapped day too large to scan at start-up: checked as batches load
        monkeypatch.setattr(criteo, "EAGER_CHECK_IDS", 0)
    ids = _ids()
    ids[13, 4] = -7
    sparse_file = _write_day(tmp_path, ids)
    with pytest.raises(DataConfigError) as err:
        _train_ids(tmp_path, npy_ids=npy_ids)
    msg = str(err.value)
    assert str(sparse_file) in msg and "row 13" in msg, msg
    assert "feature C5 (cat_4)" in msg and "id -7" in msg and "[0, 50)" in msg, msg
    assert "never negative" in msg, msg


def test_contiguous_id_past_its_table_is_an_error_with_the_fix(tmp_path: Path) -> None:
    _write_day(tmp_path, _ids(0), day=0)
    ids = _ids(1)
    ids[2, 25] = ROWS[25]  # one past the last row
    sparse_file = _write_day(tmp_path, ids, day=1)
    with pytest.raises(DataConfigError) as err:
        _train_ids(tmp_path)
    msg = str(err.value)
    assert str(sparse_file) in msg and "row 2" in msg, msg  # the row within day 1's file
    assert "feature C26 (cat_25)" in msg and "id 50" in msg, msg
    assert "model.num_embeddings_per_feature[25]" in msg and "data.npy_ids=raw" in msg, msg


def test_raw_npy_ids_are_hashed_like_torchrec(tmp_path: Path) -> None:
    ids = _ids() + 0x68FD1E00  # raw Criteo ids (int(hex, 16)), far past the tables
    _write_day(tmp_path, ids)
    assert torch.equal(_train_ids(tmp_path, npy_ids="raw"), torch.from_numpy(ids % ROWS[0]))
    with pytest.raises(DataConfigError, match=r"data\.npy_ids=raw"):
        _train_ids(tmp_path)  # the default (contiguous) refuses to wrap them


def test_negative_tsv_id_names_file_line_and_feature(tmp_path: Path) -> None:
    good = "\t".join(["1"] + ["3"] * 13 + ["68fd1e64"] * 26)
    cells = ["0"] + ["3"] * 13 + ["68fd1e64"] * 26
    cells[1 + 13 + 2] = "-5"
    bad = "\t".join(cells)
    tsv = tmp_path / "train.tsv"
    tsv.write_text("\n".join([good, good, bad, good]) + "\n")
    cfg = DataConfig(kind="criteo_tsv", path=str(tsv), batch_size=2, val_fraction=0.0)
    with pytest.raises(DataConfigError) as err:
        build_datamodule(
            cfg, num_embeddings_per_feature=ROWS, multi_hot_sizes=None, num_dense=13, seed=0
        ).setup("fit")
    msg = str(err.value)
    assert f"{tsv}:3 feature C3" in msg and "'-5'" in msg and "never negative" in msg, msg


def test_unknown_npy_ids_value_names_the_choices() -> None:
    with pytest.raises(DataConfigError, match=r"data\.npy_ids.*contiguous, raw"):
        DataConfig(kind="criteo_npy", path=".", npy_ids="modulo").validate()
