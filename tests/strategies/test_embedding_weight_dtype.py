"""``model.embedding_weight_dtype``: tables stored in fp16 train like fp32 ones (2 real gloo
ranks, the same batches): the sharded tables hold fp16, and the per-step losses follow the fp32
run's (the same at the first step, close after) while the loss falls."""

from __future__ import annotations

from pathlib import Path

import pytest
from dist_ranks import run_ranks
from test_strategy_semi_sync import BATCHES, _cfg

DTYPES = ("fp32", "fp16")


def _worker(rank: int, root: str):
    import os

    import pytorch_lightning as pl
    import torch.distributed as dist

    from rocmtrain.data import build_datamodule
    from rocmtrain.models.module import DLRMModule
    from rocmtrain.train import build_trainer

    out = {}
    for i, dtype in enumerate(DTYPES):
        cfg = _cfg(Path(root) / dtype, "sparse_dist")
        cfg.model.embedding_weight_dtype = dtype
        pl.seed_everything(cfg.seed, verbose=False)
        m = cfg.model
        dm = build_datamodule(
            cfg.data,
            num_embeddings_per_feature=m.table_rows(),
            multi_hot_sizes=None,
            num_dense=13,
            seed=cfg.seed,
        )
        module = DLRMModule(m, verbose=False)
        trainer = build_trainer(cfg, Path(cfg.run_dir))
        os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + min(i, 1))
        trainer.fit(module, datamodule=dm)
        tables = {
            str(t.local_shards()[0].tensor.dtype)
            for k, t in module.state_dict().items()
            if "embedding_bags" in k and hasattr(t, "local_shards") and t.local_shards()
        }
        out[dtype] = dict(losses=list(module.step_losses), tables=sorted(tables))
        dist.barrier()
        dist.destroy_process_group()
    return out


@pytest.mark.slow
def test_low_precision_tables_train_like_fp32(tmp_path):
    import torch

    for rank, r in enumerate(run_ranks(_worker, 2, str(tmp_path))):
        assert r["fp32"]["tables"] == ["torch.float32"], r["fp32"]["tables"]
        ref = torch.tensor(r["fp32"]["losses"])
        assert r["fp16"]["tables"] == ["torch.float16"], r["fp16"]["tables"]
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
