"""The compiled dense parts inside ``DistributedDataParallel`` (where TorchRec puts them): one
graph per part by default, Dynamo's per-bucket split with ``model.compile_ddp_optimizer=true``,
and the same numbers either way.

Real DDP on a one-rank gloo group, with 1 MB buckets (the smallest Dynamo's DDP optimizer takes:
DDP's first bucket) and a cross net and top MLP of several MB each, so that the DDP optimizer,
when on, has bucket edges to split at inside them. Graphs are counted with AOT autograd's own
counter (one compile per graph). Reference: the same dense model run eagerly in fp64 from the
same weights, without DDP.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from dense_models import D, F, dense_forward, dense_params, small_cfg
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel

from rocmtrain.config import ConfigError
from rocmtrain.models.dlrm import build_dlrm

B = 16
PARTS = 3  # bottom MLP, interaction, top MLP


class _Dense(torch.nn.Module):
    """The dense path of a built DLRM (pooled embeddings given), as DDP's module."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.dense_arch, self.inter_arch, self.over_arch = (
            model.dense_arch,
            model.inter_arch,
            model.over_arch,
        )

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return dense_forward(self, dense, sparse)


def _cfg(**overrides):
    """The tiny DCN with a 1.5 MB cross net (3 layers of rank 2048) and a 2.2 MB top MLP."""
    return small_cfg(
        "dcn", dcn_num_layers=3, dcn_low_rank_dim=2048, over_arch_layer_sizes=[1024, 512, 1],
        **overrides,
    )  # fmt: skip


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _graphs_and_grads(ddp_optimizer: bool, eager: torch.nn.Module, inputs):
    torch._dynamo.reset()
    model = build_dlrm(_cfg(compile_dense=True, compile_ddp_optimizer=ddp_optimizer))
    model.load_state_dict(eager.state_dict())
    dense_model = _Dense(model)
    ddp = DistributedDataParallel(dense_model, bucket_cap_mb=1)
    dense, sparse, grad_out = inputs
    sparse = sparse.clone().requires_grad_(True)
    before = counters["aot_autograd"]["total"]
    ddp(dense, sparse).backward(grad_out)
    graphs = counters["aot_autograd"]["total"] - before
    grads = {k: p.grad.double() for k, p in dense_params(dense_model).items()}
    return graphs, grads, sparse.grad.double()


def test_each_compiled_part_is_one_graph_under_ddp_unless_asked(one_rank_group) -> None:
    torch.manual_seed(0)
    eager = build_dlrm(_cfg())
    inputs = (torch.randn(B, 13), torch.randn(B, F, D), torch.randn(B, 1))
    ref = _Dense(copy.deepcopy(eager).double())
    sparse = inputs[1].double().requires_grad_(True)
    dense_forward(ref, inputs[0].double(), sparse).backward(inputs[2].double())
    want = {k: p.grad for k, p in dense_params(ref).items()}

    whole, grads, sparse_grad = _graphs_and_grads(False, eager, inputs)
    split, split_grads, split_sparse_grad = _graphs_and_grads(True, eager, inputs)

    assert whole == PARTS
    assert split > PARTS  # Dynamo split the parts at the 1 MB buckets
    for got, got_sparse in ((grads, sparse_grad), (split_grads, split_sparse_grad)):
        assert got.keys() == want.keys()
        for name, g in got.items():
            torch.testing.assert_close(g, want[name], rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(got_sparse, sparse.grad, rtol=1e-5, atol=1e-6)


def test_ddp_optimizer_without_compiled_parts_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="compile_ddp_optimizer.*compile_dense=true"):
        small_cfg("dcn", compile_ddp_optimizer=True)
