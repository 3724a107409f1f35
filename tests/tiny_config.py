"""The one tiny run config the tests build on (and its small model), instead of a builder per file.

``tiny_run_config(run_dir)`` is a :class:`~rocmtrain.config.schema.RunConfig` of the dlrm_cpu
defaults shrunk to seconds: 4 tables (rows 300/200/100/50), MLPs of 16, synthetic data, no
progress bar, no watchdog, no device monitor, table-wise sharding, a loss logged every step.
A test changes what it is about on the returned object. ``tiny_model_config()`` is the 3-table
DLRM(-DCNv2) of the dense-part tests. The ``tiny_config`` fixture (tests/conftest.py) gives
``tiny_run_config(tmp_path / "run")``.

Imported as ``from tiny_config import ...``: ``tests/`` is on ``sys.path`` (pytest puts the
root conftest's folder there), also in ranks spawned from a test.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rocmtrain.config.data import DataConfig
from rocmtrain.config.model import ModelConfig
from rocmtrain.config.schema import RunConfig

#: rows of the tiny run's 4 tables
TINY_ROWS = (300, 200, 100, 50)


def tiny_run_config(
    run_dir: str | Path,
    *,
    batch_size: int = 32,
    train_batches: int = 6,
    val_batches: int = 1,
    sharding_type: str | None = "table_wise",
    **trainer: object,
) -> RunConfig:
    """A few-second CPU run in ``run_dir``; ``trainer`` overrides ``cfg.trainer`` fields
    (``max_epochs``, ``devices``, ...). ``sharding_type=None`` keeps the schema's default."""
    run_dir = Path(run_dir)
    cfg = RunConfig(run_dir=str(run_dir))
    cfg.model = dataclasses.replace(
        cfg.model,
        num_embeddings_per_feature=list(TINY_ROWS),
        dense_arch_layer_sizes=[16, 16],
        over_arch_layer_sizes=[16, 1],
    )
    cfg.data = DataConfig(
        kind="synthetic",
        batch_size=batch_size,
        num_train_batches=train_batches,
        num_val_batches=val_batches,
    )
    cfg.checkpoint.dir = str(run_dir / "checkpoints")
    cfg.trainer = dataclasses.replace(
        cfg.trainer, progress_bar=False, log_every_n_steps=1, **trainer
    )
    cfg.watchdog.enabled = False
    cfg.monitor.enabled = False
    if sharding_type is not None:
        cfg.strategy.sharding_type = sharding_type
    return cfg


def tiny_model_config(interaction: str = "dcn", **kw: object) -> ModelConfig:
    """The dense-part tests' model: 3 tables of D = 8 (rows 50/40/30), bottom MLP 13 -> 16 -> 8,
    top MLP -> 16 -> 1; ``kw`` overrides any field (``dcn_num_layers`` defaults to 3)."""
    fields: dict[str, object] = dict(
        num_embeddings_per_feature=[50, 40, 30],
        embedding_dim=8,
        dense_arch_layer_sizes=[16, 8],
        over_arch_layer_sizes=[16, 1],
        interaction=interaction,
        dcn_num_layers=3,
        dcn_low_rank_dim=6,
    )
    return ModelConfig(**{**fields, **kw})
