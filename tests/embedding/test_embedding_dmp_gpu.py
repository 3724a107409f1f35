"""GPU: DistributedModelParallel with ``kernel=triton`` (compiled Triton kernels) against TorchRec's
FBGEMM CUDA TBE, table-wise and row-wise, on 1-2 GPUs over nccl/RCCL. Skipped without a GPU."""

from __future__ import annotations

import pytest
import torch
from emb_workers import gpu_session, run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.fixture(scope="module")
def ranks():
    world = min(2, torch.cuda.device_count())
    return run_ranks(gpu_session, world, backend="nccl")


@pytest.mark.parametrize("st", ["table_wise", "row_wise"])
@pytest.mark.parametrize("opt", ["adagrad", "sgd"])
def test_triton_dmp_matches_fbgemm_on_gpu(ranks, st, opt):
    for res in ranks:
        torch.testing.assert_close(
            res[f"{st}/{opt}/triton/forward"], res["fp64/forward"], rtol=1e-5, atol=1e-5
        )
        torch.testing.assert_close(
            torch.tensor(res[f"{st}/{opt}/triton/losses"]),
            torch.tensor(res[f"{st}/{opt}/fbgemm/losses"]),
            rtol=1e-4,
            atol=1e-5,
        )
