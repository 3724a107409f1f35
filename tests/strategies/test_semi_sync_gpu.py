"""``strategy.pipeline=semi_sync`` on one real GPU: the lookups and the embedding backward run on
the pipeline's side stream, overlapping the dense work, and the losses are still exactly the
one-step-stale loop's (the hand-rolled reference of ``test_strategy_semi_sync``, run on the same
GPU), not the synchronous loop's. Large batches so the streams really run side by side.
Skipped without a GPU:

    python -m pytest tests/strategies/test_semi_sync_gpu.py -m gpu -q
"""

from __future__ import annotations

import socket

import pytest
from test_strategy_semi_sync import BATCHES, _cfg, _fit, _reference_module

pytestmark = pytest.mark.gpu


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_semi_sync_on_gpu_is_the_stale_loop(tmp_path, monkeypatch):
    import torch

    from rocmtrain.models.module import DLRMModule

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    gpu = dict(batch_size=8192, accelerator="gpu", devices=1)
    own = _fit(_cfg(tmp_path / "own", "semi_sync", **gpu), DLRMModule, 0)
    stale = _fit(_cfg(tmp_path / "stale", "sparse_dist", **gpu), _reference_module(True), 1)
    sync = _fit(_cfg(tmp_path / "sync", "sparse_dist", **gpu), _reference_module(False), 1)
    own_l, stale_l, sync_l = (torch.tensor(r["losses"]) for r in (own, stale, sync))
    assert own["looked_up_ahead"] == BATCHES - 1
    assert len(own_l) == len(stale_l) == BATCHES
    torch.testing.assert_close(own_l, stale_l, rtol=1e-5, atol=1e-6)
    assert (own_l[1:] - sync_l[1:]).abs().max() > 1e-5, (own_l, sync_l)
    assert torch.isfinite(own_l).all() and own_l[-4:].mean() < own_l[:4].mean()
