"""``python -m rocmtrain write-data``: write Criteo-layout day files for ``data=criteo_multihot``
(and one-hot ``data=criteo_npy``).

    # synthetic, MLPerf hot sizes and tables, the planted signal of data=synthetic; three days
    # (train on days 0 and 1; day 2's first half validates):
    python -m rocmtrain write-data synthetic /data/mh --rows 3145728,3145728,262144 --workers 16
    # the same rows one-hot, TorchRec's day_N_{dense,sparse,labels}.npy (data=criteo_npy):
    python -m rocmtrain write-data synthetic /data/oh --layout onehot --rows 3145728,3145728,262144
    # TorchRec one-hot Criteo days -> multi-hot (the one-hot id seeds the extra ids):
    python -m rocmtrain write-data expand /data/criteo_npy /data/criteo_mh --ids raw

Synthetic rows are made in blocks of ``BLOCK_ROWS``; block ``c`` of day ``d`` comes from
``(seed, d, c)`` only, so the files do not depend on ``--workers``. Expansion: feature ``f`` of a
row with one-hot id ``x`` (taken ``% rows[f]`` for ``--ids raw``) becomes ``[x, h(x, f, 1), ...,
h(x, f, L[f]-1)]`` with ``h`` a fixed integer hash ``% rows[f]``: the same one-hot id always
expands to the same ids, as MLPerf's materialisation does, so what a model can learn about an id
survives. Dense and label files are copied unchanged.

Each feature is first written to its own ``.npy`` (workers write disjoint row blocks into it),
then streamed into the uncompressed ``.npz`` with :mod:`zipfile` (which computes the CRCs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import zipfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np

from rocmtrain import exit_codes
from rocmtrain.config.data import DataConfig, DataConfigError
from rocmtrain.data.multihot_files import SPARSE_SUFFIX

#: MLPerf DLRM-DCNv2 (recommendation_v2/torchrec_dlrm): table rows and ids per sample
MLPERF_TABLE_ROWS = [
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
]  # fmt: skip
MLPERF_HOT_SIZES = [
    3,
    2,
    1,
    2,
    6,
    1,
    1,
    1,
    1,
    7,
    3,
    8,
    1,
    6,
    9,
    5,
    1,
    1,
    1,
    12,
    100,
    27,
    10,
    3,
    1,
    1,
]
BLOCK_ROWS = 1 << 16
NUM_DENSE = 13


@dataclass(frozen=True)
class Plan:
    """What to write (shared with the worker processes)."""

    out: str
    table_rows: tuple[int, ...]
    hot_sizes: tuple[int, ...]
    layout: str  # "multihot" | "onehot"
    seed: int
    signal_strength: float = 1.0
    src: str = ""
    raw_ids: bool = False


def _scratch(plan: Plan, day: int) -> Path:
    return Path(plan.out) / f".day_{day}_features"


def _open(path: Path) -> np.ndarray:
    return np.load(path, mmap_mode="r+")


def _create_day(plan: Plan, day: int, rows: int, *, with_dense: bool) -> None:
    """Allocate the day's output arrays (workers fill them block by block)."""
    out = Path(plan.out)
    if with_dense:
        np.lib.format.open_memmap(out / f"day_{day}_dense.npy", "w+", np.float32, (rows, NUM_DENSE))
        np.lib.format.open_memmap(out / f"day_{day}_labels.npy", "w+", np.int32, (rows, 1))
    if plan.layout == "onehot":
        shape = (rows, len(plan.table_rows))
        np.lib.format.open_memmap(out / f"day_{day}_sparse.npy", "w+", np.int32, shape)
        return
    scratch = _scratch(plan, day)
    scratch.mkdir(parents=True, exist_ok=True)
    for f, hot in enumerate(plan.hot_sizes):
        np.lib.format.open_memmap(scratch / f"{f}.npy", "w+", np.int32, (rows, hot))


def _write_ids(plan: Plan, day: int, lo: int, ids: list[np.ndarray]) -> None:
    """Write each feature's ``[n, L[f]]`` ids at rows ``lo..`` of the day's sparse output."""
    n = len(ids[0])
    if plan.layout == "onehot":
        _open(Path(plan.out) / f"day_{day}_sparse.npy")[lo : lo + n] = np.concatenate(ids, axis=1)
        return
    for f, block in enumerate(ids):
        _open(_scratch(plan, day) / f"{f}.npy")[lo : lo + n] = block


_SIGNAL = {}


def _synthetic_block(plan: Plan, day: int, block: int, rows: int) -> None:
    """Generate rows ``[block*BLOCK_ROWS, +n)`` of ``day`` with the planted signal."""
    import torch

    from rocmtrain.data.batch import generator
    from rocmtrain.data.synthetic import PlantedSignal

    torch.set_num_threads(1)
    if plan not in _SIGNAL:
        cfg = DataConfig()
        _SIGNAL[plan] = PlantedSignal(
            num_embeddings_per_feature=plan.table_rows,
            multi_hot_sizes=plan.hot_sizes,
            num_dense=NUM_DENSE,
            seed=plan.seed,
            signal_strength=plan.signal_strength,
            num_signal_dense=cfg.num_signal_dense,
            num_signal_sparse=cfg.num_signal_sparse,
            zipf_exponent=cfg.zipf_exponent,
            base_ctr=cfg.base_ctr,
        )
    lo = block * BLOCK_ROWS
    n = min(BLOCK_ROWS, rows - lo)
    batch = _SIGNAL[plan].generate(n, generator(plan.seed, 11, day, block))
    out = Path(plan.out)
    _open(out / f"day_{day}_dense.npy")[lo : lo + n] = batch.dense_features.numpy()
    _open(out / f"day_{day}_labels.npy")[lo : lo + n, 0] = batch.labels.numpy().astype(np.int32)
    values = batch.sparse_features.values().numpy()
    sizes = [n * h for h in plan.hot_sizes]
    parts = np.split(values, np.cumsum(sizes)[:-1])
    ids = [p.reshape(n, h).astype(np.int32) for p, h in zip(parts, plan.hot_sizes, strict=True)]
    _write_ids(plan, day, lo, ids)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fixed bijective hash of uint64 values (wraps on purpose)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def expand_ids(x: np.ndarray, *, feature: int, hot: int, rows: int, seed: int) -> np.ndarray:
    """int32 ``[n, hot]``: column 0 is the one-hot id ``x`` (in ``[0, rows)``), column ``j`` a
    hash of ``(seed, feature, j, x)`` in ``[0, rows)``."""
    out = np.empty((len(x), hot), dtype=np.int32)
    out[:, 0] = x
    if hot > 1:
        salt = _mix(np.uint64(seed) * np.uint64(1_000_003) + np.uint64(feature) * np.uint64(1009)
                    + np.arange(1, hot, dtype=np.uint64))  # fmt: skip
        key = x.astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15) + salt[None, :]
        out[:, 1:] = _mix(key) % np.uint64(rows)
    return out


def _expand_block(plan: Plan, day: int, lo: int, hi: int) -> None:
    src = np.load(Path(plan.src) / f"day_{day}_sparse.npy", mmap_mode="r")
    block = np.asarray(src[lo:hi], dtype=np.int64)
    ids = []
    for f, (rows, hot) in enumerate(zip(plan.table_rows, plan.hot_sizes, strict=True)):
        x = block[:, f]
        bad = (x < 0) if plan.raw_ids else ((x < 0) | (x >= rows))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            fix = (
                "ids are never negative: rewrite the file"
                if x[i] < 0
                else f"pass --ids raw to take them % {rows}, or raise --tables"
            )
            raise DataConfigError(
                f"{plan.src}/day_{day}_sparse.npy row {lo + i} feature {f} has id {int(x[i])}, "
                f"outside [0, {rows}); {fix}"
            )
        ids.append(expand_ids(x % rows, feature=f, hot=hot, rows=rows, seed=plan.seed))
    _write_ids(plan, day, lo, ids)


def pack_npz(plan: Plan, day: int) -> Path:
    """Stream the day's per-feature ``.npy`` files into an uncompressed ``.npz``."""
    scratch = _scratch(plan, day)
    final = Path(plan.out) / f"day_{day}{SPARSE_SUFFIX}"
    partial = final.with_name(final.name + ".partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for f in range(len(plan.hot_sizes)):
            src = scratch / f"{f}.npy"
            info = zipfile.ZipInfo(f"{f}.npy")  # fixed 1980 timestamp: reproducible bytes
            info.file_size = src.stat().st_size  # lets zipfile choose zip64 for large members
            with open(src, "rb") as fh, zf.open(info, "w") as dst:
                shutil.copyfileobj(fh, dst, 1 << 26)
            src.unlink()
    os.replace(partial, final)
    scratch.rmdir()
    return final


def _run(tasks: list[tuple], workers: int) -> None:
    """Run ``(function, *args)`` tasks, in ``workers`` processes when > 1. Forked, as DataLoader
    workers are: a spawned one would spend seconds importing torch; this process has run no
    torch op (no thread pool) when it forks."""
    if workers <= 1:
        for fn, *args in tasks:
            fn(*args)
        return
    with ProcessPoolExecutor(workers, mp_context=get_context("fork")) as pool:
        try:
            for future in [pool.submit(*task) for task in tasks]:
                future.result()
        except BaseException:  # a bad input row: report it now, not after every other block
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def write_synthetic(plan: Plan, rows_per_day: list[int], *, workers: int) -> list[Path]:
    """Write days ``0..`` of ``rows_per_day`` rows with the planted signal."""
    Path(plan.out).mkdir(parents=True, exist_ok=True)
    tasks = []
    for day, rows in enumerate(rows_per_day):
        _create_day(plan, day, rows, with_dense=True)
        tasks += [(_synthetic_block, plan, day, b, rows) for b in range(-(-rows // BLOCK_ROWS))]
    _run(tasks, workers)
    if plan.layout == "multihot":
        _run([(pack_npz, plan, day) for day in range(len(rows_per_day))], workers)
    return sorted(Path(plan.out).glob("day_*"))


def _check_onehot_day(src: Path, day: int, num_features: int) -> int:
    """Rows of TorchRec's one-hot day ``day`` after checking its three files."""
    arrays = {}
    for kind in ("dense", "sparse", "labels"):
        path = src / f"day_{day}_{kind}.npy"
        if not path.is_file():
            raise DataConfigError(
                f"{path} is missing; expand reads TorchRec's day_<N>_{{dense,sparse,labels}}.npy "
                "(torchrec's npy_preproc_criteo.py); choose --days among those present"
            )
        try:
            arrays[kind] = np.load(path, mmap_mode="r")
        except (OSError, ValueError, EOFError) as err:
            raise DataConfigError(f"{path} is not a readable .npy array ({err})") from None
    rows = len(arrays["dense"])
    want = {"dense": (rows, NUM_DENSE), "sparse": (rows, num_features)}
    for kind, shape in want.items():
        if arrays[kind].shape != shape:
            raise DataConfigError(
                f"{src}/day_{day}_{kind}.npy has shape {list(arrays[kind].shape)}, expected "
                f"{list(shape)}; pass --tables with one entry per feature of the file"
            )
    if arrays["dense"].dtype != np.float32 or arrays["sparse"].dtype.kind not in "iu":
        raise DataConfigError(
            f"{src}/day_{day}: dense must be float32 and sparse integer ids (got "
            f"{arrays['dense'].dtype}, {arrays['sparse'].dtype}); write them with torchrec"
        )
    if arrays["labels"].shape not in ((rows,), (rows, 1)):
        raise DataConfigError(
            f"{src}/day_{day}_labels.npy has shape {list(arrays['labels'].shape)}, expected "
            f"[{rows}, 1]; the three files of a day must hold the same rows"
        )
    return rows


def expand_onehot(plan: Plan, days: list[int], *, workers: int) -> list[Path]:
    """Expand TorchRec one-hot ``days`` of ``plan.src`` into the multi-hot layout."""
    src, out = Path(plan.src), Path(plan.out)
    rows = {day: _check_onehot_day(src, day, len(plan.table_rows)) for day in days}
    out.mkdir(parents=True, exist_ok=True)
    tasks = []
    for day, n in rows.items():
        for kind in ("dense", "labels"):
            shutil.copyfile(src / f"day_{day}_{kind}.npy", out / f"day_{day}_{kind}.npy")
        _create_day(plan, day, n, with_dense=False)
        step = BLOCK_ROWS * 4
        tasks += [(_expand_block, plan, day, lo, min(lo + step, n)) for lo in range(0, n, step)]
    _run(tasks, workers)
    _run([(pack_npz, plan, day) for day in days], workers)
    return sorted(out.glob("day_*"))


# ---- command line ------------------------------------------------------------------------------
def _ints(text: str, *, least: int = 1) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None
    if not values or min(values) < least:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers >= {least}")
    return values


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rocmtrain write-data",
        description="Write Criteo-layout day files: synthetic (planted signal) or expanded from "
        "TorchRec one-hot days to MLPerf's multi-hot layout.",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    syn = sub.add_parser("synthetic", help="synthetic days with the planted signal")
    syn.add_argument("out", type=Path, help="output folder")
    syn.add_argument("--rows", type=_ints, required=True, help="rows of day 0,1,... (comma list)")
    syn.add_argument("--layout", choices=("multihot", "onehot"), default="multihot")
    syn.add_argument("--signal-strength", type=float, default=1.0)
    exp = sub.add_parser("expand", help="TorchRec one-hot day_N_*.npy -> multi-hot")
    exp.add_argument("src", type=Path, help="folder of day_<N>_{dense,sparse,labels}.npy")
    exp.add_argument("out", type=Path, help="output folder")
    exp.add_argument("--days", type=str, default=None, help="comma list (default: all found)")
    exp.add_argument(
        "--ids", choices=("raw", "contiguous"), default="raw",
        help="raw: raw Criteo ids, taken %% table rows; contiguous: already table rows",
    )  # fmt: skip
    for p in (syn, exp):
        p.add_argument("--tables", type=_ints, default=MLPERF_TABLE_ROWS, help="rows per table")
        p.add_argument("--max-rows-per-table", type=int, default=None, help="cap on --tables")
        p.add_argument("--hot-sizes", type=_ints, default=MLPERF_HOT_SIZES, help="ids per row")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    return parser


def _found_days(src: Path) -> list[int]:
    if not src.is_dir():
        raise DataConfigError(f"{src} is not a folder of TorchRec day_<N>_*.npy files")
    days = sorted(int(p.name.split("_")[1]) for p in src.glob("day_*_sparse.npy"))
    if not days:
        raise DataConfigError(f"{src} has no day_<N>_sparse.npy files (TorchRec one-hot days)")
    return days


def main(argv: list[str] | None = None) -> int:
    """CLI entry (``rocmtrain.__main__`` dispatches ``write-data`` here)."""
    args = _parser().parse_args(argv)
    tables = [min(n, args.max_rows_per_table or n) for n in args.tables]
    hot = [1] * len(tables) if getattr(args, "layout", "multihot") == "onehot" else args.hot_sizes
    started = time.perf_counter()
    try:
        if len(hot) != len(tables):
            raise DataConfigError(
                f"--hot-sizes has {len(hot)} entries but --tables {len(tables)}; "
                "give one per feature"
            )
        if max(tables) > np.iinfo(np.int32).max:
            raise DataConfigError("--tables: ids are int32, so tables hold at most 2**31-1 rows")
        plan = Plan(
            out=str(args.out), table_rows=tuple(tables), hot_sizes=tuple(hot),
            layout=getattr(args, "layout", "multihot"), seed=args.seed,
            signal_strength=getattr(args, "signal_strength", 1.0),
            src=str(getattr(args, "src", "")), raw_ids=getattr(args, "ids", "") == "raw",
        )  # fmt: skip
        if args.action == "synthetic":
            files = write_synthetic(plan, args.rows, workers=args.workers)
        else:
            days = _ints(args.days, least=0) if args.days else _found_days(args.src)
            files = expand_onehot(plan, days, workers=args.workers)
    except (DataConfigError, argparse.ArgumentTypeError) as exc:
        print(f"rocmtrain write-data: error: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    size = sum(f.stat().st_size for f in files)
    print(
        f"wrote {len(files)} files, {size / 2**30:.2f} GiB, to {args.out} in "
        f"{time.perf_counter() - started:.1f} s"
    )
    return exit_codes.OK
