"""Cost of the hang watchdog per training step (heartbeats + monitor thread), CPU or GPU.

What it measures (one process, a 1-rank process group so the real TCPStore channel is used):

1. ``beat()`` / ``step_done()`` in ns (the training thread's only work per phase).
2. One monitor tick (publish own heartbeat, check for a declaration, read all heartbeats, pid
   checks) in us, and the share of one core it takes at the configured poll interval.
3. End to end through Lightning: the same small DLRM-like model (EmbeddingBag tables + MLPs, like
   the CPU recipe's dlrm_small) trained by ``pl.Trainer`` with and without
   ``rocmtrain.faults.watchdog.build_callbacks`` (watchdog + two-phase timeouts + preemption + hints),
   interleaved A/B/A/B rounds; median step time per arm and the overhead in % of the step time.
   An A/A pair (both arms without the watchdog) gives the noise floor of this machine.

Run::

    python scripts/bench/bench_watchdog.py                    # CPU, ~1 min
    python scripts/bench/bench_watchdog.py --device cuda      # GPU (H200 / MI300X), nccl 1-rank group
    python scripts/bench/bench_watchdog.py --json out.json    # also write the numbers
    python scripts/bench/bench_watchdog.py --hang-demo --device cuda --out DIR   # 2 GPUs, NCCL

The target: overhead < 1 % of the step time.

``--hang-demo`` checks the NCCL path on real GPUs (the CPU tests cover gloo): 2 ranks (one GPU
each, NCCL, flight recorder on), rank 1 stalls before an all_reduce at step 20; expected: both ranks
exit 75 within hang timeout + 10 s, ``DIR/hang_report.json`` names rank 1 at step 20, and the
flight-recorder dumps hold ``nccl:all_reduce`` entries. Prints a verdict line and exits 0 if so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
from datetime import timedelta
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch import nn

from rocmtrain.config.rccl import RcclConfig
from rocmtrain.config.watchdog import WatchdogConfig
from rocmtrain.faults.watchdog import Watchdog, build_callbacks


class TinyDLRM(pl.LightningModule):
    """EmbeddingBag tables + bottom/top MLPs, sized like the CPU recipe's dlrm_small."""

    def __init__(self, *, tables: int, rows: int, dim: int, dense: int, batch: int) -> None:
        super().__init__()
        self.bags = nn.ModuleList(
            nn.EmbeddingBag(rows, dim, mode="sum", sparse=True) for _ in range(tables)
        )
        self.bottom = nn.Sequential(
            nn.Linear(dense, 512), nn.ReLU(), nn.Linear(512, dim), nn.ReLU()
        )
        self.top = nn.Sequential(nn.Linear(dim * (tables + 1), 512), nn.ReLU(), nn.Linear(512, 1))
        self.rows, self.dense, self.batch, self.tables = rows, dense, batch, tables
        self.step_ms: list[float] = []
        self._t0 = 0.0

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(batch_idx)
        x = torch.randn(self.batch, self.dense, generator=g).to(self.device)
        idx = torch.randint(0, self.rows, (self.tables, self.batch * 4), generator=g).to(
            self.device
        )
        offs = torch.arange(0, self.batch * 4, 4, device=self.device)
        feats = [self.bottom(x)] + [bag(idx[i], offs) for i, bag in enumerate(self.bags)]
        logit = self.top(torch.cat(feats, dim=1)).squeeze(1)
        y = (x[:, 0] > 0).float()
        return nn.functional.binary_cross_entropy_with_logits(logit, y)

    def on_train_batch_start(self, batch: object, batch_idx: int) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, outputs: object, batch: object, batch_idx: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.step_ms.append((time.perf_counter() - self._t0) * 1e3)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.zeros(10**6), batch_size=1)


def micro(cfg: WatchdogConfig, run_dir: Path) -> dict[str, float]:
    wd = Watchdog(cfg, run_dir=run_dir)
    n = 200_000
    beat = timeit.timeit(lambda: wd.beat("forward"), number=n) / n * 1e9
    step = timeit.timeit(wd.step_done, number=n) / n * 1e9
    wd.start()
    wd._stop.set()  # measure ticks by hand, not from the thread
    ticks = [timeit.timeit(wd._tick, number=1) * 1e6 for _ in range(200)]
    wd.finish()
    tick_us = statistics.median(ticks)
    return {
        "beat_ns": beat,
        "step_done_ns": step,
        "per_step_us_8_beats": (7 * beat + step) / 1e3,
        "tick_us": tick_us,
        "monitor_core_share_pct": tick_us / 1e6 / cfg.poll_interval_seconds * 100,
    }


def run_arm(args: argparse.Namespace, with_watchdog: bool, run_dir: Path) -> list[float]:
    model = TinyDLRM(tables=args.tables, rows=args.rows, dim=args.dim, dense=13, batch=args.batch)
    wcfg = WatchdogConfig(
        poll_interval_seconds=args.poll, learn_floor_seconds=max(60.0, 2 * args.poll)
    )
    callbacks = build_callbacks(wcfg, RcclConfig(), run_dir) if with_watchdog else []
    trainer = pl.Trainer(
        accelerator="gpu" if args.device == "cuda" else "cpu",
        devices=1,
        max_steps=args.steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(run_dir),
    )
    trainer.fit(model)
    return model.step_ms[args.warmup :]


def _demo_rank(rank: int, out: str, device: str, port: int) -> None:
    from rocmtrain.comms.env import apply_env

    apply_env({"TORCH_FR_BUFFER_SIZE": "2000"}, source="bench_watchdog --hang-demo")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(rank)
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=2, timeout=timedelta(seconds=120))
    cfg = WatchdogConfig(
        hang_timeout_seconds=5.0,
        first_step_timeout_seconds=60.0,
        poll_interval_seconds=0.25,
        learn_timeout_from_step_times=False,
        collect_timeout_seconds=5.0,
    )
    wd = Watchdog(cfg, run_dir=out).start()
    t = torch.ones(1 << 20, device=device)
    with wd.guard():
        for step in range(10_000):
            wd.beat("forward", step=step)
            if rank == 1 and step == 20:
                Path(out, "stall_started").write_text(str(time.time()))
                time.sleep(600)
            wd.beat("all_reduce", collective="all_reduce")
            dist.all_reduce(t)
            if device == "cuda":
                torch.cuda.synchronize()
            wd.step_done()


def hang_demo(device: str, out: Path) -> int:
    import socket

    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_demo_rank, args=(r, str(out), device, port)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    codes = [p.exitcode for p in procs]
    report = json.loads((out / "hang_report.json").read_text())
    took = time.time() - float((out / "stall_started").read_text())
    fr = [e.get("last", {}).get("profiling_name") for e in report["ranks"]]
    ok = codes == [75, 75] and report["stuck_ranks"] == [1] and report["stuck_steps"] == {"1": 20}
    ok = ok and took <= 5.0 + 10 and all(name and "all_reduce" in name for name in fr)
    print(
        json.dumps(
            {
                "exit_codes": codes,
                "stuck": report["stuck_ranks"],
                "steps": report["stuck_steps"],
                "seconds_stall_to_report": round(took, 1),
                "flight_recorder_last": fr,
            }
        )
    )
    print(f"hang-demo ({device}): {'PASS' if ok else 'FAIL'}; report: {out / 'hang_report.txt'}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--steps", type=int, default=150, help="steps per arm and round")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3, help="A/B rounds (interleaved)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--poll", type=float, default=1.0, help="watchdog.poll_interval_seconds")
    p.add_argument("--json", type=Path)
    p.add_argument(
        "--hang-demo", action="store_true", help="2-rank stall demo (NCCL with --device cuda)"
    )
    p.add_argument("--out", type=Path, default=Path("hang_demo"), help="--hang-demo run dir")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_watchdog: --device cuda but no GPU is visible", file=sys.stderr)
        return 2
    if args.hang_demo:
        if args.device == "cuda" and torch.cuda.device_count() < 2:
            print("bench_watchdog: --hang-demo --device cuda needs 2 GPUs", file=sys.stderr)
            return 2
        return hang_demo(args.device, args.out)
    torch.manual_seed(0)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29581")
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, rank=0, world_size=1, timeout=timedelta(seconds=60))
    pl.seed_everything(0, verbose=False)

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        m = micro(WatchdogConfig(poll_interval_seconds=args.poll), run_dir)
        arms: dict[str, list[float]] = {"off": [], "on": [], "off_again": []}
        for _ in range(args.rounds):
            arms["off"] += run_arm(args, False, run_dir)
            arms["on"] += run_arm(args, True, run_dir)
            arms["off_again"] += run_arm(args, False, run_dir)
    med = {k: statistics.median(v) for k, v in arms.items()}
    base = (med["off"] + med["off_again"]) / 2
    result = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        **{k: round(v, 4) for k, v in m.items()},
        "step_ms_median_off": round(med["off"], 3),
        "step_ms_median_on": round(med["on"], 3),
        "step_ms_median_off_again": round(med["off_again"], 3),
        "overhead_pct": round((med["on"] - base) / base * 100, 3),
        "noise_pct_off_vs_off": round(abs(med["off"] - med["off_again"]) / base * 100, 3),
        "heartbeat_cost_pct_of_step": round(m["per_step_us_8_beats"] / 1e3 / base * 100, 5),
        "steps_per_arm": len(arms["on"]),
    }
    for k, v in result.items():
        print(f"{k:>30}: {v}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
