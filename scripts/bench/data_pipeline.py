"""The data pipeline alone (no model): batches/s a recipe's DataModule delivers to the device.

    python scripts/bench/data_pipeline.py recipe=dlrm_dcnv2_h200 [--batches 50] [--device cuda]
    python scripts/bench/data_pipeline.py recipe=dlrm_cpu --device cpu

Composes the recipe as ``python -m rocmtrain`` does (Hydra overrides after the options), builds
rank 0's training loader of ``trainer.devices`` ranks with the workers and pinning the recipe
resolves to on that device, and times ``--batches`` batches after ``--warmup``, each one on the
device (a GPU batch is waited for with a stream sync, a host batch copied over). Prints one JSON
line: batches/s, samples/s, ms per batch, and how the loader was set up. Compare with the
recipe's step time (``<run_dir>/throughput.json``): a pipeline that is not several times faster
than the step starves the GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch


def compose(overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from rocmtrain.config.schema import configs_dir, register_configs, to_run_config

    register_configs()
    with initialize_config_dir(config_dir=str(configs_dir()), version_base="1.3"):
        cfg = hydra_compose("rocmtrain", overrides=["run_dir=unused", *overrides])
    return to_run_config(cfg)


class _Device:
    """What a DataModule reads of its trainer: the strategy's device and the ranks per node."""

    def __init__(self, device: torch.device, ranks: int) -> None:
        self.strategy = type("S", (), {"root_device": device})()
        self.num_devices = ranks


def pipeline_rate(cfg: Any, device: torch.device, *, batches: int, warmup: int = 3) -> dict:
    """Rank 0's training batches/s for ``cfg`` on ``device`` (see the module docstring)."""
    from rocmtrain.data import build_datamodule

    ranks = max(1, int(cfg.trainer.devices)) if str(cfg.trainer.devices).isdigit() else 1
    m = cfg.model
    dm = build_datamodule(
        cfg.data,
        num_embeddings_per_feature=m.table_rows(),
        multi_hot_sizes=m.multi_hot_sizes,
        num_dense=m.num_dense_features,
        seed=cfg.seed,
        rank=0,
        world_size=ranks,
    )
    dm.trainer = _Device(device, ranks)
    dm.setup()
    loader = dm.train_dataloader()

    def endless():
        while True:  # the next epoch when one ends
            yield from loader

    it = endless()

    def one() -> None:
        batch = next(it).to(device, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        return batch

    for _ in range(warmup):
        one()
    start = time.perf_counter()
    for _ in range(batches):
        one()
    seconds = time.perf_counter() - start
    return {
        "batches_per_s": batches / seconds,
        "samples_per_s": batches * cfg.data.batch_size / seconds,
        "ms_per_batch": 1e3 * seconds / batches,
        "batch_size": cfg.data.batch_size,
        "ranks": ranks,
        "device": str(device),
        "generated_on": str(getattr(dm.train_source, "device", "host")),
        "num_workers": loader.num_workers,
        "pin_memory": loader.pin_memory,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--batches", type=int, default=50)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=None, help="also write the JSON here")
    args, overrides = p.parse_known_args(argv)
    cfg = compose(overrides)
    doc = pipeline_rate(cfg, torch.device(args.device), batches=args.batches, warmup=args.warmup)
    doc["overrides"] = overrides
    print(json.dumps(doc))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
