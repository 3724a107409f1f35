"""Host time of one forward call of rocmtrain's TBE, split into its parts, against FBGEMM's.

At the issue's forward case (fp32 D=128 L=32, B=16384) the kernel runs ~75 us, so a host path
of the same length makes the call host-bound whatever the kernel does. Each part is enqueued
``--calls`` times between synchronizations (fewer launches than the driver's queue holds, so
the host never waits for the GPU) in ``--rounds`` interleaved rounds; reported per part: host
us per call, median [min-max] over rounds.

Command (GPU machine; FBGEMM optional)::

    PYTHONPATH=/tmp/site python3 scripts/bench/fwd_host.py --out $OUT/host
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_tbe import Case, Fbgemm, Ours, make_inputs  # noqa: E402


def parts(case: Case, dev) -> dict:
    """name -> callable: the forward's layers from the kernel launch out to the module call."""
    import rocmtrain.kernels.tbe_forward as tf
    from rocmtrain.kernels.arch import forward_config
    from rocmtrain.platform import device_info

    p = Ours(case, dev, "sgd")
    (idx, off), lay, w = make_inputs(case, dev, seed=1)[0], p.m.layout, p.m.weights.data
    B = lay.batch_size(off)
    out = torch.empty(B, lay.total_dim, device=dev)
    cfg = forward_config(tf._device_info(w.device.index), max_dim=lay.max_dim,
                         avg_len=idx.numel() / (B * lay.num_features), elem_bytes=4)  # fmt: skip
    fns = {
        "platform.device_info": lambda: device_info(0),
        "tbe_forward._launch": lambda: tf._launch(cfg, lay, w, idx, off, None, out, "sum", B),
        "tbe_forward.forward": lambda: tf.forward(
            lay, w, idx, off, None, pooling="sum", output_dtype=torch.float32
        ),  # fmt: skip
        "module, no_grad": lambda: p.m(idx, off),
        "empty kernel (torch)": lambda: out.zero_(),
    }
    try:
        fb = Fbgemm(case, dev, "sgd")
        fns["fbgemm module, no_grad"] = lambda: fb.fwd(idx, off)
    except ImportError as e:
        print(f"fbgemm: skipped ({e})")
    return fns


def host_us(fn, calls: int, dev) -> float:
    torch.cuda.synchronize(dev)
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize(dev)
    return us


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=200, help="calls per reading (< queue depth)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("fwd_host.py measures host time next to a GPU; no GPU is visible")
    dev = torch.device("cuda")
    case = Case("float32 D=128 L=32 uniform", [4_000_000], 128, [32], 16384, torch.float32,
                "uniform")  # fmt: skip
    fns = parts(case, dev)
    with torch.no_grad():
        for fn in fns.values():  # compile, autotune, allocator
            for _ in range(20):
                fn()
        res: dict[str, list[float]] = {k: [] for k in fns}
        names = list(fns)
        for r in range(args.rounds):
            for k in names[r % len(names) :] + names[: r % len(names)]:
                res[k].append(host_us(fns[k], args.calls, dev))
    rows = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
            for k, v in res.items()}  # fmt: skip
    for k, s in rows.items():
        print(f"{k:28s} {s['median']:7.1f} us [{s['min']:.1f}-{s['max']:.1f}]")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "fwd_host.json"), "w") as f:
            json.dump({"case": case.name, "calls": args.calls, "host_us": rows,
                       "torch": torch.__version__}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
