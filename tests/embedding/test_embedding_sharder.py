"""get_sharders / fused_params mapping / the real TorchRec planner with our sharder (one process)."""

from __future__ import annotations

import pytest
import torch
from emb_workers import table_configs
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import (
    KernelConfig,
    ParameterConstraints,
    TopologyFactory,
    TrainerConfig,
)
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from rocmtrain.embedding import get_sharders
from rocmtrain.embedding.params import FusedParamsError, tbe_options
from rocmtrain.embedding.sharder import RocmEmbeddingBagCollectionSharder
from rocmtrain.kernels import OptimizerSpec


def test_get_sharders_per_kernel():
    assert get_sharders("fbgemm") is None
    for kernel in ("triton", "torch"):
        (sharder,) = get_sharders(kernel, fused_params={"learning_rate": 0.3})
        assert isinstance(sharder, RocmEmbeddingBagCollectionSharder)
        assert sharder.backend == kernel and sharder.fused_params == {"learning_rate": 0.3}
        assert sharder.compute_kernels("row_wise", "cuda") == ["customized_kernel"]
        assert sharder.compute_kernels("column_wise", "cuda") == []


def test_unknown_kernel_names_field_and_choices():
    with pytest.raises(
        ValueError, match=r"kernel='fbgem' is not one of \('fbgemm', 'triton', 'torch'\)"
    ):
        get_sharders("fbgem")


def test_fused_params_map_to_optimizer_spec():
    spec, extra = tbe_options(
        {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05, "eps": 1e-6,
         "output_dtype": SparseType.BF16, "cache_precision": SparseType.FP32}
    )  # fmt: skip
    assert spec == OptimizerSpec("rowwise_adagrad", lr=0.05, eps=1e-6)
    assert extra == {"output_dtype": torch.bfloat16, "bounds_check_every": 100}
    spec, _ = tbe_options({"optimizer": EmbOptimType.ADAM, "lr": 1e-3, "betas": (0.8, 0.9)})
    assert spec == OptimizerSpec("adam", lr=1e-3, beta1=0.8, beta2=0.9)
    assert tbe_options(None)[0] == OptimizerSpec()


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"optimizer": EmbOptimType.EXACT_ADAGRAD}, "rowwise_adagrad"),
        ({"optimizer": EmbOptimType.LAMB}, "EXACT_SGD, EXACT_ROWWISE_ADAGRAD or ADAM"),
        ({"momentum": 0.9}, r"fused_params\['momentum'\]=0.9"),
        ({"learning_rate": -1.0}, "lr=-1.0 must be >= 0"),
        ({"weights_precision": SparseType.INT8}, "weights_precision"),
        ({"bogus": 1}, r"\['bogus'\]"),
        ({"bounds_check_every": 0}, r"fused_params\['bounds_check_every'\]=0: use an int >= 1"),
        ({"bounds_check_every": True}, r"\['bounds_check_every'\]=True"),
    ],
)
def test_fused_params_we_cannot_honour_are_refused(params, match):
    with pytest.raises(FusedParamsError, match=match):
        tbe_options(params)
    with pytest.raises(FusedParamsError, match=match):
        get_sharders("torch", fused_params=params)


def _plan(world: int, device: str, sharding_type: str):
    sharders = get_sharders("triton")  # before the planner: registers the cost-model entry
    topology = TopologyFactory.create_topology(
        trainer_config=TrainerConfig(world_size=world, local_world_size=world),
        kernel_config=KernelConfig(compute_device=device),
    )
    constraints = {
        t.name: ParameterConstraints(sharding_types=[sharding_type]) for t in table_configs()
    }
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    ebc = EmbeddingBagCollection(tables=table_configs(), device=torch.device("meta"))
    return planner.plan(ebc, sharders).plan[""]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("sharding_type", ["table_wise", "row_wise"])
def test_real_planner_places_tables_on_customized_kernel(device, sharding_type):
    plan = _plan(4, device, sharding_type)
    assert {p.compute_kernel for p in plan.values()} == {"customized_kernel"}
    assert {p.sharding_type for p in plan.values()} == {sharding_type}


def test_planner_refuses_sharding_types_we_do_not_serve():
    with pytest.raises(RuntimeError, match="No available sharding type"):
        _plan(2, "cpu", "column_wise")


def test_planner_side_fused_params_are_understood():
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    _, extra = tbe_options({"bounds_check_mode": BoundsCheckMode.NONE, "enforce_hbm": True,
                            "stochastic_rounding": False})  # fmt: skip
    assert extra == {"bounds_check": False, "stochastic_rounding": False, "bounds_check_every": 100}
    _, extra = tbe_options({"bounds_check_mode": BoundsCheckMode.WARNING, "bounds_check_every": 1})
    assert extra == {"bounds_check": True, "bounds_check_every": 1}
