"""Shared pieces of the embedding tests: a small sparse model, deterministic KJT batches, DMP
construction with a given kernel, and a runner for N real gloo ranks (torch.multiprocessing spawn).
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

FEATURES = ["f0", "f1", "f2", "f3"]


def table_configs() -> list[EmbeddingBagConfig]:
    """Odd shapes: D=12 (multiple of 4, not a power of 2), a table read by two features, MEAN."""
    return [
        EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=37, feature_names=["f0"]),
        EmbeddingBagConfig(
            name="t1", embedding_dim=12, num_embeddings=50, feature_names=["f1", "f2"]
        ),
        EmbeddingBagConfig(
            name="t2",
            embedding_dim=4,
            num_embeddings=23,
            feature_names=["f3"],
            pooling=PoolingType.MEAN,
        ),
    ]


ROWS = {"f0": 37, "f1": 50, "f2": 50, "f3": 23}
TOTAL_DIM = 8 + 12 + 12 + 4


def make_kjt(batch: int, seed: int, *, max_len: int = 4, hot_row: bool = False) -> KeyedJaggedTensor:
    """Key-major KJT with empty bags and duplicate ids; ``hot_row``: id 3 of f0 in every bag."""
    g = torch.Generator().manual_seed(seed)
    lengths, values = [], []
    for f in FEATURES:
        lens = torch.randint(0, max_len + 1, (batch,), generator=g)
        if hot_row and f == "f0":
            lens = lens + 1
        ids = torch.randint(0, ROWS[f], (int(lens.sum()),), generator=g)
        if hot_row and f == "f0":
            starts = torch.cumsum(lens, 0) - lens
            ids[starts] = 3
        lengths.append(lens)
        values.append(ids)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=FEATURES, values=torch.cat(values), lengths=torch.cat(lengths)
    )


def make_labels(batch: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randn(batch, generator=g)


class SparseModel(nn.Module):
    """EBC -> Linear -> scalar per sample (the dense part trains with SGD / DDP)."""

    def __init__(self, ebc: nn.Module, seed: int = 0) -> None:
        super().__init__()
        self.ebc = ebc
        torch.manual_seed(seed)
        self.over = nn.Linear(TOTAL_DIM, 1)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.over(self.ebc(kjt).values()).squeeze(1)


def reference_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Full (unsharded) initial weights every run starts from."""
    torch.manual_seed(seed)
    ebc = EmbeddingBagCollection(tables=table_configs())
    return {k: v.detach().clone() for k, v in SparseModel(ebc, seed).state_dict().items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn: Callable[..., Any], world: int, port: int, out: str, args: tuple) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank)
    )
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        torch.save(result, Path(out) / f"result_{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned gloo ranks; each rank's return value."""
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_entry, args=(fn, world, free_port(), out, args), nprocs=world, join=True)
        return [torch.load(Path(out) / f"result_{r}.pt", weights_only=False) for r in range(world)]


def build_dmp(
    kernel: str,
    sharding_type: str,
    *,
    optimizer: type[torch.optim.Optimizer],
    opt_kwargs: dict[str, Any],
    init: dict[str, torch.Tensor],
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """DMP over :class:`SparseModel` (tables on meta, sharded by the real planner), loaded with
    the full ``init`` state; returns ``(dmp, dense SGD optimizer)``."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import (
        KernelConfig,
        ParameterConstraints,
        TopologyFactory,
        TrainerConfig,
    )
    from torchrec.distributed.types import ShardingEnv
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper

    from rocmtrain.embedding import get_sharders

    world = dist.get_world_size()
    sharders = get_sharders(kernel) or [EmbeddingBagCollectionSharder()]
    ebc = EmbeddingBagCollection(tables=table_configs(), device=torch.device("meta"))
    model = SparseModel(ebc)
    apply_optimizer_in_backward(optimizer, model.ebc.parameters(), opt_kwargs)
    topology = TopologyFactory.create_topology(
        trainer_config=TrainerConfig(world_size=world, local_world_size=world),
        kernel_config=KernelConfig(compute_device="cpu"),
    )
    constraints = {
        t.name: ParameterConstraints(sharding_types=[sharding_type]) for t in table_configs()
    }
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    plan = planner.collective_plan(model, sharders, dist.group.WORLD)
    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"),
        plan=plan,
        sharders=sharders,
    )
    dmp.load_state_dict(init)
    dense = KeyedOptimizerWrapper(
        dict(in_backward_params(dmp)), lambda params: torch.optim.SGD(params, lr=0.1)
    )
    return dmp, dense


def in_backward_params(dmp: nn.Module):
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    return in_backward_optimizer_filter(dmp.named_parameters())
