"""Criteo data: raw TSV/CSV rows and TorchRec's preprocessed ``.npy`` days.

Raw rows (``data.kind=criteo_tsv``), 40 columns ``label, I1..I13, C1..C26``; empty = missing:

* Kaggle/1TB layout: tab-separated, no header (``train.txt``, ``day_0``); ``.gz`` is read too;
* CSV with a header line ``label,I1,...,C26`` (e.g. DeepCTR's ``criteo_sample.txt``).

Transforms: dense ``log(1 + max(x, 0))`` (missing = 0); categorical ``int(hex, 16) % rows[f]``
(missing = 0), the same id TorchRec's ``.npy`` pipeline gives (``BinaryCriteoUtils.tsv_to_npys``
then ``% hashes``). Raw files are parsed into memory once (:mod:`rocmtrain.data.criteo_files`);
convert the 1TB logs with TorchRec's ``torchrec/datasets/scripts/npy_preproc_criteo.py`` and use

``data.kind=criteo_npy``: ``<path>/day_<X>_dense.npy`` (float32 ``[N, 13]``, already
log-transformed by TorchRec), ``day_<X>_sparse.npy`` (int ``[N, 26]``), ``day_<X>_labels.npy``
(int ``[N, 1]``); memory-mapped by default. Sparse ids are table rows in ``[0, rows[f])``
(``data.npy_ids=contiguous``) or raw Criteo ids taken ``% rows[f]`` (``data.npy_ids=raw``, what
``BinaryCriteoUtils.tsv_to_npys`` writes).

Ids are never wrapped silently: every batch's ids are checked as it is read, and a negative id
(any kind) or an id outside its table (contiguous ids) is a :class:`DataConfigError` naming the
file, row, feature and value.

Rows are concatenated in file (day) order; the last ``val_fraction`` of them validate unless
``val_path`` is given. Sharding and resuming: :mod:`rocmtrain.data.loader`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torchrec.datasets.criteo import INT_FEATURE_COUNT
from torchrec.datasets.utils import Batch

from rocmtrain.config.data import DataConfig, DataConfigError
from rocmtrain.data.batch import generator, make_batch
from rocmtrain.data.criteo_files import CriteoRows, read_criteo_npy, read_criteo_text
from rocmtrain.data.loader import LaidOutSource, RowLayout, epoch_order


class CriteoSource(LaidOutSource):
    """This rank's batches of a row range of :class:`CriteoRows` (a ``BatchSource``)."""

    def __init__(
        self,
        rows: CriteoRows,
        *,
        row_range: tuple[int, int],
        table_rows: list[int],
        batch_size: int,
        rank: int,
        world_size: int,
        shuffle: bool,
        drop_last: bool,
        seed: int,
        split: str,
    ) -> None:
        self.rows = rows
        self.start, end = row_range
        self.num_rows = end - self.start
        self.table_rows = np.array(table_rows, dtype=np.int64)
        self.shuffle = shuffle
        self.seed = seed
        self.split_code = 1 if split == "train" else 2
        self.world_size = world_size
        self.layout = RowLayout(
            self.num_rows,
            batch_size=batch_size,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
        )
        if not self.layout.base and drop_last:
            raise DataConfigError(
                f"data.batch_size={batch_size} is invalid for the {split} split: it has "
                f"{self.num_rows} rows, fewer than one batch on each of {world_size} ranks; "
                f"lower data.batch_size, set data.drop_last=false, or give more rows"
            )
        if not self.layout.base:
            fix = "raise data.val_fraction or set data.val_path" if split == "val" else "give more"
            raise DataConfigError(
                f"data.path: the {split} split has {self.num_rows} rows, fewer than the "
                f"{world_size} ranks that each need one; {fix} rows"
            )
        self._order: tuple[int, torch.Tensor] | None = None

    def positions(self, epoch: int, index: int) -> np.ndarray:
        """Global row numbers of batch ``index`` of ``epoch`` on this rank."""
        if self._order is None or self._order[0] != epoch:
            gen = generator(self.seed, self.split_code, epoch) if self.shuffle else None
            self._order = (epoch, epoch_order(self.num_rows, shuffle=self.shuffle, seed_gen=gen))
        lo, hi = self.layout.slices(epoch)[index]
        return self._order[1][lo:hi].numpy() + self.start

    def batch(self, epoch: int, index: int) -> Batch:
        positions = self.positions(epoch, index)
        dense, sparse, labels = self.rows.gather(positions)
        num_features = len(self.table_rows)
        ids = sparse[:, :num_features]
        check_ids(ids, self.table_rows, self.rows, positions)
        if self.rows.hashed:
            ids = ids % self.table_rows
        return make_batch(
            torch.from_numpy(dense),
            [
                torch.from_numpy(np.ascontiguousarray(ids[:, f : f + 1]))
                for f in range(num_features)
            ],
            torch.from_numpy(labels),
        )


def check_ids(
    ids: np.ndarray, table_rows: np.ndarray, rows: CriteoRows, positions: np.ndarray
) -> None:
    """Raise naming the file, row, feature and value of the first id that cannot be used.

    Negative ids are always wrong (``%`` would wrap them onto an unrelated row); ids of
    contiguous (not hashed) files must also lie inside their table.
    """
    bad = ids < 0
    if not rows.hashed:
        bad |= ids >= table_rows
    if not bad.any():
        return
    sample, feature = (int(i) for i in np.argwhere(bad)[0])
    value, size = int(ids[sample, feature]), int(table_rows[feature])
    file, row = rows.locate(int(positions[sample]))
    if value < 0:
        fix = "ids are never negative: rewrite the file (an int32 overflow of raw hex ids?)"
    else:
        fix = (
            f"raise model.num_embeddings_per_feature[{feature}] above {value}, or, if the file "
            "holds raw Criteo ids (torchrec's npy_preproc_criteo.py), set data.npy_ids=raw to "
            "take them % rows as TorchRec does"
        )
    raise DataConfigError(
        f"data: {file} row {row}: feature C{feature + 1} (cat_{feature}) has id {value}, outside "
        f"[0, {size}) of its table; {fix}"
    )


#: parts up to this many ids are checked whole at start-up; larger (memory-mapped) ones per batch
EAGER_CHECK_IDS = 1 << 26


def check_loaded_ids(rows: CriteoRows, table_rows: np.ndarray) -> None:
    """Check every id of the parts small enough to scan now, so bad files fail before training."""
    for part, sparse in enumerate(rows.sparse):
        if sparse.size > EAGER_CHECK_IDS:
            continue
        ids = np.asarray(sparse[:, : len(table_rows)])
        check_ids(ids, table_rows, rows, np.arange(len(ids)) + rows.starts[part])


def criteo_factory(
    cfg: DataConfig, *, rows: list[int], multi_hot: list[int], num_dense: int, seed: int
):
    """``factory(split, rank, world_size)`` for :class:`~rocmtrain.data.datamodule.RecDataModule`."""
    if num_dense != INT_FEATURE_COUNT:
        raise DataConfigError(
            f"model.num_dense_features={num_dense} does not fit data.kind={cfg.kind}: Criteo rows "
            f"have {INT_FEATURE_COUNT} dense features; set model.num_dense_features=13"
        )
    if any(m != 1 for m in multi_hot):
        raise DataConfigError(
            f"model.multi_hot_sizes={multi_hot} does not fit data.kind={cfg.kind}: Criteo rows have "
            f"one id per feature; set model.multi_hot_sizes=null (or use data=synthetic)"
        )

    def load(field: str) -> CriteoRows:
        path = Path(getattr(cfg, field)).expanduser()
        if cfg.kind == "criteo_tsv":
            return read_criteo_text(
                path, file_format=cfg.file_format, max_rows=cfg.max_rows, field=field
            )
        return read_criteo_npy(
            path,
            days=cfg.days,
            mmap=cfg.mmap,
            max_rows=cfg.max_rows,
            field=field,
            raw_ids=cfg.npy_ids == "raw",
        )

    train_rows = load("path")
    check_loaded_ids(train_rows, np.array(rows, dtype=np.int64))
    if cfg.val_path is not None:
        val_rows = load("val_path")
        check_loaded_ids(val_rows, np.array(rows, dtype=np.int64))
        train_range = (0, len(train_rows))
        val_range = (0, len(val_rows))
    else:
        val_rows = train_rows
        n_val = int(round(len(train_rows) * cfg.val_fraction))
        train_range = (0, len(train_rows) - n_val)
        val_range = (len(train_rows) - n_val, len(train_rows)) if n_val else None

    def factory(
        split: str, rank: int, world_size: int, device: object = None
    ) -> CriteoSource | None:  # rows are read on the host whatever the training device
        train = split == "train"
        if not train and val_range is None:
            return None
        return CriteoSource(
            train_rows if train else val_rows,
            row_range=train_range if train else val_range,
            table_rows=rows,
            batch_size=cfg.batch_size,
            rank=rank,
            world_size=world_size,
            shuffle=cfg.shuffle and train,
            drop_last=cfg.drop_last and train,
            seed=seed,
            split=split,
        )

    return factory
