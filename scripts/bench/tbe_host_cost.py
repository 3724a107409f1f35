"""Host time per call of rocmtrain's TBE module, and where it goes (cProfile).

Why: at B=16384 every provider of ``bench_tbe.py`` is host-bound (host enqueue time per call
equals the GPU time), so a call costs what its Python costs. This enqueues ``--calls`` calls of
the forward (no grad) and of forward+backward with the GPU kept busy ahead of the host (a long
sleep kernel first), so the host time is the host's own; then profiles the same calls with
cProfile and prints the functions with the most own time.

    python3 scripts/bench/tbe_host_cost.py --out $OUT/host      # H200 (~20 s)
    TRITON_INTERPRET=1 .venv/bin/python scripts/bench/tbe_host_cost.py --cpu-smoke
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_tbe as bt  # noqa: E402


def host_us(fn, calls: int, dev) -> dict:
    """Host microseconds per call (median, max and the calls that blocked on the GPU), the GPU
    busy with a sleep long enough that a call never waits for it unless it syncs."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda._sleep(int(2e9))  # ~1 s of GPU cycles queued first: enqueue never blocks
    each = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        each.append((time.perf_counter() - t) * 1e6)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    return {"median": statistics.median(each), "max": max(each),
            "blocked": [i for i, us in enumerate(each) if us > 50_000]}  # fmt: skip


def top_own_time(fn, calls: int, n: int) -> list[dict]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    st = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, name), (_, ncalls, tottime, cumtime, _) in st.stats.items():
        rows.append({"fn": f"{Path(file).name}:{line}({name})", "calls_per_step": ncalls / calls,
                     "own_us": tottime * 1e6 / calls, "cum_us": cumtime * 1e6 / calls})  # fmt: skip
    return sorted(rows, key=lambda r: -r["own_us"])[:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        args.device, args.calls = "cpu", 3
    dev = torch.device(args.device)
    B = 16384 if dev.type == "cuda" else 8
    case = bt.Case("synthetic", [4_000_000 if dev.type == "cuda" else 1000], 128, [32], B,
                   torch.float32, "uniform")  # fmt: skip
    inputs = bt.make_inputs(case, dev, seed=1)
    res = {}
    for kind in ("sgd", "rowwise_adagrad"):
        ours = bt.Ours(case, dev, kind)
        grad = torch.randn(B, case.dim, device=dev)
        for mode in ("fwd", "fwd+bwd") if kind == "sgd" else ("fwd+bwd",):
            fn = bt._callables(ours, mode, inputs, grad)  # bench_tbe's own calls
            for _ in range(5):  # compile, graph capture
                fn()
            us = host_us(fn, args.calls, dev)
            res[f"{mode} {kind}"] = {"host_us": us,
                                     "top": top_own_time(fn, args.calls, args.top)}  # fmt: skip
            print(f"{mode} {kind}: {us['median']:.1f} host us/call (median; max {us['max']:.0f}; "
                  f"calls that waited for the GPU: {us['blocked']})", flush=True)  # fmt: skip
            for r in res[f"{mode} {kind}"]["top"][:12]:
                print(f"   {r['own_us']:7.1f} own {r['cum_us']:7.1f} cum  "
                      f"{r['calls_per_step']:5.1f}x  {r['fn']}")  # fmt: skip
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "tbe_host_cost.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
