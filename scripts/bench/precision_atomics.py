"""Benchmark + accuracy of fp32-intermediate index_add vs native 16-bit accumulation (embedding grads).

    python scripts/bench/precision_atomics.py --device cuda --out atomics.json        # GPU (H200/MI300)
    TRITON_INTERPRET=1 python scripts/bench/precision_atomics.py --device cpu --small  # smoke test

Shape: an embedding-gradient scatter — N = B*L index rows of width D added into an R-row table,
Zipf-like hot rows (many duplicates, which is where 16-bit accumulation loses). Providers:
``triton_fp32`` (rocmtrain Triton kernel, fp32 atomics ``sem="relaxed"``, one cast),
``torch_fp32`` (fp32 buffer + torch ``index_add_`` + one cast), ``torch_native`` (``index_add_`` in the
16-bit dtype: atomics on GPU). For each: median ms over ``--iters`` and the max relative error of the
hottest row against an fp64 reference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rocmtrain.precision import atomics  # noqa: E402
from rocmtrain.precision.numerics import platform_summary  # noqa: E402


def _time(fn, iters: int, device: str) -> float:
    times = []
    for _ in range(iters + 2):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times[2:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--small", action="store_true", help="tiny sizes (CPU / interpreter smoke test)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", help="JSON results file")
    args = p.parse_args(argv)
    rows, n, d = (1000, 4096, 16) if args.small else (1_000_000, 16384 * 32, 128)
    iters = 2 if args.small else args.iters
    g = torch.Generator().manual_seed(0)
    # Zipf-like: row = floor(R * u^3) puts most updates on the first rows
    index = (rows * torch.rand(n, generator=g) ** 3).long().clamp_max(rows - 1)
    results = []
    for dtype in (torch.float16, torch.bfloat16):
        src = (torch.rand(n, d, generator=g) * 0.01).to(dtype)  # same-sign grads: sums grow
        hot = int(torch.bincount(index).argmax())
        ref_hot = src.double()[index == hot].sum(0)
        idx_dev, src_dev = index.to(args.device), src.to(args.device)
        providers = {
            "triton_fp32": dict(policy="fp32", backend="triton"),
            "torch_fp32": dict(policy="fp32", backend="torch"),
            "torch_native": dict(policy="native", backend="torch"),
        }
        for name, kw in providers.items():
            interp = os.environ.get("TRITON_INTERPRET") == "1"
            if kw["backend"] == "triton" and (
                atomics.triton is None or (args.device == "cpu" and not interp)
            ):
                continue

            def run(kw=kw, dtype=dtype, idx=idx_dev, src=src_dev):
                out = torch.zeros(rows, d, dtype=dtype, device=args.device)
                return atomics.index_add(out, idx, src, **kw)

            out = run()
            err = float(
                ((out[hot].double().cpu() - ref_hot).abs() / ref_hot.abs().clamp_min(1e-3)).max()
            )
            ms = _time(run, iters, args.device)
            results.append(
                {
                    "dtype": str(dtype).split(".")[-1],
                    "provider": name,
                    "ms": ms,
                    "hot_row_max_rel": err,
                    "hot_row_updates": int((index == hot).sum()),
                }
            )
            print(
                f"{results[-1]['dtype']:>9} {name:<13} {ms:9.3f} ms   hot-row max rel err {err:.2e}"
            )
    doc = {
        "platform": platform_summary(args.device),
        "rows": rows,
        "n": n,
        "d": d,
        "results": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
