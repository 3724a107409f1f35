"""Criteo loaders on the REAL rows in tests/fixtures/criteo (TSV: sample_train.txt, CSV: criteo_sample.txt)
and on TorchRec's .npy format written by TorchRec's own BinaryCriteoUtils."""

from __future__ import annotations

import csv
import gzip
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torchrec.datasets.criteo import BinaryCriteoUtils

from rocmtrain.config.data import DataConfig, DataConfigError
from rocmtrain.data import build_datamodule, criteo_files
from rocmtrain.data.criteo_files import parse_hex

ROWS = [1000, 997, 50_000, 7, 65_536, 3, 10, 100, 1_000_003, 2, 11, 13, 17] + [1009] * 13


def _dm(path, *, rows=ROWS, rank=0, world_size=1, **cfg):
    path = None if path is None else str(path)
    cfg = {"kind": "criteo_tsv", "path": path, "batch_size": 10, "shuffle": False, **cfg}
    dm = build_datamodule(
        DataConfig(**cfg),
        num_embeddings_per_feature=rows,
        multi_hot_sizes=None,
        num_dense=13,
        seed=0,
        rank=rank,
        world_size=world_size,
    )
    dm.setup("fit")
    return dm


def _all(loader):
    batches = list(loader)
    dense = torch.cat([b.dense_features for b in batches])
    labels = torch.cat([b.labels for b in batches])
    ids = torch.cat([b.sparse_features.values().reshape(26, -1).t() for b in batches])
    return dense, ids, labels


def _raw_rows(path: Path, delimiter: str, header: bool) -> list[list[str]]:
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh, delimiter=delimiter))
    return rows[1:] if header else rows


def test_tsv_real_rows_count_labels_and_a_hand_checked_row(data_dir):
    path = data_dir / "sample_train.txt"
    raw = _raw_rows(path, "\t", header=False)
    assert len(raw) == 100
    dm = _dm(path, val_fraction=0.0)
    dense, ids, labels = _all(dm.train_dataloader())
    assert dense.shape == (100, 13) and ids.shape == (100, 26) and labels.shape == (100,)
    assert set(labels.tolist()) == {0.0, 1.0}
    assert int(labels.sum()) == sum(int(r[0]) for r in raw)
    # row 2 of the file, by hand: "1  0  559  2  7  2532  164  98  6  943  0  18  0  7  68fd1e64 ..."
    assert labels[1] == 1.0
    assert dense[1, 0].item() == pytest.approx(0.0)  # I1 = 0 -> log(1)
    assert dense[1, 1].item() == pytest.approx(math.log(560.0), rel=1e-6)  # I2 = 559
    assert dense[1, 4].item() == pytest.approx(math.log(2533.0), rel=1e-6)  # I5 = 2532
    assert ids[1, 0].item() == 0x68FD1E64 % 1000  # C1 = 68fd1e64
    assert ids[1, 8].item() == 0xA73EE510 % 1_000_003  # C9 = a73ee510
    # row 1: I1 empty (missing -> 0), C22 empty (missing -> id 0)
    assert raw[0][1] == "" and dense[0, 0].item() == 0.0
    assert raw[0][14 + 21] == "" and ids[0, 21].item() == 0
    # every cell, recomputed independently with the csv module and Python ints
    for i, row in enumerate(raw):
        want_dense = [math.log1p(max(float(x or 0), 0.0)) for x in row[1:14]]
        want_ids = [int(c or "0", 16) % n for c, n in zip(row[14:], ROWS, strict=True)]
        assert dense[i].tolist() == pytest.approx(want_dense, rel=1e-6, abs=1e-7)
        assert ids[i].tolist() == want_ids


def test_csv_with_header_real_rows_negative_and_float_values(data_dir):
    path = data_dir / "criteo_sample.txt"
    raw = _raw_rows(path, ",", header=True)
    assert len(raw) == 200
    dense, ids, labels = _all(_dm(path, val_fraction=0.0).train_dataloader())
    assert dense.shape[0] == 200
    assert int(labels.sum()) == sum(int(r[0]) for r in raw)
    # row 2: "0,,-1,19.0,35.0,30251.0,..." -> I1 missing, I2 = -1 clipped to 0
    assert raw[1][1] == "" and raw[1][2] == "-1"
    assert dense[1, :3].tolist() == pytest.approx([0.0, 0.0, math.log(20.0)], rel=1e-6)
    assert dense[1, 3].item() == pytest.approx(math.log(36.0), rel=1e-6)
    assert ids[1, 0].item() == 0x68FD1E64 % 1000
    assert ids[0, 19].item() == 0  # C20 empty in row 1
    for i, row in enumerate(raw):
        want_ids = [int(c or "0", 16) % n for c, n in zip(row[14:], ROWS, strict=True)]
        assert ids[i].tolist() == want_ids


def test_val_fraction_holds_out_the_last_rows(data_dir):
    path = data_dir / "sample_train.txt"
    full_dense, _, _ = _all(_dm(path, val_fraction=0.0).train_dataloader())
    dm = _dm(path, val_fraction=0.2)
    train_dense, _, _ = _all(dm.train_dataloader())
    val_dense, _, _ = _all(dm.val_dataloader())
    assert torch.equal(train_dense, full_dense[:80]) and torch.equal(val_dense, full_dense[80:])


def test_ranks_get_disjoint_shards_covering_every_row(data_dir):
    path = data_dir / "criteo_sample.txt"
    full = _all(_dm(path, val_fraction=0.0).train_dataloader())[1]
    shards = [
        _all(
            _dm(
                path,
                val_fraction=0.0,
                rank=r,
                world_size=3,
                batch_size=16,
                drop_last=False,
                shuffle=True,
            ).train_dataloader()
        )[1]
        for r in range(3)
    ]
    assert (
        len(
            {
                len(list(_dm(path, rank=r, world_size=3, batch_size=16).train_dataloader()))
                for r in range(3)
            }
        )
        == 1
    )
    union = torch.cat(shards)
    assert union.shape[0] == 200
    # same multiset of rows as the unsharded data, none repeated
    key = lambda t: sorted(map(tuple, t.tolist()))  # noqa: E731
    assert key(union) == key(full)


def test_npy_written_by_torchrec_reads_back_like_the_tsv(data_dir, tmp_path):
    src = data_dir / "sample_train.txt"
    for day in (0, 1):  # two days: rows 0..99 then 0..99 again
        BinaryCriteoUtils.tsv_to_npys(
            str(src),
            str(tmp_path / f"day_{day}_dense.npy"),
            str(tmp_path / f"day_{day}_sparse.npy"),
            str(tmp_path / f"day_{day}_labels.npy"),
        )
    raw = _raw_rows(src, "\t", header=False)
    ints = np.array([[int(x or "0") for x in r[1:14]] for r in raw], dtype=np.float64)
    want_dense = np.log(ints - ints.min() + 2)  # TorchRec's transform, stored in the file
    npy = _dm(tmp_path, kind="criteo_npy", npy_ids="raw", val_fraction=0.0)
    dense, ids, labels = _all(npy.train_dataloader())
    assert dense.shape == (200, 13)
    np.testing.assert_allclose(dense[:100].numpy(), want_dense, rtol=1e-6)
    assert torch.equal(dense[:100], dense[100:])
    _, tsv_ids, tsv_labels = _all(_dm(src, val_fraction=0.0).train_dataloader())
    assert torch.equal(ids[:100], tsv_ids) and torch.equal(ids[100:], tsv_ids)
    assert torch.equal(labels[:100], tsv_labels)
    one_day = _dm(
        tmp_path, kind="criteo_npy", npy_ids="raw", days=[1], val_fraction=0.1, mmap=False
    )
    assert sum(b.labels.numel() for b in one_day.train_dataloader()) == 90
    assert sum(b.labels.numel() for b in one_day.val_dataloader()) == 10


def test_missing_file_names_data_path_and_the_fix(tmp_path):
    with pytest.raises(DataConfigError, match=r"data\.path='/nope/train\.txt'.*no such file"):
        _dm("/nope/train.txt")
    with pytest.raises(DataConfigError, match=r"data\.path=None.*set data\.path="):
        _dm(None)
    (tmp_path / "day_0_dense.npy").write_bytes(b"")
    with pytest.raises(DataConfigError, match=r"day_0_sparse\.npy is missing"):
        _dm(tmp_path, kind="criteo_npy")
    for kind in ("sparse", "labels"):
        (tmp_path / f"day_0_{kind}.npy").write_bytes(b"")
    with pytest.raises(DataConfigError, match=r"day_0_dense\.npy is not a readable \.npy"):
        _dm(tmp_path, kind="criteo_npy")
    with pytest.raises(DataConfigError, match=r"data\.path=.*no day_<X>_dense\.npy"):
        _dm(tmp_path / "..", kind="criteo_npy")


def test_folder_of_gzipped_tsv_and_forced_formats(data_dir, tmp_path):
    src = data_dir / "sample_train.txt"
    (tmp_path / "part_0.tsv.gz").write_bytes(gzip.compress(src.read_bytes()))
    (tmp_path / "part_1.txt").write_bytes(src.read_bytes())
    (tmp_path / "README").write_text("not data")  # ignored: no Criteo suffix
    dense, ids, _ = _all(_dm(tmp_path, val_fraction=0.0).train_dataloader())
    one_dense, one_ids, _ = _all(_dm(src, val_fraction=0.0).train_dataloader())
    assert torch.equal(dense, torch.cat([one_dense, one_dense]))
    assert torch.equal(ids, torch.cat([one_ids, one_ids]))
    assert dense.shape[0] == 200
    with pytest.raises(DataConfigError, match=r"criteo_sample\.txt:2 has 1 tab-separated"):
        _dm(data_dir / "criteo_sample.txt", file_format="tsv")
    capped = _dm(src, val_fraction=0.0, max_rows=30)
    assert sum(b.labels.numel() for b in capped.train_dataloader()) == 30


def test_malformed_rows_and_mismatched_model_are_reported(data_dir, tmp_path):
    bad = tmp_path / "bad.tsv"
    lines = (data_dir / "sample_train.txt").read_text().splitlines()
    bad.write_text("\n".join([lines[0], lines[1].split("\t", 1)[1]]) + "\n")  # row 2 lacks label
    with pytest.raises(DataConfigError, match=r"bad\.tsv:2 has 39 tab-separated columns"):
        _dm(bad)
    with pytest.raises(
        DataConfigError, match=r"model\.num_dense_features=8 .* set model\.num_dense_features=13"
    ):
        build_datamodule(
            DataConfig(kind="criteo_tsv", path=str(bad)),
            num_embeddings_per_feature=ROWS,
            multi_hot_sizes=None,
            num_dense=8,
            seed=0,
        )
    with pytest.raises(DataConfigError, match=r"data\.batch_size=4096 is invalid"):
        _dm(data_dir / "sample_train.txt", batch_size=4096)
    with pytest.raises(DataConfigError, match=r"val split has 1 rows, fewer than the 2 ranks"):
        _dm(data_dir / "sample_train.txt", val_fraction=0.01, world_size=2)


def test_parse_hex_matches_python_int_on_edge_cases():
    cells = np.array([["68fd1e64", "", "A73EE510", "f", "0", "fffffffffffffff"]])
    want = [int(c or "0", 16) for c in cells[0]]
    assert parse_hex(cells).tolist() == [want]
    with pytest.raises(DataConfigError, match=r"'zz'.*not a hex id"):
        parse_hex(np.array([["12", "zz"]]))
    with pytest.raises(DataConfigError, match=r"at most 15"):
        parse_hex(np.array([["1" * 16]]))


def test_chunked_streaming_keeps_rows_line_numbers_and_max_rows(data_dir, tmp_path, monkeypatch):
    src = data_dir / "sample_train.txt"
    whole_dense, whole_ids, whole_labels = _all(_dm(src, val_fraction=0.0).train_dataloader())
    monkeypatch.setattr(criteo_files, "CHUNK_ROWS", 7)  # 100 rows -> 15 chunks
    dense, ids, labels = _all(_dm(src, val_fraction=0.0).train_dataloader())
    assert torch.equal(dense, whole_dense) and torch.equal(ids, whole_ids)
    assert torch.equal(labels, whole_labels)
    capped = _all(_dm(src, val_fraction=0.0, max_rows=30).train_dataloader())[0]
    assert torch.equal(capped, whole_dense[:30])
    lines = src.read_text().splitlines()
    bad = tmp_path / "gap.tsv"  # a blank line 3, then a bad label on line 12
    bad_row = "7" + lines[10][1:]
    bad.write_text("\n".join(lines[:2] + [""] + lines[2:10] + [bad_row] + lines[11:20]) + "\n")
    with pytest.raises(DataConfigError, match=r"gap\.tsv:12 has label 7;"):
        _dm(bad)
