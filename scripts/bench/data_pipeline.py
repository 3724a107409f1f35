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

Variants in interleaved rounds (``--variant NAME:override,override`` repeated, ``--rounds N``):
each round builds every variant's loader afresh and times it; prints one JSON line per variant
and round, then per variant the median [min-max] of batches/s and of the ids delivered (GB/s of
the batch's id buffer as handed out: int64 when built in loader processes, int32 when read by
``data.read_threads``). ``--as-device cuda`` on a machine without a GPU builds the loader as a
GPU run would (workers, pinning and reader threads chosen for a GPU; pinning itself needs a GPU)
and stops at the host batch. The multi-hot file path as the recipe ships it, old vs new::

    scripts/bench/make_multihot_set.sh /tmp/sets --only multihot
    python scripts/bench/data_pipeline.py --as-device cuda --rounds 5 --batches 20 \
      --variant processes:data.read_threads=0 --variant threads1:data.read_threads=1 \
      --variant threads2:data.read_threads=2 recipe=dlrm_dcnv2_h200 data=criteo_multihot \
      data.path=/tmp/sets/multihot data.days=[0,1,2] model.max_rows_per_table=10000000
"""

from __future__ import annotations

import argparse
import gc
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


def pipeline_rate(
    cfg: Any, device: torch.device, *, batches: int, warmup: int = 3, host_only: bool = False
) -> dict:
    """Rank 0's training batches/s for ``cfg`` on ``device`` (see the module docstring);
    ``host_only``: time the host batches, copy nothing (``device`` is what the loader is built
    for)."""
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

    ids_bytes = [0]

    def one() -> None:
        batch = next(it)
        ids_bytes[0] += batch.sparse_features.values().nbytes
        if host_only:
            return batch
        batch = batch.to(device, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        return batch

    for _ in range(warmup):
        one()
    ids_bytes[0] = 0
    start = time.perf_counter()
    for _ in range(batches):
        one()
    seconds = time.perf_counter() - start
    reader = getattr(dm.train_source, "reader", None)
    if reader is not None:
        reader.close()
    return {
        "ids_gb_per_s": ids_bytes[0] / seconds / 1e9,
        "read_threads": reader.threads if reader is not None else 0,
        "pinned": bool(reader.pin) if reader is not None else loader.pin_memory,
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
    p.add_argument(
        "--as-device",
        default=None,
        help="build the loader for this device (cuda on a "
        "machine without one: the host batches are timed, nothing is copied)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:OVERRIDES",
        help="a variant (comma-separated overrides added to the common ones)",
    )
    p.add_argument("--rounds", type=int, default=1)
    args, overrides = p.parse_known_args(argv)
    device = torch.device(args.as_device or args.device)
    host_only = args.as_device is not None and (
        device.type != "cuda" or not torch.cuda.is_available()
    )
    variants = [v.split(":", 1) for v in args.variant] or [["run", ""]]
    rows: list[dict] = []
    for rnd in range(args.rounds):
        for name, extra in variants:
            own = [o for o in extra.split(",") if o]
            doc = pipeline_rate(
                compose([*overrides, *own]), device, batches=args.batches, warmup=args.warmup,
                host_only=host_only,
            )  # fmt: skip
            doc.update(
                variant=name, round=rnd + 1, host_only=host_only, overrides=[*overrides, *own]
            )
            rows.append(doc)
            print(json.dumps(doc), flush=True)
            gc.collect()  # the variant's loader and arrays go before the next one's
    summary = {name: _spread([r for r in rows if r["variant"] == name]) for name, _ in variants}
    if args.rounds > 1 or len(variants) > 1:
        for name, s in summary.items():
            print(
                f"{name}: {s['batches_per_s']} batches/s, {s['ids_gb_per_s']} GB/s of ids "
                f"(median [min-max] of {s['rounds']} rounds)"
            )
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    return 0


def _spread(rows: list[dict]) -> dict:
    import statistics

    def fmt(key: str) -> str:
        vals = [r[key] for r in rows]
        return f"{statistics.median(vals):.2f} [{min(vals):.2f}-{max(vals):.2f}]"

    return {"rounds": len(rows), "batches_per_s": fmt("batches_per_s"),
            "ids_gb_per_s": fmt("ids_gb_per_s")}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
