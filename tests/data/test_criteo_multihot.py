"""data=criteo_multihot on small MLPerf-layout folders written here with plain numpy (np.save,
np.savez): batches read back against numpy, every row once per epoch across ranks, the MLPerf
validation split, exact resume, and one-line errors for each bad input."""

from __future__ import annotations

import math
import os
import re
import sys
import threading
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rocmtrain.config.data import DataConfig, DataConfigError
from rocmtrain.data import build_datamodule

HOT = [3, 1, 2, 5]
TABLES = [50, 1000, 7, 2**31 - 1]  # small tables: the % matters; the last: ids fit, no wrap
TAG = 100_000  # dense column 0 = day * TAG + row: which file row a sample came from


def write_day(
    folder: Path, day: int, rows: int, *, hot=HOT, seed: int = 0, replace: dict | None = None
) -> None:
    """One MLPerf-layout day with numpy's own writers; ``replace`` swaps arrays by name
    (``dense``, ``labels`` or a feature number) before they are written."""
    rng = np.random.default_rng([seed, day])
    dense = rng.random((rows, 13), dtype=np.float32)
    dense[:, 0] = day * TAG + np.arange(rows)
    arrays = {
        "dense": dense,
        "labels": rng.integers(0, 2, (rows, 1)).astype(np.int32),
        **{f: rng.integers(0, 2**31 - 1, (rows, h), dtype=np.int32) for f, h in enumerate(hot)},
    }
    arrays.update(replace or {})
    np.save(folder / f"day_{day}_dense.npy", arrays["dense"])
    np.save(folder / f"day_{day}_labels.npy", arrays["labels"])
    members = {str(k): v for k, v in arrays.items() if isinstance(k, int)}
    np.savez(folder / f"day_{day}_sparse_multi_hot.npz", **members)


def make_dm(path, *, rank=0, world_size=1, tables=TABLES, hot=None, **cfg):
    cfg = {"kind": "criteo_multihot", "path": str(path), "batch_size": 16, **cfg}
    dm = build_datamodule(
        DataConfig(**cfg),
        num_embeddings_per_feature=tables,
        multi_hot_sizes=hot,
        num_dense=13,
        seed=4,
        rank=rank,
        world_size=world_size,
    )
    dm.setup("fit")
    return dm


def tags(batch) -> list[int]:
    return batch.dense_features[:, 0].to(torch.int64).tolist()


@pytest.fixture
def folder(tmp_path) -> Path:
    for day, rows in ((0, 150), (1, 97), (2, 60)):
        write_day(tmp_path, day, rows)
    return tmp_path


def test_batch_values_equal_the_files_rows_read_back_with_numpy(folder):
    dm = make_dm(folder, days=[0, 1, 2], shuffle_window_rows=40)
    zips = {d: np.load(folder / f"day_{d}_sparse_multi_hot.npz") for d in (0, 1)}
    labels = {d: np.load(folder / f"day_{d}_labels.npy") for d in (0, 1)}
    with zipfile.ZipFile(folder / "day_1_sparse_multi_hot.npz") as zf:
        assert zf.getinfo("3.npy").header_offset > 0  # members read at non-zero zip offsets
    wrapped = 0
    batches = list(dm.train_dataloader())
    assert len(batches) == (150 + 97) // 16
    for batch in batches:
        day, row = np.divmod(np.array(tags(batch)), TAG)
        kjt = batch.sparse_features.to_dict()
        for f, (hot, size) in enumerate(zip(HOT, TABLES, strict=True)):
            got = kjt[f"cat_{f}"]
            assert got.lengths().tolist() == [hot] * 16
            want = np.stack([zips[d][str(f)][r] for d, r in zip(day, row, strict=True)])
            assert got.values().reshape(16, hot).tolist() == (want.astype(np.int64) % size).tolist()
            wrapped += int((want >= size).sum())
        want_labels = [float(labels[d][r, 0]) for d, r in zip(day, row, strict=True)]
        assert batch.labels.tolist() == want_labels
        assert batch.sparse_features.values().dtype == torch.int64
    assert wrapped > 1000  # the % was exercised, not only ids that already fit


def test_every_row_once_per_epoch_across_two_ranks(folder):
    """Windows of 40 rows, batches of 16 on 2 ranks, 247 rows: windows span batches and the
    last round is spread over the ranks; every file row is trained on exactly once per epoch."""
    every = sorted([*range(150), *range(TAG, TAG + 97)])
    orders = []
    for epoch in range(2):
        seen = []
        for rank in range(2):
            dm = make_dm(
                folder, rank=rank, world_size=2, days=[0, 1, 2], drop_last=False,
                shuffle_window_rows=40,
            )  # fmt: skip
            dm.load_state_dict({"epoch": epoch, "batch": 0})
            seen += [t for b in dm.train_dataloader() for t in tags(b)]
        assert sorted(seen) == every
        orders.append(seen)
    assert orders[0] != orders[1]  # reshuffled per epoch
    assert make_dm(folder, rank=0, world_size=2, days=[0, 1, 2]).train_source.positions(
        0, 0
    ).tolist() != list(range(16))  # shuffled, not file order


def test_mlperf_split_and_val_path(folder, tmp_path_factory):
    dm = make_dm(folder, days=[0, 2], shuffle=False)  # day 2: first half validates
    assert [t for b in dm.val_dataloader() for t in tags(b)] == [2 * TAG + r for r in range(30)]
    assert {t // TAG for b in dm.train_dataloader() for t in tags(b)} == {0}
    other = tmp_path_factory.mktemp("val")
    write_day(other, 5, 21, seed=9)
    dm = make_dm(folder, days=[1], val_path=str(other))
    assert [t for b in dm.val_dataloader() for t in tags(b)] == [5 * TAG + r for r in range(21)]
    assert len(dm.train_dataloader()) == 97 // 16
    with pytest.raises(DataConfigError, match=r"data\.days=\[1\].*at least one more day"):
        make_dm(folder, days=[1])


@pytest.mark.parametrize("stop_after", [5, 10])
def test_resume_mid_epoch_continues_at_the_next_sample(folder, stop_after):
    """10 batches an epoch: stop mid-epoch (5) and at the epoch's end (10); a fresh datamodule
    loaded with the saved position (DataLoader workers on) yields the uninterrupted rest."""
    cfg = {"days": [0, 1, 2], "shuffle_window_rows": 50, "batch_size": 24}

    def run(dm, n):
        out = []
        for _ in range(3):
            for batch in dm.train_dataloader():
                out.append(tags(batch))
                if len(out) == n:
                    return out
        return out

    reference = run(make_dm(folder, **cfg), 2 * 10)
    first = make_dm(folder, **cfg)
    seen = run(first, stop_after)
    state = first.state_dict()
    assert (state["epoch"], state["batch"]) == (0, stop_after)
    resumed = make_dm(folder, num_workers=2, **cfg)
    resumed.load_state_dict(state)
    assert seen + run(resumed, 2 * 10 - stop_after) == reference


def test_hot_sizes_come_from_the_files_or_must_match_the_model(folder):
    batch = next(iter(make_dm(folder, days=[0, 1], hot=HOT).train_dataloader()))
    assert batch.sparse_features.length_per_key() == [16 * h for h in HOT]
    with pytest.raises(DataConfigError) as err:
        make_dm(folder, days=[0, 1], hot=[3, 1, 4, 5])
    assert "day_0_sparse_multi_hot.npz member 2.npy has 2 ids per row" in str(err.value)
    assert "model.multi_hot_sizes[2]=4" in str(err.value)


def _bad(tmp: Path, case: str) -> tuple[dict, str]:
    """Write a folder with one defect; return the datamodule overrides and the expected
    message (a regex naming the file and the array)."""
    write_day(tmp, 1, 40)
    if case == "compressed":
        write_day(tmp, 0, 40)
        arrays = dict(np.load(tmp / "day_0_sparse_multi_hot.npz"))
        np.savez_compressed(tmp / "day_0_sparse_multi_hot.npz", **arrays)
        return {}, r"day_0_sparse_multi_hot\.npz member 0\.npy is compressed.*numpy\.savez"
    if case == "missing member":
        write_day(tmp, 0, 40)
        arrays = dict(np.load(tmp / "day_0_sparse_multi_hot.npz"))
        del arrays["1"]
        np.savez(tmp / "day_0_sparse_multi_hot.npz", **arrays)
        return {}, r"day_0_sparse_multi_hot\.npz has no member 1\.npy"
    if case in ("int64", "float"):
        dtype = np.int64 if case == "int64" else np.float32
        write_day(tmp, 0, 40, replace={2: np.zeros((40, 2), dtype=dtype)})
        return {}, rf"member 2\.npy is {np.dtype(dtype)} \[40, 2\], expected int32.*astype"
    if case == "feature count":
        write_day(tmp, 0, 40, hot=HOT + [1])
        return {}, r"day_0_sparse_multi_hot\.npz holds 5 features .* model has 4 tables"
    if case == "rows differ":
        write_day(tmp, 0, 40, replace={"labels": np.zeros((39, 1), np.int32)})
        return {}, r"day_0_labels\.npy is int32 \[39, 1\], expected 0/1 labels \[40, 1\]"
    if case == "member rows differ":
        write_day(tmp, 0, 40, replace={3: np.zeros((41, 5), np.int32)})
        return {}, r"member 3\.npy has 41 rows but day_0_dense\.npy has 40"
    if case == "hot size":
        write_day(tmp, 0, 40)
        return {"hot": [3, 1, 2, 4]}, r"member 3\.npy has 5 ids per row.*multi_hot_sizes\[3\]=4"
    if case == "truncated npz":
        write_day(tmp, 0, 40)
        npz = tmp / "day_0_sparse_multi_hot.npz"
        npz.write_bytes(npz.read_bytes()[:1500])
        return {}, r"day_0_sparse_multi_hot\.npz is not a readable zip archive.*truncated"
    if case == "truncated npy":
        write_day(tmp, 0, 40)
        dense = tmp / "day_0_dense.npy"
        dense.write_bytes(dense.read_bytes()[:-100])
        return {}, r"day_0_dense\.npy is truncated: .*float32 \[40, 13\]"
    if case == "no such day":
        return {"days": [1, 7]}, r"day 7 does not exist: .*day_7_sparse_multi_hot\.npz is missing"
    raise AssertionError(case)


BAD_INPUTS = [
    "compressed",
    "missing member",
    "int64",
    "float",
    "feature count",
    "rows differ",
    "member rows differ",
    "hot size",
    "truncated npz",
    "truncated npy",
    "no such day",
]


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_naming_file_array_and_fix(tmp_path, case):
    override, pattern = _bad(tmp_path, case)
    hot = override.pop("hot", None)
    with pytest.raises(DataConfigError) as err:
        make_dm(tmp_path, hot=hot, **{"days": [0, 1], **override})
    message = str(err.value)
    assert "\n" not in message and str(tmp_path) in message
    assert re.search(pattern, message), message


def test_windowed_order_is_a_permutation_of_whole_windows_for_odd_sizes():
    from rocmtrain.data.criteo_multihot import WindowedOrder

    for rows, window in ((1, 1), (10, 3), (97, 97), (97, 200), (1000, 64)):
        order = WindowedOrder(rows, window_rows=window, seed_parts=(1, 2))
        cuts = sorted({0, rows, *np.random.default_rng(rows).integers(0, rows, 5).tolist()})
        got = np.concatenate(
            [order.rows(3, a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
        )
        assert sorted(got.tolist()) == list(range(rows))
        # each window's rows come together: the window number changes once per window
        windows = got // min(window, rows)
        assert int((np.diff(windows) != 0).sum()) + 1 == math.ceil(rows / min(window, rows))
        assert np.array_equal(got, order.rows(3, 0, rows))  # the same order however it is cut
        if rows > 1:
            assert not np.array_equal(got, order.rows(4, 0, rows))  # another epoch, another order


def test_a_negative_id_is_reported_when_its_batch_is_read(tmp_path):
    ids = np.zeros((40, 1), np.int32)
    ids[7, 0] = -3  # % would silently wrap it onto row 47 of a 50-row table
    write_day(tmp_path, 0, 40, replace={1: ids})
    write_day(tmp_path, 1, 40)
    dm = make_dm(tmp_path, days=[0, 1], shuffle=False)
    with pytest.raises(DataConfigError) as err:
        list(dm.train_dataloader())
    message = str(err.value)
    assert "\n" not in message
    assert f"{tmp_path}/day_0_sparse_multi_hot.npz member 1.npy row 7 holds id -3" in message


# -- data.read_threads: rows read by threads into host buffers, finished on the training device --


def on_device(dm, device: str):
    """``dm`` set up as a run training on ``device`` (what a DataModule reads of its trainer)."""
    dm.trainer = SimpleNamespace(
        strategy=SimpleNamespace(root_device=torch.device(device)), num_devices=1
    )
    dm.train_source = dm.val_source = None
    dm.setup()
    return dm


def expected(folder: Path, batch, days=(0, 1)) -> tuple[list, list]:
    """The batch's ids (as in the files; and % TABLES, int64) and labels, read back with numpy
    by the row tag in dense column 0."""
    zips = {d: np.load(folder / f"day_{d}_sparse_multi_hot.npz") for d in days}
    labels = {d: np.load(folder / f"day_{d}_labels.npy") for d in days}
    day, row = np.divmod(batch.dense_features[:, 0].to(torch.int64).cpu().numpy(), TAG)
    raw = [np.stack([zips[d][str(f)][r] for d, r in zip(day, row, strict=True)]) for f in range(4)]
    want_labels = [float(labels[d][r, 0]) for d, r in zip(day, row, strict=True)]
    return raw, want_labels


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_read_threads_batches_equal_the_files_rows_read_back_with_numpy(folder, device):
    """A GPU run (``cuda``: built as one, on any machine) reads int32 ids into host buffers and
    ``.to(device)`` widens them and takes ``% rows`` there; a CPU run with reader threads hands
    out finished batches. Both equal the files read back with numpy, and the batch-building
    path's batches for the same (seed, epoch, batch)."""
    threads = None if device == "cuda" else 2  # auto on a GPU run, 0 on a CPU run
    dm = on_device(make_dm(folder, days=[0, 1, 2], shuffle_window_rows=40, read_threads=threads),
                   device)  # fmt: skip
    built = make_dm(folder, days=[0, 1, 2], shuffle_window_rows=40, read_threads=0)
    assert dm.train_source.reader is not None and built.train_source.reader is None
    target = device if device == "cpu" or torch.cuda.is_available() else "cpu"
    wrapped = 0
    batches = list(dm.train_dataloader())
    assert len(batches) == (150 + 97) // 16
    for host, ref in zip(batches, built.train_dataloader(), strict=True):
        raw, want_labels = expected(folder, host)
        if device == "cuda":  # the host batch: the files' int32 ids, nothing taken % yet
            assert host.sparse_features.values().dtype == torch.int32
            got_raw = host.sparse_features.values().split([16 * h for h in HOT])
            assert [g.reshape(16, -1).tolist() for g in got_raw] == [r.tolist() for r in raw]
        batch = host.to(target)
        kjt = batch.sparse_features.to_dict()
        assert batch.sparse_features.values().dtype == torch.int64
        for f, (hot, size) in enumerate(zip(HOT, TABLES, strict=True)):
            got = kjt[f"cat_{f}"].values().cpu().reshape(16, hot)
            assert got.tolist() == (raw[f].astype(np.int64) % size).tolist()
            assert kjt[f"cat_{f}"].lengths().tolist() == [hot] * 16
            wrapped += int((raw[f] >= size).sum())
        assert batch.labels.cpu().tolist() == want_labels
        assert torch.equal(batch.dense_features.cpu(), ref.dense_features)
        assert torch.equal(batch.sparse_features.values().cpu(), ref.sparse_features.values())
    assert wrapped > 1000  # the % was exercised


def test_read_threads_resume_and_reposition_give_the_uninterrupted_batches(folder):
    """Batches read ahead for one position are not handed out for another: a resumed
    datamodule and a jump back in the same one give the batch-building path's batches."""
    cfg = {"days": [0, 1, 2], "shuffle_window_rows": 50, "batch_size": 24}
    built = make_dm(folder, read_threads=0, **cfg).train_source
    reference = [tags(built.batch(e, k)) for e in range(2) for k in range(len(built))]
    first = make_dm(folder, read_threads=2, **cfg)
    it = iter(first.train_dataloader())
    seen = [tags(next(it)) for _ in range(4)]  # batches 4..6 are read ahead
    state = first.state_dict()
    resumed = make_dm(folder, read_threads=3, **cfg)
    resumed.load_state_dict(state)
    rest = [tags(b) for _ in range(2) for b in resumed.train_dataloader()]
    assert seen + rest == reference
    first.load_state_dict({"epoch": 1, "batch": 2})  # the same reader, another position
    assert [tags(b) for b in first.train_dataloader()] == reference[len(built) + 2 :]


def test_read_threads_report_a_negative_id_and_bad_settings(tmp_path):
    ids = np.zeros((40, 1), np.int32)
    ids[7, 0] = -3
    write_day(tmp_path, 0, 40, replace={1: ids})
    write_day(tmp_path, 1, 40)
    dm = on_device(make_dm(tmp_path, days=[0, 1], shuffle=False, read_threads=2), "cuda")
    with pytest.raises(DataConfigError) as err:
        list(dm.train_dataloader())
    assert f"{tmp_path}/day_0_sparse_multi_hot.npz member 1.npy row 7 holds id -3" in str(err.value)
    for bad, pattern in (
        ({"read_threads": -1}, r"data\.read_threads=-1 is invalid: use 0 \(off\)"),
        ({"read_threads": 2, "num_workers": 3}, r"read_threads=2 .*data\.num_workers=3 asks"),
    ):
        with pytest.raises(DataConfigError, match=pattern):
            make_dm(tmp_path, days=[0, 1], **bad)
    with pytest.raises(DataConfigError, match=r"read_threads=1 .*criteo_multihot only"):
        DataConfig(read_threads=1).validate()


def test_a_gpu_run_reads_with_threads_by_default_and_no_loader_processes(folder):
    from rocmtrain.config.data import auto_num_workers

    gpu = on_device(make_dm(folder, days=[0, 1, 2]), "cuda")
    kwargs = gpu._loader_kwargs()
    assert (kwargs["num_workers"], kwargs["pin_memory"]) == (0, False)  # pinned by the reader
    assert gpu.train_source.reader.threads == auto_num_workers(1)
    assert gpu.train_source.reader.pin == torch.cuda.is_available()
    old = on_device(make_dm(folder, days=[0, 1, 2], read_threads=0), "cuda")
    assert old.train_source.reader is None and old._loader_kwargs()["num_workers"] >= 1
    assert on_device(make_dm(folder, days=[0, 1, 2]), "cpu").train_source.reader is None


@pytest.mark.gpu
def test_read_threads_pin_and_finish_on_the_gpu(folder):
    dm = on_device(make_dm(folder, days=[0, 1, 2]), "cuda")
    for host in dm.train_dataloader():
        assert host.dense_features.is_pinned() and host.sparse_features.values().is_pinned()
        batch = host.to(torch.device("cuda"), non_blocking=True)
        raw, _ = expected(folder, host)
        values = batch.sparse_features.values()
        assert values.is_cuda and values.dtype == torch.int64
        want = np.concatenate(
            [(r.astype(np.int64) % s).reshape(-1) for r, s in zip(raw, TABLES, strict=True)]
        )
        assert values.cpu().tolist() == want.tolist()


def test_auto_read_threads_are_few_and_only_on_a_gpu_run():
    """Auto: the cores a GPU rank would give loader processes, at most four (more compete with
    the training thread); none on a CPU run or beside loader processes; a set count is kept."""
    from rocmtrain.data.multihot_reader import read_threads

    cfg = DataConfig(kind="criteo_multihot", path="unused")
    cuda = torch.device("cuda")
    assert read_threads(cfg, cuda, 1, cpu_count=16) == 4
    assert read_threads(cfg, cuda, 1, cpu_count=4) == 3  # one core left to the training thread
    assert read_threads(cfg, torch.device("cpu"), 1, cpu_count=16) == 0
    assert (
        read_threads(DataConfig(kind="criteo_multihot", path="u", num_workers=2), cuda, 1, 16) == 0
    )
    assert (
        read_threads(DataConfig(kind="criteo_multihot", path="u", read_threads=12), cuda, 1) == 12
    )


@pytest.mark.skipif(not hasattr(os, "setpriority") or sys.platform != "linux", reason="Linux")
def test_reader_threads_run_nicer_than_the_training_thread():
    from rocmtrain.data.multihot_reader import READER_NICE, ThreadedReader

    def nice_of_this_thread() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    reader = ThreadedReader(None, threads=2, pin=False)
    try:
        mine = nice_of_this_thread()
        theirs = {reader.executor().submit(nice_of_this_thread).result() for _ in range(4)}
    finally:
        reader.close()
    assert theirs == {min(19, mine + READER_NICE)}
    assert nice_of_this_thread() == mine  # the training thread keeps its priority
