"""``python -m rocmtrain write-data``: synthetic multi-hot days (reproducible whatever the
worker count, readable by numpy and by data=criteo_multihot) and TorchRec one-hot days
(written by TorchRec's own BinaryCriteoUtils from real Criteo rows) expanded to multi-hot."""

from __future__ import annotations

import zipfile

import numpy as np
import torch
from torchrec.datasets.criteo import BinaryCriteoUtils

from rocmtrain.config.data import DataConfig
from rocmtrain.data import build_datamodule
from rocmtrain.data.multihot_writer import main

TABLES = [1000, 997, 50_000, 7, 65_536, 3, 10, 100, 1_000_003, 2, 11, 13, 17] + [1009] * 13
HOT = [2, 1, 3, 1, 1, 4, 1, 1, 5, 2, 1, 1, 1] * 2


def _dm(path, *, kind="criteo_multihot", tables=TABLES, **cfg):
    dm = build_datamodule(
        DataConfig(kind=kind, path=str(path), batch_size=10, shuffle=False, **cfg),
        num_embeddings_per_feature=tables,
        multi_hot_sizes=None,
        num_dense=13,
        seed=0,
        rank=0,
        world_size=1,
    )
    dm.setup()
    return dm


def _ids(batches, hot):
    """Per feature: ``[rows, hot[f]]`` ids of a list of batches."""
    out = [[] for _ in hot]
    for b in batches:
        kjt = b.sparse_features.to_dict()
        for f, h in enumerate(hot):
            out[f].append(kjt[f"cat_{f}"].values().reshape(-1, h))
    return [torch.cat(x) for x in out]


def test_synthetic_days_are_reproducible_with_any_worker_count(tmp_path):
    args = ["--rows", "70000,3000", "--tables", "50,60,70", "--hot-sizes", "2,1,3", "--seed", "3"]
    assert main(["synthetic", str(tmp_path / "one"), *args, "--workers", "1"]) == 0
    assert main(["synthetic", str(tmp_path / "two"), *args, "--workers", "2"]) == 0
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == [
        f"day_{d}_{k}" for d in (0, 1) for k in ("dense.npy", "labels.npy", "sparse_multi_hot.npz")
    ]
    for name in names:  # rows span two generation blocks; the bytes do not depend on workers
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    npz = tmp_path / "one" / "day_0_sparse_multi_hot.npz"
    with zipfile.ZipFile(npz) as zf:
        assert zf.testzip() is None  # CRCs right: any zip reader (np.load) accepts it
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
    ids = np.load(npz)
    assert [ids[str(f)].shape for f in range(3)] == [(70000, 2), (70000, 1), (70000, 3)]
    for f, rows in enumerate((50, 60, 70)):
        assert ids[str(f)].dtype == np.int32 and 0 <= ids[str(f)].min() <= ids[str(f)].max() < rows
    labels = np.load(tmp_path / "one" / "day_0_labels.npy")
    assert labels.shape == (70000, 1) and abs(labels.mean() - 0.25) < 0.02  # base_ctr
    dm = _dm(tmp_path / "one", tables=[50, 60, 70])
    first = next(iter(dm.train_dataloader()))
    assert first.sparse_features.values()[:20].tolist() == ids["0"][:10].reshape(-1).tolist()


def test_onehot_torchrec_days_expand_to_multihot_seeded_by_the_onehot_id(data_dir, tmp_path):
    src, out = tmp_path / "onehot", tmp_path / "multihot"
    src.mkdir()
    for day in (0, 1):  # TorchRec's own writer, real Criteo rows (raw hex ids)
        BinaryCriteoUtils.tsv_to_npys(
            str(data_dir / "sample_train.txt"),
            *(str(src / f"day_{day}_{k}.npy") for k in ("dense", "sparse", "labels")),
        )
    tables = ",".join(map(str, TABLES))
    hot = ",".join(map(str, HOT))
    args = ["expand", str(src), str(out), "--tables", tables, "--hot-sizes", hot, "--ids", "raw"]
    assert main([*args, "--workers", "1"]) == 0
    for kind in ("dense", "labels"):
        assert (out / f"day_0_{kind}.npy").read_bytes() == (src / f"day_0_{kind}.npy").read_bytes()
    # the one-hot ids as criteo_npy reads them (raw ids % table rows): the reference
    onehot = _dm(src, kind="criteo_npy", npy_ids="raw", val_fraction=0.0, days=[0])
    want = torch.cat(
        [b.sparse_features.values().reshape(26, -1).t() for b in onehot.train_dataloader()]
    )
    multi = _dm(out, days=[0, 1])  # day 0 trains, day 1's first half validates
    got = _ids(list(multi.train_dataloader()), HOT)
    again = _ids(list(multi.val_dataloader()), HOT)
    assert len(got[0]) == 100 and len(again[0]) == 50
    expanded_somewhere = False
    for f, (rows, h) in enumerate(zip(TABLES, HOT, strict=True)):
        assert torch.equal(got[f][:, 0], want[:, f])  # column 0 is the one-hot id
        assert 0 <= int(got[f].min()) and int(got[f].max()) < rows
        assert torch.equal(again[f], got[f][:50])  # day 1 = the same rows: the same expansion
        for x in want[:, f].unique():  # the same one-hot id always expands to the same ids
            assert len(got[f][want[:, f] == x].unique(dim=0)) == 1
        if h > 1 and rows > 100:
            expanded_somewhere |= bool((got[f][:, 1:] != got[f][:, :1]).any())
    assert expanded_somewhere


def test_writer_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["expand", str(tmp_path / "empty"), str(tmp_path / "out"), "--days", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "day_0_dense.npy is missing" in err, err
    assert main(["synthetic", str(tmp_path / "x"), "--rows", "10", "--tables", "5,5"]) == 2
    err = capsys.readouterr().err
    assert "--hot-sizes has 26 entries but --tables 2" in err and err.count("\n") == 1
