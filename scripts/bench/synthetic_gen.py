"""Device time of one synthetic MLPerf-shaped batch (the recipe's data, made on the GPU every step):
what is made from the draws eager vs compiled (``PlantedSignal._fused``), interleaved rounds.

Both make the batch from the same generator seed; the ids must be identical and the hidden
logits equal to fp64 rounding before any timing. Each round times ``--batches`` back-to-back
batches with CUDA events (median per batch), the two ways in rotating order.

    PYTHONPATH=/tmp/site python3 scripts/bench/synthetic_gen.py --out $OUT/synthetic_gen.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from rocmtrain.config.data import DataConfig
from rocmtrain.data.batch import generator
from rocmtrain.data.synthetic import synthetic_factory

# the recipe's model config (configs/model/dlrm_dcnv2_mlperf.yaml), rows capped at 10 M
ROWS = [40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
        2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36]  # fmt: skip
MULTI_HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=65536)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    device = torch.device("cuda", torch.cuda.current_device())
    cfg = DataConfig(batch_size=args.batch_size, num_train_batches=4, num_val_batches=1)
    rows = [min(r, 10_000_000) for r in ROWS]
    signal = synthetic_factory(cfg, rows=rows, multi_hot=MULTI_HOT, num_dense=13, seed=1234)(
        "train", 0, 1, device
    ).signal
    compiled = signal._fused(device)
    ways = {"eager": signal._made_from_draws, "compiled": compiled}

    def make(fn, seed: int):
        z, u = signal._draws(args.batch_size, generator(1234, 1, seed, device=device))
        return fn(u, z)

    a, b = make(ways["eager"], 0), make(ways["compiled"], 0)
    assert torch.equal(a[0], b[0]), "ids differ"
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=1e-12)
    assert torch.equal(a[2], b[2]), "dense features differ"

    times: dict[str, list[float]] = {k: [] for k in ways}
    order = list(ways)
    for r in range(args.rounds):
        for name in order[r % 2 :] + order[: r % 2]:
            make(ways[name], 1)  # warm
            torch.cuda.synchronize()
            per = []
            for i in range(args.batches):
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                make(ways[name], 2 + i)
                end.record()
                end.synchronize()
                per.append(start.elapsed_time(end))
            times[name].append(statistics.median(per))
    res = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "batch_size": args.batch_size,
        "ms_per_batch": {
            k: {"median": statistics.median(v), "min": min(v), "max": max(v), "rounds": v}
            for k, v in times.items()
        },
    }
    res["ratio_eager_over_compiled"] = statistics.median(
        e / c for e, c in zip(times["eager"], times["compiled"], strict=True)
    )
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
