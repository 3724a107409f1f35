"""Feature-grouped against one-tile Triton TBE at the DLRM-DCNv2 table set, with FBGEMM's TBE.

What it answers: does launching the one-hot and the multi-hot features with their own tiles
(forward and the backward's keys kernel; the module's default, split by the first batch's bag
lengths) beat one tile for all 26 features, and where does the fused training step stand
against FBGEMM's at the end-to-end recipe's inputs (its synthetic Zipf(1.05) ids, fp32 rows,
rowwise Adagrad, bf16 pooled output and gradient, 65536 samples)? Providers:

- ``grouped``: ``TableBatchedEmbeddingBags`` as the TorchRec sharder builds it (groups measured);
- ``one_tile``: the same with every feature given the set's mean bag length (one group);
- ``fbgemm``: ``bench_tbe.Fbgemm`` (``SplitTableBatchedEmbeddingBagsCodegen``,
  EXACT_ROWWISE_ADAGRAD) with bf16 output and TorchRec's default bounds check ``WARNING``, when
  fbgemm_gpu is installed.

Gate before timing: ``grouped`` and ``one_tile`` start from the same rows and must agree on the
forward and on the rows and Adagrad state after one step (1e-5 relative). Each mode (``fwd``,
``fwd+bwd``) runs in ``--rounds`` interleaved rounds, rotating the order; a reading is CUDA-event
time of ``--reps`` back-to-back calls / reps. Per provider: median and min-max ms, each ratio
(``fbgemm``'s or ``one_tile``'s time over ``grouped``'s, per round) as median and min-max, and
the profiled GPU time per kernel of one ``fwd+bwd`` call.

Commands::

    python3 scripts/bench/tbe_groups.py --out $OUT/groups      # H200, ~20 s with FBGEMM
    TRITON_INTERPRET=1 .venv/bin/python scripts/bench/tbe_groups.py --cpu-smoke --out /tmp/g
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_tbe as bt  # noqa: E402
import bwd_variants as bv  # noqa: E402

from rocmtrain.kernels import OptimizerSpec, TableBatchedEmbeddingBags  # noqa: E402

MODES = ("fwd", "fwd+bwd")


class Ours:
    def __init__(self, case: bt.Case, dev, grouped: bool):
        self.name = "grouped" if grouped else "one_tile"
        mean = sum(case.hot) / len(case.hot)
        self.m = TableBatchedEmbeddingBags(
            [(r, case.dim) for r in case.rows],
            optimizer=OptimizerSpec("rowwise_adagrad", lr=bt.LR, eps=1e-8),
            output_dtype=torch.bfloat16, bounds_check=True, bounds_check_every=50, backend="triton",
            pooling_factors=None if grouped else [mean] * len(case.rows), device=dev,
        )  # fmt: skip

    def fwd(self, idx, off):
        return self.m(idx, off)


def gate(a: Ours, b: Ours, idx, off, grad) -> dict:
    """``grouped`` vs ``one_tile`` from the same rows: forward, then rows and state after a step."""
    b.m.weights.data.copy_(a.m.weights.data)
    b.m.momentum.copy_(a.m.momentum)
    outs = [p.fwd(idx, off) for p in (a, b)]
    o0, o1 = (o.detach().float() for o in outs)
    fwd = float((o0 - o1).abs().max() / o1.abs().max())
    for o in outs:
        o.backward(grad)
    w = float((a.m.weights - b.m.weights).abs().max() / b.m.weights.abs().max())
    s = float((a.m.momentum - b.m.momentum).abs().max() / b.m.momentum.abs().max())
    # bf16 output: one rounding apart at most where fp32 sums differ in the last bits
    return {"fwd_rel": fwd, "weights_rel": w, "state_rel": s,
            "ok": fwd < 1e-2 and w < 1e-5 and s < 1e-5}  # fmt: skip


def run(args) -> dict:
    dev = torch.device(args.device)
    case = bv.dlrm_case(args.rows_cap, args.batch, args.dist)
    sets = bv.inputs(case, dev, seed=5)
    grad = torch.randn(case.batch, len(case.rows) * case.dim, device=dev).to(torch.bfloat16)
    provs = [Ours(case, dev, grouped=True), Ours(case, dev, grouped=False)]
    res: dict = {"ids": int(sets[0][0].numel()), "batch": case.batch, "dist": case.dist}
    res["gate"] = gate(provs[0], provs[1], *sets[0], grad)
    print("gate:", json.dumps(res["gate"]), flush=True)
    if dev.type == "cuda" and not args.no_fbgemm:
        try:
            # as TorchRec builds it: bf16 output, bounds check WARNING
            fb = bt.Fbgemm(case, dev, "rowwise_adagrad", output_dtype=torch.bfloat16,
                           bounds_check="WARNING")  # fmt: skip
            provs.append(fb)
        except ImportError as e:
            print(f"fbgemm_gpu not importable ({e}): ours only", flush=True)
    grouped = provs[0].m
    res["groups"] = [(ids.tolist(), avg) for ids, avg, _ in grouped._groups[grouped.weights.device]]
    timer = bt.Timer(dev, args.reps)
    k = [0]

    def caller(p, mode):
        def fn():
            idx, off = sets[k[0] % len(sets)]
            k[0] += 1
            out = p.fwd(idx, off)
            if mode != "fwd":
                out.backward(grad)

        return fn

    fns = {(p.name, mode): caller(p, mode) for p in provs for mode in MODES}
    for fn in fns.values():  # compile, autotune, warm
        for _ in range(args.warmup):
            fn()
    bt.warm_clocks(dev, args.warm_seconds)
    res["modes"] = {}
    for mode in MODES:
        names = [p.name for p in provs]
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(args.rounds):
            for n in names[r % len(names) :] + names[: r % len(names)]:
                times[n].append(timer.time(fns[(n, mode)]))
        rows = {}
        for n in names:
            ratio = [t / g for t, g in zip(times[n], times["grouped"], strict=True)]
            rows[n] = {"ms": bt.summary(times[n]), "over_grouped": bt.summary(ratio)}
            print(f"{mode:8s} {n:9s} {rows[n]['ms']['median']:.3f} ms "
                  f"[{rows[n]['ms']['min']:.3f}-{rows[n]['ms']['max']:.3f}]  "
                  f"{n}/grouped x{statistics.median(ratio):.3f} "
                  f"[{min(ratio):.3f}-{max(ratio):.3f}]", flush=True)  # fmt: skip
        res["modes"][mode] = rows
    res["kernels_us"] = {p.name: bt.kernel_split(fns[(p.name, "fwd+bwd")], dev) for p in provs}
    for n, split in res["kernels_us"].items():
        print(n, json.dumps(dict(list(split.items())[:12])), flush=True)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dist", choices=bv.DISTS, default="recipe")
    ap.add_argument("--rows-cap", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3, help="calls per provider and mode first")
    ap.add_argument("--warm-seconds", type=float, default=2.0)
    ap.add_argument("--no-fbgemm", action="store_true")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        args.device, args.rows_cap, args.batch, args.rounds, args.reps = "cpu", 200, 4, 2, 1
        args.warmup, args.warm_seconds = 1, 0.0
    res = run(args)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "tbe_groups.json").write_text(json.dumps(res, indent=1))
    if not res["gate"]["ok"]:
        print("GATE FAILED:", res["gate"])
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
