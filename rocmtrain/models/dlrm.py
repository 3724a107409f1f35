"""DLRM / DLRM-DCNv2 built from ``torchrec.models.dlrm`` and configured by ``ModelConfig``.

Shapes: ``B`` samples per rank, ``F`` sparse features (one table each, ``t_cat_<f>`` reads
``cat_<f>``), ``D`` embedding dim, 13 dense features::

    dense  float32 [B, 13] ──> bottom MLP ──> [B, D] ─┐
    KJT keys cat_0..cat_{F-1}, L[f][b] ids per sample  ├─> dot / DCN interaction ─> top MLP ─> [B] logit
        ──> EmbeddingBagCollection (pooled) [B, F*D] ──┘

The embedding tables are created on the ``meta`` device: ``TorchRecStrategy`` shards and
materialises them on the right rank (``DistributedModelParallel``). The embedding optimizer is
attached with ``apply_optimizer_in_backward`` so TorchRec fuses it into the TBE backward.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.models.dlrm import DLRM, DLRM_DCN
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from rocmtrain.config.model import ModelConfig


def feature_names(num_features: int) -> list[str]:
    """Sparse feature keys ``cat_0 .. cat_{F-1}`` (TorchRec's ``DEFAULT_CAT_NAMES`` order)."""
    return [f"cat_{i}" for i in range(num_features)]


def table_name(feature: str) -> str:
    """The table reading ``feature`` (``cat_3`` -> ``t_cat_3``)."""
    return f"t_{feature}"


def embedding_bag_configs(cfg: ModelConfig) -> list[EmbeddingBagConfig]:
    """One ``EmbeddingBagConfig`` per feature, rows capped by ``max_rows_per_table``."""
    pooling = PoolingType.SUM if cfg.pooling == "sum" else PoolingType.MEAN
    return [
        EmbeddingBagConfig(
            name=table_name(feature),
            embedding_dim=cfg.embedding_dim,
            num_embeddings=rows,
            feature_names=[feature],
            pooling=pooling,
        )
        for feature, rows in zip(feature_names(cfg.num_features), cfg.table_rows(), strict=True)
    ]


def build_dlrm(cfg: ModelConfig, *, dense_device: torch.device | None = None) -> nn.Module:
    """TorchRec ``DLRM`` (``interaction: dot``) or ``DLRM_DCN`` with tables on the meta device.

    ``dense_device`` holds the MLPs (``None`` = CPU; ``meta`` for planning without memory).
    """
    ebc = EmbeddingBagCollection(tables=embedding_bag_configs(cfg), device=torch.device("meta"))
    common = dict(
        embedding_bag_collection=ebc,
        dense_in_features=cfg.num_dense_features,
        dense_arch_layer_sizes=list(cfg.dense_arch_layer_sizes),
        over_arch_layer_sizes=list(cfg.over_arch_layer_sizes),
        dense_device=dense_device,
    )
    if cfg.interaction == "dcn":
        model = DLRM_DCN(
            **common, dcn_num_layers=cfg.dcn_num_layers, dcn_low_rank_dim=cfg.dcn_low_rank_dim
        )
        if cfg.compile_interaction:
            compile_crossnet(model.inter_arch.crossnet)
        return model
    return DLRM(**common)


def compile_crossnet(crossnet: nn.Module) -> None:
    """``torch.compile`` a cross network in place (``nn.Module.compile``: parameter names and
    state-dict keys stay as they are, so checkpoints and the sharding plan do not change).

    Static shapes: one graph per batch size and grad mode (training, validation); the fused
    elementwise kernels keep eager's dtypes.
    """
    crossnet.compile(dynamic=False)


def apply_embedding_optimizer(module: nn.Module, cfg: ModelConfig) -> None:
    """Attach the fused (in-backward) embedding optimizer to every EmbeddingBagCollection."""
    kind = cfg.embedding_optimizer
    if kind == "adagrad":
        cls, kwargs = torch.optim.Adagrad, {"lr": cfg.embedding_lr, "eps": cfg.embedding_eps}
    elif kind == "rowwise_adagrad":
        cls, kwargs = RowWiseAdagrad, {"lr": cfg.embedding_lr, "eps": cfg.embedding_eps}
    elif kind == "adam":
        cls, kwargs = torch.optim.Adam, {"lr": cfg.embedding_lr, "eps": cfg.embedding_eps}
    else:
        cls, kwargs = torch.optim.SGD, {"lr": cfg.embedding_lr}
    for sub in module.modules():
        if isinstance(sub, EmbeddingBagCollection):
            apply_optimizer_in_backward(cls, sub.parameters(), kwargs)


def dense_optimizer(params, cfg: ModelConfig) -> torch.optim.Optimizer:
    """The regular optimizer of the dense (MLP) parameters."""
    if cfg.dense_optimizer == "adagrad":
        return torch.optim.Adagrad(params, lr=cfg.dense_lr)
    if cfg.dense_optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.dense_lr)
    return torch.optim.SGD(params, lr=cfg.dense_lr)


def pooling_factors(cfg: ModelConfig) -> dict[str, float]:
    """Expected ids per sample of each table (multi-hot size, 1 for one-hot): planner input."""
    hot = cfg.multi_hot_sizes or [1] * cfg.num_features
    names = [table_name(f) for f in feature_names(cfg.num_features)]
    return {name: float(k) for name, k in zip(names, hot, strict=True)}
