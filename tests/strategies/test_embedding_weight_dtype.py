"""``model.embedding_weight_dtype``: tables stored in fp16 train like fp32 ones (2 real gloo
ranks, the same batches): the sharded tables hold fp16, and the per-step losses follow the fp32
run's (the same at the first step, close after) while the loss falls."""

from __future__ import annotations

from pathlib import Path

import pytest
from dist_ranks import run_ranks
from test_strategy_semi_sync import BATCHES, _cfg, _fit


def _worker(rank: int, root: str):
    from rocmtrain.models.module import DLRMModule

    out = {}
    for i, dtype in enumerate(("fp32", "fp16")):
        cfg = _cfg(Path(root) / dtype, "sparse_dist")
        cfg.model.embedding_weight_dtype = dtype
        out[dtype] = _fit(cfg, DLRMModule, min(i, 1))
    return out


@pytest.mark.slow
def test_low_precision_tables_train_like_fp32(tmp_path):
    import torch

    for rank, r in enumerate(run_ranks(_worker, 2, str(tmp_path))):
        assert r["fp32"]["table_dtypes"] == ["torch.float32"], r["fp32"]["table_dtypes"]
        ref = torch.tensor(r["fp32"]["losses"])
        assert r["fp16"]["table_dtypes"] == ["torch.float16"], r["fp16"]["table_dtypes"]
        got = torch.tensor(r["fp16"]["losses"])
        assert len(got) == len(ref) == BATCHES
        diff = (got - ref).abs()
        # the first step reads the fp32 initial rows rounded to fp16: the same loss to 1e-4;
        # later the two runs drift apart as updates round differently, without diverging
        assert diff[0] < 1e-4 and diff.max() > 0, (rank, got, ref)
        assert diff.mean() < 1e-2 and diff.max() < 5e-2, (rank, got, ref)
        assert got[-4:].mean() < got[:4].mean(), (rank, got)


def test_an_unknown_weight_dtype_names_the_field():
    from rocmtrain.config import ConfigError
    from rocmtrain.config.model import ModelConfig

    with pytest.raises(ConfigError, match="model.embedding_weight_dtype.*fp32, fp16"):
        ModelConfig(embedding_weight_dtype="int8")
