"""kernel=torch with the Adam embedding optimizer: checkpoint -> resume == uninterrupted.

Adam's bias correction depends on the kernel's step count, which (like FBGEMM's) is not in the
fused optimizer's state_dict: the strategy sets it from the checkpoint's global step on resume.
2 real gloo ranks; A = 1 epoch uninterrupted, B = resume from B1's step-4 checkpoint.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from dist_ranks import run_ranks
from test_strategy_resume import BATCHES, _cfg, _fit

pytestmark = pytest.mark.slow


def _adam_cfg(run_dir: Path):
    cfg = _cfg(run_dir)
    cfg.kernel = "torch"
    cfg.model = dataclasses.replace(cfg.model, embedding_optimizer="adam")
    cfg.trainer = dataclasses.replace(cfg.trainer, max_epochs=1)
    return cfg


def _worker(rank: int, root: str):
    root = Path(root)
    a = _fit(_adam_cfg(root / "a"))
    b_cfg = _adam_cfg(root / "b")
    _fit(b_cfg, max_steps=5)  # checkpoints at steps 4 (interval) and 5 (stop)
    b2 = _fit(b_cfg, ckpt_path=str(Path(b_cfg.checkpoint.dir) / "step-000000004"))
    return dict(a=a, b2=b2)


def test_adam_kernel_step_restored_on_resume(tmp_path):
    import torch

    for rank, r in enumerate(run_ranks(_worker, 2, str(tmp_path))):
        a, b2 = r["a"], r["b2"]
        assert len(a["losses"]) == BATCHES
        assert b2["losses"] == a["losses"][4:], (rank, b2["losses"], a["losses"][4:])
        for k, shards in a["tables"].items():
            for x, y in zip(shards, b2["tables"][k], strict=True):
                assert torch.equal(x, y), k
