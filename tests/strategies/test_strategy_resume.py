"""2 real gloo ranks: table-wise sharded training, and checkpoint → resume == uninterrupted.

Each rank runs four fits in one process (one startup): A = 2 epochs uninterrupted; B1 = stop
mid-epoch 2 after a step-interval checkpoint; B2 = resume from B1's step-8 checkpoint to the
end; C = A through the strategy's input pipeline (``strategy.pipeline=sparse_dist``: batch i+1's
input dist during batch i, the module unchanged); D1/D2 = B1/B2 pipelined. Every step's loss of A
must equal B1's then B2's bit for bit, and so must the final sharded tables, the fused optimizer
state and the validation metrics; C's and D2's losses must equal A's bit for bit (the pipeline's
look-ahead is not saved as consumed).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dist_ranks import run_ranks

pytestmark = pytest.mark.slow

BATCHES = 6  # per rank per epoch


def _cfg(run_dir: Path, **trainer):
    """The tiny run, 2 epochs of BATCHES steps, a checkpoint every 4 steps."""
    from tiny_config import tiny_run_config

    trainer = {"max_epochs": 2, **trainer}
    cfg = tiny_run_config(run_dir, train_batches=BATCHES, val_batches=2, **trainer)
    cfg.checkpoint.every_n_train_steps = 4
    return cfg


def _fit(cfg, *, ckpt_path=None, max_steps=-1, pipelined=False):
    import pytorch_lightning as pl
    import torch

    from rocmtrain.data import build_datamodule
    from rocmtrain.models.module import DLRMModule
    from rocmtrain.train import build_trainer

    pl.seed_everything(cfg.seed, verbose=False)
    m = cfg.model
    dm = build_datamodule(
        cfg.data,
        num_embeddings_per_feature=m.table_rows(),
        multi_hot_sizes=None,
        num_dense=13,
        seed=cfg.seed,
    )
    cfg.strategy.pipeline = "sparse_dist" if pipelined else "none"
    module = DLRMModule(m, verbose=False)
    trainer = build_trainer(cfg, Path(cfg.run_dir), max_steps=max_steps)
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    dmp = trainer.strategy.dmp
    sd = module.state_dict()
    tables = {}
    for k, v in sd.items():
        if "embedding_bags" in k:
            shards = v.local_shards() if hasattr(v, "local_shards") else []
            tables[k] = [s.tensor.clone() for s in shards]
    fused = dmp.fused_optimizer.state_dict()["state"]
    opt_state = {
        k: {
            n: (
                t.local_shards()[0].tensor.clone()
                if hasattr(t, "local_shards") and t.local_shards()
                else None
            )
            for n, t in v.items()
            if hasattr(t, "local_shards")
        }
        for k, v in fused.items()
    }
    dense = {k: v.clone() for k, v in sd.items() if "embedding_bags" not in k}
    plan = {
        t: ps.ranks for mp in trainer.strategy.sharding_plan.plan.values() for t, ps in mp.items()
    }
    pipe = trainer.strategy.input_pipeline
    return dict(
        pipelined=pipe is not None and all(pipe.pipelined.values()),
        overlapped=pipe.overlapped_lookups if pipe is not None else 0,
        ahead=pipe.started_ahead if pipe is not None else 0,
        losses=list(module.step_losses),
        labels=list(module.step_label_sums),
        history=module.history,
        tables=tables,
        fused=opt_state,
        dense=dense,
        plan=plan,
        torch_version=torch.__version__,
    )


def _worker(rank: int, root: str):
    from rocmtrain import checkpoint as ckpt

    root = Path(root)
    a = _fit(_cfg(root / "a"))
    b_cfg = _cfg(root / "b")
    # B1 stops after step 10 (mid epoch 2): checkpoints at steps 4, 8 (interval) and 10 (stop)
    b1 = _fit(b_cfg, max_steps=BATCHES + 4)
    newest = ckpt.find_resume(Path(b_cfg.checkpoint.dir))
    b2 = _fit(b_cfg, ckpt_path=str(Path(b_cfg.checkpoint.dir) / "step-000000008"))
    # C = A through the input pipeline (input dist of batch i+1 during batch i)
    c = _fit(_cfg(root / "c"), pipelined=True)
    # D = B through the pipeline: batches are fetched and staged ahead, so the step-8
    # checkpoint must record batch 8 (the next one to train), not the next one fetched
    d_cfg = _cfg(root / "d")
    d1 = _fit(d_cfg, max_steps=BATCHES + 4, pipelined=True)
    d_ckpt = Path(d_cfg.checkpoint.dir) / "step-000000008"
    d2 = _fit(d_cfg, ckpt_path=str(d_ckpt), pipelined=True)
    return dict(a=a, b1=b1, b2=b2, c=c, d1=d1, d2=d2, newest=str(newest))


def test_table_wise_training_and_bitwise_resume(tmp_path):
    import torch

    results = run_ranks(_worker, 2, str(tmp_path))
    for rank, r in enumerate(results):
        a, b1, b2 = r["a"], r["b1"], r["b2"]
        # table-wise: every table on exactly one rank, both ranks hold tables
        assert all(len(ranks) == 1 for ranks in a["plan"].values())
        assert {ranks[0] for ranks in a["plan"].values()} == {0, 1}
        held = {k for k, shards in a["tables"].items() if shards}
        assert 0 < len(held) < 4, f"rank {rank} holds {held}"
        # training learns something on the planted signal
        assert len(a["losses"]) == 2 * BATCHES
        assert a["history"][-1]["val_auc"] > 0.5
        # resume: checkpoint at step 8 (mid epoch 2); B1 ran 10 steps, B2 continues from 8
        assert r["newest"].endswith("step-000000010")
        assert b1["losses"][:8] == a["losses"][:8]
        assert b2["losses"] == a["losses"][8:], (rank, b2["losses"], a["losses"][8:])
        for k, shards in a["tables"].items():
            for x, y in zip(shards, b2["tables"][k], strict=True):
                assert torch.equal(x, y), k
        for k in a["fused"]:
            for n, x in a["fused"][k].items():
                if x is not None:
                    assert torch.equal(x, b2["fused"][k][n]), (k, n)
        for k, v in a["dense"].items():
            assert torch.equal(v, b2["dense"][k]), k
        assert a["history"][-1]["val_auc"] == b2["history"][-1]["val_auc"]
        assert a["history"][-1]["val_loss"] == b2["history"][-1]["val_loss"]
        # the pipelined loop trains the same batches in the same order: the same bits
        c = r["c"]
        assert c["pipelined"] and c["overlapped"] == 2 * BATCHES - 1
        assert c["ahead"] == 2 * BATCHES - 2  # all but each epoch's first batch
        assert c["labels"] == a["labels"], (c["labels"], a["labels"])  # same batches, same order
        assert c["losses"] == a["losses"], (rank, c["losses"], a["losses"])
        for k, shards in a["tables"].items():
            for x, y in zip(shards, c["tables"][k], strict=True):
                assert torch.equal(x, y), k
        assert c["history"][-1]["val_auc"] == a["history"][-1]["val_auc"]
        # pipelined resume mid-epoch: same batches in the same order, same losses as C
        d1, d2 = r["d1"], r["d2"]
        assert d1["losses"][:8] == c["losses"][:8]
        assert d2["labels"] == a["labels"][8:], (d2["labels"], a["labels"][8:])
        assert d2["losses"] == c["losses"][8:], (rank, d2["losses"], c["losses"][8:])
        assert d2["history"][-1]["val_auc"] == c["history"][-1]["val_auc"]
