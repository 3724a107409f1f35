"""2 real gloo ranks: ``strategy.pipeline=semi_sync`` (TorchRec ``TrainPipelineSemiSync``).

Semi-sync semantics: the embedding lookup of batch i+1 starts before batch i's backward, so
batch i+1 is computed with embeddings that do not include batch i's (fused, in-backward)
update, while the dense weights are current. Checked against hand-rolled loops over the same
sharded model, same seed and same batches:

* ``ref_sync``: look up batch i+1 after batch i's backward (= ``TrainPipelineSparseDist``; this
  checks the harness itself against the ``sparse_dist`` pipeline);
* ``ref_stale``: look up batch i+1 before batch i's backward (one step stale embeddings).

The semi-sync pipeline's per-step losses must equal ``ref_stale``'s and differ from the
synchronous ones after step 0, and it must learn the planted signal.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dist_ranks import run_ranks

BATCHES = 16


def _cfg(run_dir: Path, pipeline: str, batch_size: int = 64, **trainer: object):
    """The tiny run: one epoch of BATCHES steps, no validation and no checkpoints unless
    ``trainer`` says otherwise."""
    from tiny_config import tiny_run_config

    settings = dict(max_epochs=1, num_sanity_val_steps=0, limit_val_batches=0) | trainer
    cfg = tiny_run_config(run_dir, batch_size=batch_size, train_batches=BATCHES, **settings)
    cfg.checkpoint.enabled = False
    cfg.strategy.pipeline = pipeline
    return cfg


def _reference_module(stale: bool, start: int = 0):
    """A PipelinedDLRMModule whose step is a hand-rolled loop over the whole epoch."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from rocmtrain.models.module import PipelinedDLRMModule

    class Reference(PipelinedDLRMModule):
        def training_step(self, dataloader_iter):  # type: ignore[override]
            batches = [
                (item[0] if isinstance(item, tuple) else item).to(self.device)
                for item in dataloader_iter
            ]
            dlrm = self.model  # the sharded DLRM, called past DDP: dense grads reduced below
            opt = self.optimizers().optimizer
            world = dist.get_world_size()
            pooled = dlrm.sparse_arch(batches[0].sparse_features)
            for i, b in enumerate(batches):
                x = dlrm.inter_arch(
                    dense_features=dlrm.dense_arch(b.dense_features), sparse_features=pooled
                )
                logits = dlrm.over_arch(x).squeeze(-1)
                loss = F.binary_cross_entropy_with_logits(logits, b.labels)
                nxt = batches[i + 1] if i + 1 < len(batches) else None
                early = stale and i >= start  # stale from batch `start` on
                if early and nxt is not None:  # lookup before this step's embedding update
                    pooled = dlrm.sparse_arch(nxt.sparse_features)
                opt.zero_grad()
                loss.backward()  # the embedding update is fused into this backward
                for p in dlrm.parameters():  # what DDP does: average the dense gradients
                    if p.grad is not None:  # (the embeddings' update is fused: no .grad)
                        p.grad.div_(world)
                        dist.all_reduce(p.grad)
                opt.step()
                if not early and nxt is not None:
                    pooled = dlrm.sparse_arch(nxt.sparse_features)
                self._record(loss, logits, b.labels)

    return Reference


def _fit(cfg, module_cls, index: int):
    import os

    import pytorch_lightning as pl
    import torch.distributed as dist

    from rocmtrain.data import build_datamodule
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
    module = module_cls(m, verbose=False)
    trainer = build_trainer(cfg, Path(cfg.run_dir))
    # each fit its own process group and rendezvous port (the last one's store may linger)
    os.environ["MASTER_PORT"] = str(int(os.environ["MASTER_PORT"]) + index)
    trainer.fit(module, datamodule=dm)
    tables = _table_dtypes(module)  # the shards' state needs the process group
    dist.barrier()
    dist.destroy_process_group()
    pipeline = getattr(module, "_pipeline", None)
    own = trainer.strategy.input_pipeline
    return dict(
        losses=list(module.step_losses),
        pipeline=type(pipeline).__name__ if pipeline is not None else None,
        looked_up_ahead=own.looked_up_ahead if own is not None else None,
        table_dtypes=tables,
    )


def _table_dtypes(module) -> list[str]:
    """The dtypes of this rank's table shards."""
    return sorted(
        {
            str(t.local_shards()[0].tensor.dtype)
            for k, t in module.state_dict().items()
            if "embedding_bags" in k and hasattr(t, "local_shards") and t.local_shards()
        }
    )


def _start_at(cfg, start: int):
    cfg.strategy.semi_sync_start_batch = start
    return cfg


def _worker(rank: int, root: str):
    from rocmtrain.models.module import DLRMModule, PipelinedDLRMModule

    root = Path(root)
    return dict(
        semi=_fit(_cfg(root / "semi", "semi_sync"), PipelinedDLRMModule, 0),
        sparse=_fit(_cfg(root / "sparse", "sparse_dist"), PipelinedDLRMModule, 1),
        ref_sync=_fit(_cfg(root / "sync", "sparse_dist"), _reference_module(stale=False), 1),
        ref_stale=_fit(_cfg(root / "stale", "sparse_dist"), _reference_module(stale=True), 1),
        own=_fit(_cfg(root / "own", "semi_sync"), DLRMModule, 1),
        own_s5=_fit(_start_at(_cfg(root / "own5", "semi_sync"), 5), DLRMModule, 1),
        ref_s5=_fit(_cfg(root / "stale5", "sparse_dist"), _reference_module(True, 5), 1),
    )


def test_semi_sync_is_a_pipelined_choice():
    from rocmtrain.config import ConfigError
    from rocmtrain.config.strategy import StrategyConfig
    from rocmtrain.strategies import TorchRecStrategy

    StrategyConfig(pipeline="semi_sync").validate()
    with pytest.raises(ConfigError, match="strategy.semi_sync_start_batch"):
        StrategyConfig(pipeline="semi_sync", semi_sync_start_batch=-1).validate()
    with pytest.raises(ConfigError, match="semi_sync_start_batch"):
        TorchRecStrategy(pipeline="semi_sync", semi_sync_start_batch=-5)
    s = TorchRecStrategy(pipeline="semi_sync")
    assert s.uses_pipeline("cpu") and s.uses_pipeline("gpu")  # asked for: on CPU too
    assert s.pipeline_kind("cpu") == "semi_sync"
    assert TorchRecStrategy(pipeline="sparse_dist").pipeline_kind("cpu") == "sparse_dist"
    assert TorchRecStrategy(pipeline="auto").pipeline_kind("gpu") == "sparse_dist"
    assert TorchRecStrategy(pipeline="auto").pipeline_kind("cpu") is None
    assert TorchRecStrategy(pipeline="none").pipeline_kind("gpu") is None


@pytest.mark.slow
def test_semi_sync_lookups_are_one_step_stale_and_train(tmp_path):
    import torch

    for rank, r in enumerate(run_ranks(_worker, 2, str(tmp_path))):
        semi, sparse = torch.tensor(r["semi"]["losses"]), torch.tensor(r["sparse"]["losses"])
        ref_sync = torch.tensor(r["ref_sync"]["losses"])
        ref_stale = torch.tensor(r["ref_stale"]["losses"])
        own = torch.tensor(r["own"]["losses"])
        # the strategy's own stale lookups, for a plain module: the same one-step-stale loop
        assert r["own"]["pipeline"] is None  # no TorchRec pipeline: the strategy does it
        assert torch.allclose(own, ref_stale, rtol=1e-5, atol=1e-6), (rank, own, ref_stale)
        assert (own[1:] - ref_sync[1:]).abs().max() > 1e-5, (rank, own, ref_sync)
        assert r["own"]["looked_up_ahead"] == BATCHES - 1, r["own"]
        # semi_sync_start_batch=5: batches 0-5 exact, stale lookups from batch 6 on
        own5, ref5 = torch.tensor(r["own_s5"]["losses"]), torch.tensor(r["ref_s5"]["losses"])
        assert torch.allclose(own5, ref5, rtol=1e-5, atol=1e-6), (rank, own5, ref5)
        assert torch.allclose(own5[:6], ref_sync[:6], rtol=1e-5, atol=1e-6)
        assert r["own_s5"]["looked_up_ahead"] == BATCHES - 1 - 5
        assert "TrainPipelineSemiSync" in r["semi"]["pipeline"], r["semi"]["pipeline"]
        assert r["sparse"]["pipeline"] == "TrainPipelineSparseDist"
        assert len(semi) == len(sparse) == len(ref_sync) == len(ref_stale) == BATCHES
        # the harness reproduces the synchronous pipeline ...
        assert torch.allclose(ref_sync, sparse, rtol=1e-5, atol=1e-6), (rank, ref_sync, sparse)
        # ... and semi-sync is the one-step-stale loop, not the synchronous one
        assert torch.allclose(semi, ref_stale, rtol=1e-5, atol=1e-6), (rank, semi, ref_stale)
        assert semi[0] == pytest.approx(float(sparse[0]), rel=1e-6)  # no update before step 0
        assert (semi[1:] - sparse[1:]).abs().max() > 1e-5, (rank, semi, sparse)
        # it trains: finite, and the planted signal lowers the loss
        assert torch.isfinite(semi).all()
        assert semi[-4:].mean() < semi[:4].mean(), (rank, semi)


def _two_epoch_worker(rank: int, root: str):
    from rocmtrain.models.module import DLRMModule

    root = Path(root)
    two = dict(max_epochs=2, limit_val_batches=1.0)  # a validation after each epoch
    return dict(
        own=_fit(_cfg(root / "own2", "semi_sync", **two), DLRMModule, 0),
        ref_stale=_fit(_cfg(root / "stale2", "sparse_dist", **two), _reference_module(True), 1),
    )


@pytest.mark.slow
def test_semi_sync_across_epochs_and_validation(tmp_path):
    """Each epoch starts with a lookup of current tables (the previous epoch's last step looked
    nothing up ahead) and validation between epochs reads the updated tables: the losses of both
    epochs are the hand-written stale loop's, epoch by epoch."""
    import torch

    for rank, r in enumerate(run_ranks(_two_epoch_worker, 2, str(tmp_path))):
        own, ref = torch.tensor(r["own"]["losses"]), torch.tensor(r["ref_stale"]["losses"])
        assert len(own) == len(ref) == 2 * BATCHES
        assert r["own"]["looked_up_ahead"] == 2 * (BATCHES - 1)
        assert torch.allclose(own, ref, rtol=1e-5, atol=1e-6), (rank, own, ref)
