"""Tiny Lightning fit with rocmtrain's device monitor (+ profiler): check the monitoring on a machine.

    python scripts/profile/monitor_smoke.py --out /tmp/monitor_smoke            # GPU if visible
    python scripts/profile/monitor_smoke.py --out /tmp/m --steps 300 --profile  # + torch.profiler

Writes into --out: monitor/step_stats.json, monitor/devices.csv (GPU), monitor/monitor.png,
logs/version_0/metrics.csv and, with --profile, profile/trace_rank0.json + top_kernels_rank0.md;
prints the step-time statistics, the sampler used and the last device sample of each GPU.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from rocmtrain import platform
from rocmtrain.callbacks import monitor_callbacks
from rocmtrain.callbacks.monitor import DeviceMonitor
from rocmtrain.config.monitor import MonitorConfig


class MLP(pl.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1024, width), nn.ReLU(), nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--width", type=int, default=8192, help="hidden width (GPU load)")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    gpu = platform.has_gpu()
    width = args.width if gpu else 256
    cfg = MonitorConfig(interval_seconds=0.5, log_every_n_steps=20, profiler_wait_steps=20)
    callbacks = monitor_callbacks(cfg, args.out, profile=args.profile)
    batch = 4096 if gpu else 64
    ds = TensorDataset(torch.randn(batch * 8, 1024), torch.randn(batch * 8))
    trainer = pl.Trainer(
        max_steps=args.steps, accelerator="gpu" if gpu else "cpu", devices=1, callbacks=callbacks,
        logger=pl.loggers.CSVLogger(args.out, name="logs", version=0),
        enable_checkpointing=False, enable_progress_bar=False, log_every_n_steps=20,
    )  # fmt: skip
    trainer.fit(MLP(width), DataLoader(ds, batch_size=batch, shuffle=True))
    mon = next(c for c in callbacks if isinstance(c, DeviceMonitor))
    stats = json.loads((args.out / "monitor/step_stats.json").read_text())
    print(f"device: {platform.device_info(0)}")
    print(f"sampler: {stats['sampler']}")
    print("step time: " + ", ".join(f"{k}={v:.3f}" for k, v in stats["stats"].items()))
    for i, s in sorted(mon.latest().items()):
        print(f"last sample GPU {i}: {s}")
    for p in sorted(args.out.rglob("*")):
        if p.is_file():
            print(f"wrote {p} ({p.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
