"""Plain TorchRec anchor for the end-to-end benchmark: DLRM-DCNv2, no Lightning, no rocmtrain.

DMP + FBGEMM fused TBE (rowwise Adagrad in backward) + TrainPipelineSparseDist, the way TorchRec's own
DLRM example trains. rocmtrain's end-to-end numbers are reported as ratios against this script run in
the same session on the same GPUs (scripts/bench/bench_e2e_gpu.sh).

    # 1 GPU
    python scripts/bench/e2e_torchrec_anchor.py --batch-size 65536 --bf16 --out anchor_1gpu.json
    # 2 GPUs (global batch = per-GPU batch x 2 here; pass --global-batch to fix the global size)
    torchrun --standalone --nproc-per-node 2 scripts/bench/e2e_torchrec_anchor.py --bf16 --out a2.json

Data (--data planted, default): the same batches the rocmtrain recipe trains on with
data.cache_batches=N (rocmtrain.data's planted-signal generator: power-law ids, MLPerf multi-hot
sizes; only the data comes from rocmtrain), generated once on the host, pinned and cycled, so the
input pipeline is not the bottleneck. --data uniform: uniform ids and random labels instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

MLPERF_MULTI_HOT = [
    3,
    2,
    1,
    2,
    6,
    1,
    1,
    1,
    1,
    7,
    3,
    8,
    1,
    6,
    9,
    5,
    1,
    1,
    1,
    12,
    100,
    27,
    10,
    3,
    1,
    1,
]
MLPERF_ROWS = [
    40000000,
    39060,
    17295,
    7424,
    20265,
    3,
    7122,
    1543,
    63,
    40000000,
    3067956,
    405282,
    10,
    2209,
    11938,
    155,
    4,
    976,
    14,
    40000000,
    40000000,
    40000000,
    590152,
    12973,
    108,
    36,
]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--batch-size", type=int, default=None, help="per-GPU batch (default 65536 / world)"
    )
    p.add_argument("--global-batch", type=int, default=65536)
    p.add_argument("--rows-cap", type=int, default=10_000_000, help="cap on rows per table")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast for the dense part")
    p.add_argument("--tf32", action="store_true", help="allow TF32 matmuls")
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--n-batches", type=int, default=4, help="distinct host batches to cycle")
    p.add_argument(
        "--data",
        choices=("planted", "uniform"),
        default="planted",
        help="planted: the exact batches rocmtrain's recipe trains on with data.cache_batches "
        "(rocmtrain.data's synthetic generator, seed --seed; only the data, no rocmtrain "
        "training code); uniform: uniform ids, random labels",
    )
    p.add_argument("--seed", type=int, default=1234, help="the recipe's seed (planted data)")
    p.add_argument("--out", default=None, help="write results JSON here (rank 0)")
    p.add_argument("--sync-every", type=int, default=5, help="steps per timed window")
    p.add_argument("--small-dense", action="store_true", help="tiny MLPs/DCN (CPU smoke test)")
    p.add_argument("--cpu", action="store_true", help="CPU + gloo (smoke test of the script)")
    p.add_argument(
        "--profile-dir",
        default=None,
        help="torch.profiler over steps 6-8 (wait 3, warm-up 2, 3 recorded; rank 0): writes "
        "top_kernels.md and step_timeline.json (wall vs GPU-busy time, blocking syncs) here, "
        "the same tables as rocmtrain's profile=true",
    )
    return p.parse_args()


def make_batches(n: int, batch: int, rows: list[int], seed: int, *, pin: bool = True):
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys = [f"cat_{i}" for i in range(len(rows))]
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        values, lengths = [], []
        for r, h in zip(rows, MLPERF_MULTI_HOT, strict=True):
            values.append(torch.randint(0, r, (batch * h,), generator=g))
            lengths.append(torch.full((batch,), h, dtype=torch.int32))
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=keys, values=torch.cat(values), lengths=torch.cat(lengths)
        )
        dense = torch.randn(batch, 13, generator=g)
        labels = (torch.rand(batch, generator=g) < 0.25).float()
        b = Batch(dense_features=dense, sparse_features=kjt, labels=labels)
        out.append(b.pin_memory() if pin else b)
    return out


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def planted_batches(n: int, batch: int, rows: list[int], *, args, rank: int, world: int):
    """Blocks 0..n-1 of this rank's training split, as rocmtrain's SyntheticSource caches them."""
    from rocmtrain.config.data import DataConfig
    from rocmtrain.data.synthetic import synthetic_factory

    cfg = DataConfig(batch_size=batch, num_train_batches=n, num_val_batches=1, cache_batches=n)
    factory = synthetic_factory(
        cfg, rows=rows, multi_hot=MLPERF_MULTI_HOT, num_dense=13, seed=args.seed
    )
    source = factory("train", rank, world)
    return [source.block(b) for b in range(n)]


def _profiler(args: argparse.Namespace, device: torch.device):
    """torch.profiler over steps 6-8; the report uses rocmtrain's profiling tables."""
    from pathlib import Path

    from torch.profiler import ProfilerActivity, profile, schedule

    from rocmtrain.diagnostics.profiling import step_timeline, timeline_markdown, top_table

    out = Path(args.profile_dir)
    gpu = device.type == "cuda"

    def ready(prof) -> None:
        out.mkdir(parents=True, exist_ok=True)
        timeline = step_timeline(list(prof.events()))
        (out / "step_timeline.json").write_text(json.dumps(timeline, indent=2))
        md, _ = top_table(prof, k=30, gpu=gpu)
        (out / "top_kernels.md").write_text(
            "# Plain TorchRec anchor, rank 0, 3 recorded steps\n\n"
            + timeline_markdown(timeline)
            + "\n"
            + md
        )

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    prof = profile(
        activities=activities,
        schedule=schedule(wait=3, warmup=2, active=3, repeat=1),
        on_trace_ready=ready,
    )
    prof.start()
    return prof


def main() -> None:
    args = parse_args()
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.models.dlrm import DLRM_DCN, DLRMTrain
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    if args.cpu:
        device, backend, pg_kwargs = torch.device("cpu"), "gloo", {}
    else:
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
        pg_kwargs = {"device_id": device}
    if world > 1 or "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, **pg_kwargs)
    else:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29512")
        dist.init_process_group(backend, rank=0, world_size=1, **pg_kwargs)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    batch = args.batch_size or args.global_batch // world

    rows = [min(r, args.rows_cap) for r in MLPERF_ROWS]
    tables = [
        EmbeddingBagConfig(
            name=f"t_cat_{i}", embedding_dim=args.dim, num_embeddings=r, feature_names=[f"cat_{i}"]
        )
        for i, r in enumerate(rows)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = DLRMTrain(
        DLRM_DCN(
            embedding_bag_collection=ebc,
            dense_in_features=13,
            dense_arch_layer_sizes=[32, 16, args.dim] if args.small_dense else [512, 256, args.dim],
            over_arch_layer_sizes=[32, 16, 1] if args.small_dense else [1024, 1024, 512, 256, 1],
            dcn_num_layers=3,
            dcn_low_rank_dim=16 if args.small_dense else 512,
            dense_device=device,
        )
    )
    apply_optimizer_in_backward(
        RowWiseAdagrad, model.model.sparse_arch.parameters(), {"lr": args.lr, "eps": 1e-8}
    )
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device=device.type, local_world_size=world)
    )
    plan = planner.collective_plan(model, None, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(module=model, device=device, plan=plan)
    dense_opt = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=args.lr, eps=1e-8),
    )
    _ = EmbOptimType  # imported to fail early when fbgemm_gpu is missing
    if args.data == "planted":
        batches = planted_batches(args.n_batches, batch, rows, args=args, rank=rank, world=world)
        batches = [b if args.cpu else b.pin_memory() for b in batches]
    else:
        batches = make_batches(args.n_batches, batch, rows, seed=1234 + rank, pin=not args.cpu)

    def cycle():
        while True:
            yield from batches

    it = cycle()
    pipeline = TrainPipelineSparseDist(dmp, dense_opt, device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    # windows of `sync_every` steps, synced only at window ends (per-step syncs would stall the
    # pipeline's look-ahead); median window rate, like rocmtrain's ThroughputCallback
    step_ms: list[float] = []
    losses: list[torch.Tensor] = []
    prof = _profiler(args, device) if args.profile_dir and rank == 0 else None
    sync()
    t0 = time.perf_counter()
    for step in range(args.warmup + args.steps):
        with amp:
            out = pipeline.progress(it)  # DLRMTrain: (loss, logits, labels), detached
        if prof is not None:
            prof.step()
            if step == 8:  # window done (wait 3 + warm-up 2 + 3 recorded), inside the warm-up
                prof.stop()
                prof = None
        loss = out[0]
        if step % 10 == 0:
            losses.append(loss.detach().float())
        done = step + 1 - args.warmup
        if done == 0 or (done > 0 and done % args.sync_every == 0):
            sync()
            now = time.perf_counter()
            if done > 0:
                step_ms.append((now - t0) * 1e3 / args.sync_every)
            t0 = now
    if prof is not None:  # a run shorter than the window: flush what was recorded
        prof.stop()
    med = statistics.median(step_ms)
    res = {
        "provider": "plain_torchrec",
        "world_size": world,
        "batch_per_gpu": batch,
        "global_batch": batch * world,
        "bf16": args.bf16,
        "tf32": args.tf32,
        "rows_cap": args.rows_cap,
        "data": args.data,
        "median_step_ms": med,
        "samples_per_s": batch * world / (med / 1e3),
        "median_step_ms_windows": len(step_ms),
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if not args.cpu else 0.0,
        "loss_every_10_steps": [float(x) for x in losses],
        "torch": torch.__version__,
        "torchrec": _version("torchrec"),
        "fbgemm_gpu": _version("fbgemm_gpu") or _version("fbgemm-gpu-cpu"),
        "gpu": torch.cuda.get_device_name(device) if not args.cpu else "cpu",
    }
    if rank == 0:
        print(json.dumps(res, indent=2))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(res, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
