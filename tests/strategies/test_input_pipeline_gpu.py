"""The input pipeline on one real GPU: side streams for the copy and the input dist, the module
untouched. Pipelined and plain runs of a user's module train the same batches to the same losses
(FBGEMM's GPU kernels are deterministic here; compared to 1e-6), and every step after the first
read its embedding input from the pipeline. Skipped without a GPU; the lead runs it there:

    python -m pytest tests/strategies/test_input_pipeline_gpu.py -m gpu -q
"""

from __future__ import annotations

import pytest
from pipeline_modules import EPOCHS, STEPS, fit, user_module

pytestmark = pytest.mark.gpu


def test_input_pipeline_on_gpu_matches_the_plain_loop(tmp_path):
    import torch

    none = fit(user_module, 0, "none", tmp_path, accelerator="gpu", devices=1)
    pipe = fit(user_module, 0, "sparse_dist", tmp_path, accelerator="gpu", devices=1)
    assert none["pipelined"] is None
    assert pipe["pipelined"] == {"model.model.sparse_arch.embedding_bag_collection": True}
    assert pipe["overlapped"] == STEPS * EPOCHS - 1
    assert pipe["ahead"] == STEPS * EPOCHS - EPOCHS  # distributed during the previous step
    assert len(pipe["losses"]) == len(none["losses"]) == STEPS * EPOCHS
    torch.testing.assert_close(
        torch.tensor(pipe["losses"]), torch.tensor(none["losses"]), rtol=1e-6, atol=1e-7
    )
    # the strategy's teardown leaves the tables (and the rest) on the GPU: no copy to the host
    assert pipe["devices"] == none["devices"] == ["cuda"]
    # "auto" on a GPU is the pipeline
    auto = fit(user_module, 0, "auto", tmp_path, accelerator="gpu", devices=1)
    assert auto["overlapped"] == STEPS * EPOCHS - 1


def test_a_pinning_loader_is_pinned_and_copied_off_the_training_thread():
    """``DataLoader(pin_memory=True)`` without workers: the copy thread pins and copies; every
    batch arrives on the GPU, in order, equal to the loader's."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from rocmtrain.strategies.input_pipeline import InputPipeline, PipelinedLoader

    data = [torch.randn(1024, 64) + i for i in range(6)]
    loader = DataLoader(data, batch_size=None, pin_memory=True)
    pipe = InputPipeline(nn.Linear(2, 2), torch.device("cuda", torch.cuda.current_device()))
    got = list(PipelinedLoader(loader, pipe))
    torch.cuda.synchronize()
    assert loader.pin_memory
    assert [b.device.type for b in got] == ["cuda"] * len(data)
    for want, b in zip(data, got, strict=True):
        torch.testing.assert_close(b.cpu(), want, rtol=0, atol=0)
