"""The strategy's input pipeline on 2 real gloo ranks, for modules not written for it.

* A user's module in torchrec's own style (``DLRMTrain(DLRM(...))``, a plain ``training_step``
  that calls ``self.model(batch)``, no ``forward``): ``pipeline="sparse_dist"`` gives bitwise the
  losses, tables and dense weights of ``pipeline="none"``, and every step after the first took
  its embedding input from the pipeline (the input dist of batch i+1 ran during batch i); the
  same when the loader runs in the pipeline's background thread (the GPU default).
* A module that builds its KeyedJaggedTensor inside ``training_step`` cannot be pipelined: it is
  told so in the log, keeps its synchronous input dist and trains exactly as without the pipeline.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dist_ranks import run_ranks
from pipeline_modules import EPOCHS, STEPS, builds_its_kjt_module, fit, user_module

pytestmark = pytest.mark.slow


def _worker(rank: int, root: str):
    root = Path(root)
    return dict(
        user_none=fit(user_module, rank, "none", root / "user"),
        user_pipe=fit(user_module, rank, "sparse_dist", root / "user"),
        user_thread=fit(user_module, rank, "sparse_dist", root / "thread", background=True),
        rebuild_none=fit(builds_its_kjt_module, rank, "none", root / "rebuild"),
        rebuild_pipe=fit(builds_its_kjt_module, rank, "sparse_dist", root / "rebuild"),
    )


def test_input_pipeline_is_bitwise_the_plain_loop(tmp_path):
    import torch

    results = run_ranks(_worker, 2, str(tmp_path))
    for rank, r in enumerate(results):
        none, pipe = r["user_none"], r["user_pipe"]
        assert none["pipelined"] is None and none["overlapped"] is None
        assert len(pipe["losses"]) == STEPS * EPOCHS
        assert pipe["losses"] == none["losses"], (rank, pipe["losses"], none["losses"])
        for k, shards in none["weights"].items():
            for x, y in zip(shards, pipe["weights"][k], strict=True):
                assert torch.equal(x, y), (rank, k)
        # the one sharded module was pipelined; step 1 learned where its input is in the batch
        assert pipe["pipelined"] == {"model.model.sparse_arch.embedding_bag_collection": True}
        assert pipe["overlapped"] == STEPS * EPOCHS - 1
        # ... and each of those inputs was distributed during the previous step (the overlap),
        # but for the first batch of an epoch (nothing ran before it)
        assert pipe["ahead"] == STEPS * EPOCHS - EPOCHS
        # loading in the background thread (the GPU default) trains the very same batches
        thread = r["user_thread"]
        assert thread["losses"] == none["losses"], (rank, thread["losses"], none["losses"])
        assert thread["overlapped"] == pipe["overlapped"] and thread["ahead"] == pipe["ahead"]
        # a KJT built inside the step: not pipelined, same training
        rn, rp = r["rebuild_none"], r["rebuild_pipe"]
        assert rp["pipelined"] == {"ebc": False}
        assert rp["overlapped"] == rp["ahead"] == 0
        assert rp["losses"] == rn["losses"]
