"""A small DLRM / DLRM-DCNv2 for the dense-part tests, and its dense forward without the tables.

F = 3 tables of D = 8 (rows 50/40/30, never looked up: the tests feed pooled embeddings
``[B, F, D]`` straight into the interaction), bottom MLP 13 -> 16 -> D, top MLP -> 16 -> 1.
"""

from __future__ import annotations

import torch
from tiny_config import tiny_model_config

F, D = 3, 8


#: the shared tiny model (tests/tiny_config.py), under the name these tests use
small_cfg = tiny_model_config


def dense_forward(model, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
    """DLRM.forward after the embedding lookup (``sparse``: pooled embeddings ``[B, F, D]``):
    logits ``[B, 1]``."""
    return model.over_arch(model.inter_arch(model.dense_arch(dense), sparse))


def dense_params(model) -> dict[str, torch.nn.Parameter]:
    """The parameters outside the embedding tables, by name."""
    return {k: p for k, p in model.named_parameters() if "sparse_arch" not in k}
