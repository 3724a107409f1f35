"""Data for rocmtrain: synthetic planted-signal data, raw Criteo TSV/CSV and TorchRec's Criteo .npy.

Use::

    from rocmtrain.config.data import DataConfig
    from rocmtrain.data import build_datamodule

    dm = build_datamodule(
        DataConfig(kind="synthetic", batch_size=256),
        num_embeddings_per_feature=[1000] * 26, multi_hot_sizes=None, num_dense=13, seed=0,
    )
    dm.setup()
    batch = next(iter(dm.train_dataloader()))   # torchrec.datasets.utils.Batch
    batch.dense_features    # float32 [B, 13]
    batch.sparse_features   # KeyedJaggedTensor, keys cat_0..cat_25, key-major
    batch.labels            # float32 [B]

``B`` is ``batch_size`` per rank; each rank (``torch.distributed`` rank, or 0 of 1) reads its own
shard; ``dm.state_dict()`` / ``dm.load_state_dict()`` save and restore the data position.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytorch_lightning as pl

from rocmtrain.config.data import DataConfig, DataConfigError
from rocmtrain.data.batch import feature_keys, make_batch
from rocmtrain.data.datamodule import RecDataModule
from rocmtrain.data.loader import BatchSource, EpochBatches, PositionedLoader, rank_row_slices

__all__ = [
    "BatchSource",
    "DataConfig",
    "DataConfigError",
    "RecDataModule",
    "EpochBatches",
    "PositionedLoader",
    "build_datamodule",
    "feature_keys",
    "make_batch",
    "rank_row_slices",
]


def build_datamodule(
    data_cfg: DataConfig,
    *,
    num_embeddings_per_feature: Sequence[int],
    multi_hot_sizes: Sequence[int] | None,
    num_dense: int,
    seed: int,
    rank: int | None = None,
    world_size: int | None = None,
) -> pl.LightningDataModule:
    """Validate ``data_cfg`` (files included) and return the DataModule for the model's tables.

    Args:
        data_cfg: the ``data`` section of the run config.
        num_embeddings_per_feature: rows of each feature's table (``F`` entries); categorical ids
            are drawn from (synthetic) or hashed into (Criteo) ``[0, rows)``.
        multi_hot_sizes: ids per sample of each feature (synthetic); ``None`` = one each.
            Criteo rows have exactly one id per feature.
        num_dense: dense features per sample (13 for Criteo).
        seed: the run seed (used when ``data_cfg.seed`` is ``None``).
        rank, world_size: override ``torch.distributed``'s (tests, custom launchers).

    Raises:
        DataConfigError: a bad value or a missing file; the message names the field and the fix.
    """
    data_cfg.validate_files()  # its values were checked when it was built
    rows = [int(n) for n in num_embeddings_per_feature]
    feature_keys(len(rows))  # checks 1 <= F <= 26
    for f, n in enumerate(rows):
        if n < 1:
            raise DataConfigError(
                f"model.num_embeddings_per_feature[{f}]={n} is invalid: every table needs >= 1 row"
            )
    if multi_hot_sizes is None:
        multi_hot = [1] * len(rows)
    else:
        multi_hot = [int(m) for m in multi_hot_sizes]
        if len(multi_hot) != len(rows) or min(multi_hot) < 1:
            raise DataConfigError(
                f"model.multi_hot_sizes={multi_hot} is invalid: give one size >= 1 per table "
                f"({len(rows)} tables) or null for one id per feature"
            )
    if num_dense < 1:
        raise DataConfigError(
            f"model.num_dense_features={num_dense} is invalid: use >= 1 dense features"
        )
    data_seed = seed if data_cfg.seed is None else int(data_cfg.seed)

    if data_cfg.kind == "synthetic":
        from rocmtrain.data.synthetic import synthetic_factory

        factory = synthetic_factory(
            data_cfg, rows=rows, multi_hot=multi_hot, num_dense=num_dense, seed=data_seed
        )
    elif data_cfg.kind == "criteo_multihot":
        from rocmtrain.data.criteo_multihot import multihot_factory

        factory = multihot_factory(
            data_cfg,
            rows=rows,
            multi_hot=None if multi_hot_sizes is None else multi_hot,
            num_dense=num_dense,
            seed=data_seed,
        )
    else:
        from rocmtrain.data.criteo import criteo_factory

        factory = criteo_factory(
            data_cfg, rows=rows, multi_hot=multi_hot, num_dense=num_dense, seed=data_seed
        )
    return RecDataModule(data_cfg, factory, rank=rank, world_size=world_size)
