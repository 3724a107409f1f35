"""Host time per call of rocmtrain's TBE module, and where it goes (cProfile).

Why: at B=16384 every provider of ``bench_tbe.py`` is host-bound (host enqueue time per call
equals the GPU time), so a call costs what its Python costs. This enqueues ``--calls`` calls of
the forward (no grad) and of forward+backward with the GPU kept busy ahead of the host (a long
sleep kernel first), so the host time is the host's own; then profiles the same calls with
cProfile and prints the functions with the most own time. Then an A/B of the launch paths
(``rocmtrain.kernels.launch``) in ``--rounds`` interleaved rounds, median [min-max] host us per
call: the module's forward and training step with ``ROCMTRAIN_TRITON_LAUNCH=fast`` against
``=triton``, the forward kernel's launch alone both ways, the launcher's two parts (the argument
key, the compiled binary's launch), and FBGEMM's forward when fbgemm_gpu is installed.

    python3 scripts/bench/tbe_host_cost.py --out $OUT/host      # H200 (~40 s)
    TRITON_INTERPRET=1 .venv/bin/python scripts/bench/tbe_host_cost.py --cpu-smoke
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_tbe as bt  # noqa: E402


def host_us(fn, calls: int, dev, sleep_cycles: int = int(2e9)) -> dict:
    """Host microseconds per call (median, max and the calls that blocked on the GPU), the GPU
    busy with a sleep long enough that a call never waits for it unless it syncs (2e9 cycles:
    ~1 s on an H200)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda._sleep(sleep_cycles)  # GPU cycles queued first: enqueue never blocks
    each = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        each.append((time.perf_counter() - t) * 1e6)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    median = statistics.median(each)
    # a call that waited for the sleeping GPU takes ~its sleep (~1 s), orders above the others;
    # a slow call of a slow host (the CPU smoke runs Triton's interpreter) stays within 10x
    limit = max(50_000.0, 10 * median)
    return {"median": median, "max": max(each),
            "blocked": [i for i, us in enumerate(each) if us > limit]}  # fmt: skip


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


def _set_mode(mode: str) -> None:
    """``ROCMTRAIN_TRITON_LAUNCH=mode`` for the calls that follow (the launcher reads it once per
    process, so its cache is cleared)."""
    from rocmtrain.kernels import launch

    os.environ["ROCMTRAIN_TRITON_LAUNCH"] = mode
    launch.launch_mode.cache_clear()


def launch_parts(case, dev, inputs) -> dict:
    """The forward kernel's launch: Triton's dispatch, the launcher, and the launcher's parts."""
    import rocmtrain.kernels.tbe_forward as tf
    from rocmtrain.kernels.launch import arg_key

    ours = bt.Ours(case, dev, "sgd")
    (idx, off), lay, w = inputs[0], ours.m.layout, ours.m.weights.data
    B = lay.batch_size(off)
    out = torch.empty(B, lay.total_dim, device=dev)
    cfg = tf.forward_config(tf._device_info(w.device.index), max_dim=lay.max_dim,
                            avg_len=idx.numel() / (B * lay.num_features), elem_bytes=4)  # fmt: skip
    seen = []  # one launch's (grid, args, meta), as _launch passes them to the launcher
    orig, tf._FWD.run = tf._FWD.run, lambda grid, *a, **m: seen.append((grid, a, m))
    try:
        tf._launch(cfg, lay, w, idx, off, None, out, "sum", B)
    finally:
        tf._FWD.run = orig
    grid, a, m = seen[0]
    binary = tf._FWD.fn[grid](*a, **m)
    vals = list(a) + [m[n] for n in tf._FWD._names[len(a) :]]
    stream = torch.cuda.current_stream(dev).cuda_stream
    return {
        "forward kernel: kernel[grid]": lambda: tf._FWD.fn[grid](*a, **m),
        "forward kernel: Launcher.run": lambda: tf._FWD.run(grid, *a, **m),
        "  launcher part: argument key": lambda: tuple([arg_key(x, False) for x in a]),
        "  launcher part: binary.run": lambda: binary.run(
            *grid, stream, binary.function, binary.packed_metadata, None, None, None, *vals
        ),
        "empty torch op (out.zero_)": out.zero_,
    }


def launch_ab(case, dev, inputs, calls: int, rounds: int) -> dict:
    """Host us per call of each launch path and layer, ``rounds`` interleaved rounds."""
    from rocmtrain.kernels import launch

    ours = bt.Ours(case, dev, "sgd")
    grad = torch.randn(case.batch, case.dim, device=dev)
    fwd, train = (bt._callables(ours, mode, inputs, grad) for mode in ("fwd", "fwd+bwd"))
    # each entry's launch mode is set before its block of calls, outside the timed calls; the
    # launch parts and FBGEMM run under the default "fast"
    fns, modes = {}, {}
    for name, fn in (("forward", fwd), ("fwd+bwd sgd", train)):
        for mode in ("fast", "triton"):
            key = f"module {name}, {mode}"
            fns[key], modes[key] = fn, mode
    fns.update(launch_parts(case, dev, inputs))
    try:
        fb = bt.Fbgemm(case, dev, "sgd")
        fns["FBGEMM forward"] = bt._callables(fb, "fwd", inputs, grad)
    except ImportError as e:
        print(f"FBGEMM: skipped ({e})")
    for k, fn in fns.items():
        _set_mode(modes.get(k, "fast"))
        for _ in range(10):  # compile, graph capture, allocator
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            _set_mode(modes.get(k, "fast"))
            times[k].append(host_us(fns[k], calls, dev, sleep_cycles=int(2e8))["median"])
    os.environ.pop("ROCMTRAIN_TRITON_LAUNCH", None)
    launch.launch_mode.cache_clear()
    out = {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
           for k, v in times.items()}  # fmt: skip
    print(f"launch A/B, host us per call, median [min-max] of {rounds} interleaved rounds:")
    for k, s in out.items():
        print(f"  {k:34s} {s['median']:7.1f} [{s['min']:.1f}-{s['max']:.1f}]", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the launch A/B")
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
    if dev.type == "cuda":
        res["launch_ab"] = launch_ab(case, dev, inputs, args.calls, args.rounds)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "tbe_host_cost.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
