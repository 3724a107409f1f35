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


def make_kjt(
    batch: int, seed: int, *, max_len: int = 4, hot_row: bool = False
) -> KeyedJaggedTensor:
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
        d = self.ebc(kjt).to_dict()  # a sharded EBC may order its output keys differently
        return self.over(torch.cat([d[f] for f in FEATURES], dim=1)).squeeze(1)


def reference_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Full (unsharded) initial weights every run starts from."""
    torch.manual_seed(seed)
    ebc = EmbeddingBagCollection(tables=table_configs())
    return {k: v.detach().clone() for k, v in SparseModel(ebc, seed).state_dict().items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    rank: int, fn: Callable[..., Any], world: int, port: int, out: str, backend: str, args: tuple
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank)
    )
    if backend == "gloo":  # CPU ranks: Triton kernels run in the interpreter (read at first use)
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        torch.cuda.set_device(rank)
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        torch.save(fn(rank, world, *args), Path(out) / f"result_{rank}.pt")
        quiesce()
    finally:
        dist.destroy_process_group()
    exit_now()


def quiesce() -> None:
    """Free what still uses the process group, then wait for the peer, before destroying it.

    The DMP/DDP models a session builds sit in reference cycles (module hooks) that hold the
    group and the collectives' work objects; left to the interpreter's final collection, they are
    destroyed during finalization while gloo's worker threads still run, and the rank aborts
    (``terminate called without an active exception``, SIGABRT). Collecting them here frees them
    while everything is alive; the barrier keeps a rank from closing its gloo connections while
    the other still has a collective in flight.
    """
    import gc

    import torch.distributed as dist

    gc.collect()
    dist.barrier()


def exit_now() -> None:
    """End a rank that finished (result saved, group destroyed) without interpreter finalization.

    What is left is library state (intra-op/inter-op thread pools, gloo's transport threads);
    tearing it down at exit only gives it a chance to abort a run whose work is done.
    """
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, backend: str = "gloo") -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned ranks (gloo on CPU, or nccl with one
    GPU per rank); each rank's return value."""
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_entry, args=(fn, world, free_port(), out, backend, args), nprocs=world, join=True)
        return [torch.load(Path(out) / f"result_{r}.pt", weights_only=False) for r in range(world)]


def build_dmp(
    kernel: str,
    sharding_type: str,
    *,
    optimizer: type[torch.optim.Optimizer],
    opt_kwargs: dict[str, Any],
    init: dict[str, torch.Tensor],
    device: torch.device | None = None,
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
    device = device or torch.device("cpu")
    sharders = get_sharders(kernel) or [EmbeddingBagCollectionSharder()]
    ebc = EmbeddingBagCollection(tables=table_configs(), device=torch.device("meta"))
    model = SparseModel(ebc)
    apply_optimizer_in_backward(optimizer, model.ebc.parameters(), dict(opt_kwargs))
    topology = TopologyFactory.create_topology(
        trainer_config=TrainerConfig(world_size=world, local_world_size=world),
        kernel_config=KernelConfig(compute_device=device.type),
    )
    constraints = {
        t.name: ParameterConstraints(sharding_types=[sharding_type]) for t in table_configs()
    }
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    plan = planner.collective_plan(model, sharders, dist.group.WORLD)
    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=device,
        plan=plan,
        sharders=sharders,
    )
    dmp.load_state_dict({k: v.clone() for k, v in init.items()})  # the hooks edit it in place
    dense = KeyedOptimizerWrapper(
        dict(in_backward_params(dmp)), lambda params: torch.optim.SGD(params, lr=0.1)
    )
    return dmp, dense


def in_backward_params(dmp: nn.Module):
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    return in_backward_optimizer_filter(dmp.named_parameters())


# ------------------------------------------------------------------ the 2-rank session
BATCH = 8
STEPS = 6


def batch(step: int, rank: int, world: int) -> tuple[KeyedJaggedTensor, torch.Tensor]:
    seed = step * world + rank
    return make_kjt(BATCH, seed=seed, hot_row=step % 2 == 0), make_labels(BATCH, seed=seed)


def train(model: nn.Module, dense: torch.optim.Optimizer, rank: int, world: int, steps) -> list:
    losses = []
    device = next(p for p in model.parameters() if p.requires_grad).device
    for step in steps:
        kjt, y = batch(step, rank, world)
        kjt, y = kjt.to(device), y.to(device)
        loss = ((model(kjt) - y) ** 2).mean()
        dense.zero_grad()
        loss.backward()
        dense.step()
        losses.append(loss.item())
    return losses


def fp64_pooled(state: dict, kjt: KeyedJaggedTensor, *, prefix: str = "") -> torch.Tensor:
    """Pooled bags in float64 (F.embedding_bag per feature), torchrec's column order."""
    cols = []
    jt = kjt.to_dict()
    for cfg in table_configs():
        w = state[f"{prefix}embedding_bags.{cfg.name}.weight"].double()
        for f in cfg.feature_names:
            j = jt[f]
            psw = j.weights().double() if j.weights_or_none() is not None else None
            pooled = torch.nn.functional.embedding_bag(
                j.values(), w, j.offsets()[:-1], mode="sum", per_sample_weights=psw
            )
            if cfg.pooling == PoolingType.MEAN:  # mean of the (weighted) rows; 0 if empty
                pooled = pooled / j.lengths().clamp(min=1).double()[:, None]
            cols.append(pooled)
    return torch.cat(cols, dim=1)


def fp64_forward(init: dict[str, torch.Tensor], kjt: KeyedJaggedTensor) -> torch.Tensor:
    """The unsharded model in float64."""
    pooled = fp64_pooled(init, kjt, prefix="ebc.")
    return (pooled @ init["over.weight"].double().T + init["over.bias"].double()).squeeze(1)


def kernel_steps(dmp: nn.Module) -> list[int]:
    """Step counts of our kernels on this rank (the sharded EBC keeps its lookups in a list)."""
    from rocmtrain.embedding.sharder import RocmShardedEmbeddingBagCollection

    return [
        kernel.emb_module.step
        for m in dmp.modules()
        if isinstance(m, RocmShardedEmbeddingBagCollection)
        for lookup in m._lookups
        for kernel in lookup._emb_modules
    ]


def session(rank: int, world: int, tmp: str) -> dict[str, Any]:
    """Everything the distributed tests check, in one spawn (imports dominate the runtime)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.nn.parallel import DistributedDataParallel
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from rocmtrain.embedding import EmbeddingBagCollection as RocmEBC
    from rocmtrain.kernels import OptimizerSpec

    init = reference_state()
    adagrad = (RowWiseAdagrad, {"lr": 0.1, "eps": 1e-8})
    sgd = (torch.optim.SGD, {"lr": 0.5})
    res: dict[str, Any] = {}
    kjt0, _ = batch(0, rank, world)
    for st in ("table_wise", "row_wise"):
        for opt_name, (opt, kw) in (("adagrad", adagrad), ("sgd", sgd)):
            # TorchRec's own sharder offers row_wise only on CUDA: the CPU FBGEMM reference
            # curve is the table-wise one (the sharding does not change the math)
            for kernel in ("torch", "fbgemm") if st == "table_wise" else ("torch",):
                dmp, dense = build_dmp(kernel, st, optimizer=opt, opt_kwargs=kw, init=init)
                key = f"{st}/{opt_name}/{kernel}"
                if opt_name == "adagrad":
                    with torch.no_grad():
                        res[f"{key}/forward"] = dmp(kjt0).double()
                    res[f"{key}/plan"] = sorted(
                        (t, p.compute_kernel) for t, p in dmp.plan.plan["ebc"].items()
                    )
                res[f"{key}/losses"] = train(dmp, dense, rank, world, range(STEPS))
                if st == "row_wise" and opt_name == "adagrad" and kernel == "torch":
                    # DCP round trip: save, continue 3 steps; fresh DMP + load, same 3 steps
                    state = {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}
                    res["sd_types"] = {k: type(v).__name__ for k, v in state["model"].items()}
                    res["optim_keys"] = sorted(state["optim"]["state"])
                    dcp.save(state, checkpoint_id=f"{tmp}/dcp")
                    res["dcp/steps_saved"] = kernel_steps(dmp)
                    steps = range(STEPS, STEPS + 3)
                    res["dcp/continued"] = train(dmp, dense, rank, world, steps)
                    fresh, fdense = build_dmp(kernel, st, optimizer=opt, opt_kwargs=kw, init=init)
                    state = {
                        "model": fresh.state_dict(),
                        "optim": fresh.fused_optimizer.state_dict(),
                    }
                    dcp.load(state, checkpoint_id=f"{tmp}/dcp")
                    fresh.load_state_dict(state["model"])
                    fresh.fused_optimizer.load_state_dict(state["optim"])
                    fresh.fused_optimizer.set_optimizer_step(STEPS)  # as for FBGEMM
                    res["dcp/steps_resumed"] = kernel_steps(fresh)
                    # the dense SGD has no state: the resumed run matches from here
                    res["dcp/resumed"] = train(fresh, fdense, rank, world, steps)
                del dmp, dense
    res["fp64/forward"] = fp64_forward(init, kjt0)

    # Triton kernels (interpreter on CPU) through the sharded path: forward == torch backend
    dmp, dense = build_dmp("triton", "row_wise", optimizer=RowWiseAdagrad, opt_kwargs=adagrad[1],
                           init=init)  # fmt: skip
    with torch.no_grad():
        res["triton/forward"] = dmp(kjt0).double()
    res["triton/losses"] = train(dmp, dense, rank, world, range(2))  # fused backward too
    del dmp, dense

    # data parallel drop-in EBC: replicated tables, sparse all-gather update == DMP's curve
    torch.manual_seed(0)
    ebc = RocmEBC(
        table_configs(),
        optimizer=OptimizerSpec("rowwise_adagrad", lr=0.1, eps=1e-8),
        process_group=dist.group.WORLD,
    )
    model = SparseModel(ebc)
    model.load_state_dict(init)
    ddp = DistributedDataParallel(model)
    dense = torch.optim.SGD([p for p in ddp.parameters() if p.requires_grad], lr=0.1)
    res["dp/losses"] = train(ddp, dense, rank, world, range(STEPS))
    res["dp/weights"] = {k: v.clone() for k, v in model.ebc.state_dict().items()}
    return res


def gpu_session(rank: int, world: int) -> dict[str, Any]:
    """GPU: kernel=triton (compiled) vs kernel=fbgemm (FBGEMM CUDA TBE), TW and RW, on nccl."""
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    device = torch.device("cuda", rank)
    init = reference_state()
    res: dict[str, Any] = {}
    kjt0, _ = batch(0, rank, world)
    res["fp64/forward"] = fp64_forward(init, kjt0)
    for st in ("table_wise", "row_wise"):
        for opt_name, opt, kw in (
            ("adagrad", RowWiseAdagrad, {"lr": 0.1, "eps": 1e-8}),
            ("sgd", torch.optim.SGD, {"lr": 0.5}),
        ):
            for kernel in ("triton", "fbgemm"):
                dmp, dense = build_dmp(
                    kernel, st, optimizer=opt, opt_kwargs=kw, init=init, device=device
                )
                key = f"{st}/{opt_name}/{kernel}"
                with torch.no_grad():
                    res[f"{key}/forward"] = dmp(kjt0.to(device)).double().cpu()
                res[f"{key}/losses"] = train(dmp, dense, rank, world, range(STEPS))
                del dmp, dense
    return res
