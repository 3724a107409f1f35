"""Ranks of a plain (no Lightning) gloo training loop under the watchdog, as real processes.

The processes come from a ``forkserver`` that has imported torch + rocmtrain once (importing
pytorch_lightning costs ~10 s of CPU per process; spawning 3 fresh interpreters per test would
dominate the suite). Each rank is a separate OS process with its own gloo group and TCPStore client.

Modes: ``stall`` (``stall_rank`` sleeps before the all_reduce of ``stall_step`` while the others
wait inside it), ``run`` (``steps`` steps with jittered durations, then a clean exit), ``forever``
(steps until killed; touches ``ready_rank<r>`` after 5 steps). Each rank logs to ``log_rank<r>.txt``.
Also runnable by hand: ``python tests/faults/wd_worker.py --world 3 --mode stall --run-dir /tmp/x``.
"""

from __future__ import annotations

import argparse
import random
import time
from datetime import timedelta
from pathlib import Path


def stall_here(seconds: float) -> None:
    """The stalled rank's stack dump must show this function."""
    time.sleep(seconds)


def rank_main(rank: int, world: int, port: int, run_dir: str, opts: dict) -> None:
    """One rank (the target of each process)."""
    import os
    import sys

    log = open(Path(run_dir) / f"log_rank{rank}.txt", "w")  # noqa: SIM115 - lives as long as the process
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    a = argparse.Namespace(**{**DEFAULTS, **opts})

    from rocmtrain.comms.env import apply_env

    apply_env({"TORCH_FR_BUFFER_SIZE": "200"}, source="watchdog test worker")

    import torch
    import torch.distributed as dist

    from rocmtrain.config.watchdog import WatchdogConfig
    from rocmtrain.faults.watchdog import Watchdog

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    cfg = WatchdogConfig(
        hang_timeout_seconds=a.timeout,
        first_step_timeout_seconds=max(a.timeout, 30.0),
        poll_interval_seconds=a.poll,
        learn_timeout_from_step_times=a.learn,
        learn_floor_seconds=a.floor,
        learn_min_steps=20,
        collect_timeout_seconds=3.0,
        heartbeat_channel=a.channel,
        monitor_every_rank=a.every,
    )
    out = Path(run_dir)
    wd = Watchdog(cfg, run_dir=out).start()
    rng = random.Random(rank)
    t = torch.ones(256)
    step = 0
    with wd.guard():
        while a.mode == "forever" or step < a.steps:
            wd.beat("forward", step=step)
            time.sleep(rng.uniform(0, 2 * a.step_ms) / 1000)
            if a.hiccup_every and step % a.hiccup_every == a.hiccup_every - 1:
                time.sleep(a.hiccup_s)
            if a.mode == "stall" and rank == a.stall_rank and step == a.stall_step:
                (out / "stall_started").write_text(str(time.time()))
                stall_here(600)
            wd.beat("all_reduce", collective="all_reduce")
            dist.all_reduce(t)
            wd.step_done()
            step += 1
            if a.mode == "forever" and step == 5:
                (out / f"ready_rank{rank}").touch()
    (out / f"done_rank{rank}").write_text(str(step))
    dist.destroy_process_group()
    log.flush()


DEFAULTS = dict(
    mode="run",
    timeout=3.0,
    poll=0.25,
    learn=False,
    floor=1.0,
    steps=500,
    stall_rank=1,
    stall_step=30,
    step_ms=5.0,
    hiccup_every=0,
    hiccup_s=0.0,
    channel="tcpstore",
    every=False,
)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def context():  # noqa: ANN201 - multiprocessing context
    """The forkserver context, preloaded with torch + rocmtrain + this module."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["torch", "torch.distributed", "rocmtrain.faults.watchdog", __name__]
    )
    return ctx


def _spawn(target, world: int, run_dir: Path, opts: dict):  # noqa: ANN001, ANN202
    """Start ``world`` processes of ``target(rank, world, port, run_dir, opts)`` on one free port;
    returns them (already started)."""
    ctx = context()
    port = free_port()
    procs = [
        ctx.Process(target=target, args=(r, world, port, str(run_dir), opts)) for r in range(world)
    ]
    for p in procs:
        p.start()
    return procs


def start_ranks(world: int, run_dir: Path, **opts):  # noqa: ANN201 - list of Process
    """Start ``world`` rank processes; returns them (already started)."""
    return _spawn(rank_main, world, run_dir, opts)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--mode", default="stall")
    ap.add_argument("--stall-rank", type=int, default=1)
    ns = ap.parse_args()
    Path(ns.run_dir).mkdir(parents=True, exist_ok=True)
    ps = start_ranks(ns.world, Path(ns.run_dir), mode=ns.mode, stall_rank=ns.stall_rank)
    for p in ps:
        p.join()
    print([p.exitcode for p in ps])


def timeouts_main(rank: int, world: int, port: int, run_dir: str, opts: dict) -> None:
    """Two-phase timeouts on gloo: a 3 s straggler is fine under the init timeout; after
    ``enter_steady_state`` (train timeout 1.5 s) the same straggler makes rank 0's all_reduce fail.
    Rank 0 writes what happened to ``timeouts.json``."""
    import json
    import os
    import sys

    log = open(Path(run_dir) / f"log_rank{rank}.txt", "w")  # noqa: SIM115
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    import torch
    import torch.distributed as dist

    from rocmtrain.config.rccl import RcclConfig
    from rocmtrain.faults.hints import hint_for_exception
    from rocmtrain.faults.timeouts import enter_steady_state

    rccl = RcclConfig(init_timeout_seconds=30.0, train_timeout_seconds=1.5)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=rccl.init_timeout_seconds),
    )
    t = torch.ones(8)
    out: dict = {}
    if rank == 1:
        time.sleep(3.0)  # straggler during "init / first step": within the long timeout
    dist.all_reduce(t)
    out["phase1_ok"] = t.tolist() == [float(world)] * 8
    enter_steady_state(rccl)
    if rank == 1:
        time.sleep(6.0)  # the same kind of straggler in steady state
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        out["phase2"] = "completed"
    except Exception as e:  # noqa: BLE001 - the behaviour under test
        h = hint_for_exception(e)
        out.update(phase2="raised", message=str(e)[:300], hint=h.kind if h else None)
    out["phase2_seconds"] = time.monotonic() - start
    if rank == 0:
        (Path(run_dir) / "timeouts.json").write_text(json.dumps(out))
    log.flush()
    os._exit(0)  # the group is broken by design: do not wait for destroy


def start_timeouts(run_dir: Path):  # noqa: ANN201
    return _spawn(timeouts_main, 2, run_dir, {})


def lightning_main(rank: int, world: int, port: int, run_dir: str, opts: dict) -> None:
    """A 2-rank Lightning DDP fit (gloo) with ``fault_callbacks``; ``opts['fault']``:
    ``stall`` (rank ``fault_rank`` sleeps inside training_step of step ``fault_step``) or
    ``raise`` (it raises a real-format HIP OOM error there)."""
    import os
    import sys

    log = open(Path(run_dir) / f"log_rank{rank}.txt", "w")  # noqa: SIM115
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
    )
    from rocmtrain.comms.env import apply_env

    apply_env({"TORCH_FR_BUFFER_SIZE": "200"}, source="watchdog test worker")
    import pytorch_lightning as pl
    import torch
    from torch import nn

    from rocmtrain.config.rccl import RcclConfig
    from rocmtrain.config.watchdog import WatchdogConfig
    from rocmtrain.faults.watchdog import fault_callbacks

    torch.set_num_threads(1)
    fault, fault_rank, fault_step = (
        opts["fault"],
        opts.get("fault_rank", 1),
        opts.get("fault_step", 5),
    )

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(8, 1)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            if self.global_rank == fault_rank and self.global_step == fault_step:
                if fault == "stall":
                    stall_here(600)
                raise RuntimeError(OOM_TEXT)
            return self.net(batch).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> torch.utils.data.DataLoader:
            return torch.utils.data.DataLoader(torch.randn(400, 8), batch_size=4)

    wcfg = WatchdogConfig(
        hang_timeout_seconds=3.0,
        first_step_timeout_seconds=30.0,
        poll_interval_seconds=0.25,
        learn_timeout_from_step_times=False,
        collect_timeout_seconds=3.0,
    )
    rccl = RcclConfig(init_timeout_seconds=60.0, train_timeout_seconds=30.0)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp",
        max_steps=50,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=fault_callbacks(wcfg, rccl, Path(run_dir)),
        default_root_dir=run_dir,
    )
    trainer.fit(Tiny())
    log.flush()


#: https://github.com/kyuz0/amd-strix-halo-image-video-toolboxes/issues/3 (as published)
OOM_TEXT = (
    "HIP out of memory. Tried to allocate 3.31 GiB. GPU 0 has a total capacity of 128.00 GiB of "
    "which 780.24 MiB is free. Of the allocated memory 57.70 GiB is allocated by PyTorch, and "
    "75.82 MiB is reserved by PyTorch but unallocated."
)


def start_lightning(world: int, run_dir: Path, **opts):  # noqa: ANN201
    return _spawn(lightning_main, world, run_dir, opts)


def ckpt_main(rank: int, world: int, port: int, run_dir: str, opts: dict) -> None:
    """``write``: atomic checkpoints of step 1 (small) then step 2 (large, so the test can SIGKILL
    the job mid-write) with ``rocmtrain.checkpoint.write_sharded``. ``load``: what a resumed job
    does — ``find_resume`` + ``read_sharded`` — and record what it got in ``loaded_rank<r>.json``."""
    import json
    import os
    import sys

    log = open(Path(run_dir) / f"log_{opts['mode']}_rank{rank}.txt", "w")  # noqa: SIM115
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    import torch
    import torch.distributed as dist

    from rocmtrain import checkpoint as ckpt

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    root = Path(run_dir) / "ckpts"
    big = opts["numel"]
    if opts["mode"] == "write":
        for step, numel in ((1, 1024), (2, big)):
            sharded = {
                "w": torch.full((numel,), float(step)),
                f"r{rank}": torch.full((4,), rank + step * 10.0),
            }
            per_rank = {"global_step": step, "epoch": 0, "rank": rank}
            ckpt.write_sharded(
                root / ckpt.checkpoint_name(step),
                sharded=sharded,
                per_rank=per_rank,
                rank=rank,
                world_size=world,
                barrier=dist.barrier,
            )
        (Path(run_dir) / f"wrote_all_rank{rank}").touch()
    else:
        path = ckpt.find_resume(root)
        sharded = {"w": torch.zeros(1024), f"r{rank}": torch.zeros(4)}
        own = ckpt.read_sharded(path, sharded=sharded, rank=rank)
        out = {
            "path": path.name,
            "w": sorted(set(sharded["w"].tolist())),
            "mine": sharded[f"r{rank}"].tolist(),
            "own": own,
        }
        (Path(run_dir) / f"loaded_rank{rank}.json").write_text(json.dumps(out))
    log.flush()
    dist.destroy_process_group()


def start_ckpt(world: int, run_dir: Path, **opts):  # noqa: ANN201
    return _spawn(ckpt_main, world, run_dir, opts)
