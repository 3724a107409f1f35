"""Python cost of one ``TableBatchedEmbeddingBags`` forward with the kernel launch stubbed out.

Why: at B=16K a ~70 us forward kernel is host-bound whenever the module's call costs more than the
kernel (``bench_tbe.py``: on the H200's slower host mode, 0.085 ms per call). This isolates the
module's own Python (argument checks, backend, feature groups, tile lookup, grid and constexpr
building, the output allocation) from the launch itself, on any machine, and compares source
trees (e.g. a checkout of the previous commit) in interleaved rounds, each round a fresh
interpreter per tree. The launcher's own cost is measured on a GPU by ``tbe_host_cost.py``.

    git worktree add /tmp/prev HEAD~1
    .venv/bin/python scripts/bench/tbe_module_host.py --src /tmp/prev --src . --rounds 5

Setup: 4 tables (4096 x 128), features 1-hot, 1-hot, 4-hot, 4-hot (two feature groups, two
launches), B=64, no grad; every tile lookup a cache hit, as on a GPU after its first call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import os, sys, time, statistics, json
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, sys.argv[1])
import torch
import rocmtrain.kernels.tbe_forward as tf
from rocmtrain.kernels import OptimizerSpec, TableBatchedEmbeddingBags
assert tf.__file__.startswith(os.path.abspath(sys.argv[1])), tf.__file__
m = TableBatchedEmbeddingBags([(4096, 128)] * 4, optimizer=OptimizerSpec("sgd", lr=0.1),
                              backend="triton", bounds_check=False,
                              pooling_factors=[1.0, 1.0, 4.0, 4.0])
B = 64
idx = torch.randint(0, 4096, (10 * B,))
off = torch.cat([torch.arange(0, 2 * B), 2 * B + torch.arange(0, 8 * B + 1, 4)])
tf.autotune_enabled = lambda dev: True  # as on a GPU: the first call tunes, later calls hit
tf.fastest = lambda cands, run: cands[0]
with torch.no_grad():
    m(idx, off)
    tf._FWD.run = lambda *a, **k: None  # the launch stubbed: the module's Python only
    xs = []
    for _ in range(int(sys.argv[2])):
        t = time.perf_counter()
        for _ in range(int(sys.argv[3])):
            m(idx, off)
        xs.append((time.perf_counter() - t) / int(sys.argv[3]) * 1e6)
print(json.dumps(statistics.median(xs)))
"""


def measure(src: str, readings: int, calls: int) -> float:
    """Median host microseconds per forward call over ``readings`` readings, in a fresh
    interpreter importing rocmtrain from ``src``."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(Path(src).resolve()), str(readings), str(calls)],
        check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""},
    )  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--src", action="append", required=True,
                    help="a source tree holding rocmtrain/ (repeat: the first is the baseline)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--readings", type=int, default=3, help="readings per round and tree")
    ap.add_argument("--calls", type=int, default=5000, help="calls per reading")
    ap.add_argument("--out", default="", help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.readings < 1 or args.calls < 1:
        ap.error("--rounds, --readings and --calls must be >= 1")
    times: dict[str, list[float]] = {s: [] for s in args.src}
    for r in range(args.rounds):
        order = args.src[r % len(args.src) :] + args.src[: r % len(args.src)]
        for src in order:
            times[src].append(measure(src, args.readings, args.calls))
    base = times[args.src[0]]
    res = {}
    for src, xs in times.items():
        ratios = [b / x for b, x in zip(base, xs, strict=True)]
        res[src] = {"us": xs, "median": statistics.median(xs), "min": min(xs), "max": max(xs),
                    "baseline_over_this": [statistics.median(ratios), min(ratios), max(ratios)]}  # fmt: skip
        q = res[src]["baseline_over_this"]
        print(f"{src}: {res[src]['median']:.1f} us [{min(xs):.1f}-{max(xs):.1f}] per forward; "
              f"baseline / this per round {q[0]:.2f}x [{q[1]:.2f}-{q[2]:.2f}]")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
