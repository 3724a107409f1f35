"""Where a profiled training step leaves the GPU idle, from a torch.profiler chrome trace.

What it answers: with the GPU ~96 % busy, which host code does the device wait for? For every
``ProfilerStep#`` window it merges the GPU work of all streams (kernels, copies, memsets) into
busy intervals and takes each idle gap of at least ``--min-gap-us``; the work that ends the gap
was launched by a runtime call (matched by correlation id), and the CPU ops around that call
(innermost last) name the host code the GPU waited for. Gaps are summed per launching op; host
calls that block on the device (stream / event / device synchronize, synchronous copies) are
listed with their time.

Commands::

    # the e2e bench keeps each profiled stage's trace: RUN/profile/trace_rank0.json
    python3 scripts/bench/trace_gaps.py /tmp/e2ew/runs/rt_1gpu_triton_bf16/profile/trace_rank0.json \
        --out $OUT/gaps_triton.json
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
from collections import defaultdict
from pathlib import Path

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
CPU_CATS = ("cpu_op", "user_annotation", "python_function")
BLOCKING = ("Synchronize", "cudaMemcpy", "hipMemcpy")  # cudaMemcpyAsync excluded below


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


class CpuStacks:
    """CPU ops per thread, to name the ops enclosing a timestamp (outermost first)."""

    def __init__(self, events: list[dict]):
        self.by_tid: dict = defaultdict(list)
        for e in events:
            if e.get("ph") == "X" and e.get("cat") in CPU_CATS:
                self.by_tid[e.get("tid")].append(e)
        self.starts = {}
        for tid, evs in self.by_tid.items():
            evs.sort(key=lambda e: e["ts"])
            self.starts[tid] = [e["ts"] for e in evs]

    def enclosing(self, tid, ts: float) -> list[str]:
        evs = self.by_tid.get(tid, [])
        hi = bisect.bisect_right(self.starts.get(tid, []), ts)
        # ops start before ts; keep those still open at ts (bounded look-back)
        found = [e for e in evs[max(0, hi - 4000) : hi] if e["ts"] + e.get("dur", 0) >= ts]
        found.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        return [e["name"] for e in found if not e["name"].startswith("ProfilerStep#")]


def _label(stack: list[str], depth: int) -> str:
    """The innermost ``depth`` meaningful names of a launch stack."""
    skip = ("aten::", "cuda", "hip")
    names = [n for n in stack if not n.startswith(skip)] or stack
    return " > ".join(n[:70] for n in names[-depth:]) if names else "(no cpu op)"


def analyse(events: list[dict], min_gap_us: float, depth: int) -> dict:
    gpu = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS),
                 key=lambda e: e["ts"])  # fmt: skip
    calls = [e for e in events if e.get("ph") == "X" and e.get("cat") in RUNTIME_CATS]
    runtime = {e["args"]["correlation"]: e for e in calls if "correlation" in e.get("args", {})}
    stacks = CpuStacks(events)
    # the host's step ranges (the trace also holds a GPU-side copy of each, cat gpu_user_*)
    steps = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in CPU_CATS
                    and str(e.get("name", "")).startswith("ProfilerStep#")),
                   key=lambda e: e["ts"])  # fmt: skip
    out_steps = []
    by_op: dict[str, dict] = defaultdict(lambda: {"gap_us": 0.0, "gaps": 0})
    blocking: dict[str, dict] = defaultdict(lambda: {"us": 0.0, "calls": 0})
    for st in steps:
        t0, t1 = st["ts"], st["ts"] + st["dur"]
        work = [g for g in gpu if t0 <= g["ts"] < t1]
        busy = merge([(g["ts"], g["ts"] + g.get("dur", 0)) for g in work])
        busy_us = sum(e - s for s, e in busy)
        gaps = []
        starts = [g["ts"] for g in work]
        for (_, e_prev), (s_next, _) in zip(busy, busy[1:], strict=False):
            gap = s_next - e_prev
            if gap < min_gap_us:
                continue
            g = work[bisect.bisect_left(starts, s_next)]
            r = runtime.get(g.get("args", {}).get("correlation"))
            stack = stacks.enclosing(r.get("tid"), r["ts"]) if r else []
            label = _label(stack, depth)
            by_op[label]["gap_us"] += gap
            by_op[label]["gaps"] += 1
            gaps.append({"gap_us": round(gap, 1), "next": g["name"][:80], "launched_by": label,
                         "launch_to_start_us": round(g["ts"] - r["ts"], 1) if r else None})  # fmt: skip
        for r in calls:
            n = r.get("name", "")
            if t0 <= r["ts"] < t1 and any(b in n for b in BLOCKING) and "Async" not in n:
                blocking[n]["us"] += r.get("dur", 0)
                blocking[n]["calls"] += 1
        out_steps.append({"step": st["name"], "wall_us": round(st["dur"], 1),
                          "busy_us": round(busy_us, 1),
                          "idle_us": round(st["dur"] - busy_us, 1),
                          "gaps": sorted(gaps, key=lambda x: -x["gap_us"])[:15]})  # fmt: skip
    n = max(1, len(out_steps))
    top = sorted(by_op.items(), key=lambda kv: -kv[1]["gap_us"])
    return {
        "steps": out_steps,
        "idle_by_launching_op_us_per_step": {k: round(v["gap_us"] / n, 1) for k, v in top[:25]},
        "blocking_host_calls_per_step": {
            k: {"us": round(v["us"] / n, 1), "calls": v["calls"] / n} for k, v in blocking.items()
        },  # fmt: skip
    }


def kernels_by_op(events: list[dict], depth: int, top: int = 60) -> list[dict]:
    """Device work per (kernel, launching host ops) over the recorded steps, per step: which
    host code launched each kernel (a CUDA-graph replay names the compiled function's range)."""
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    calls = [e for e in events if e.get("ph") == "X" and e.get("cat") in RUNTIME_CATS]
    runtime = {e["args"]["correlation"]: e for e in calls if "correlation" in e.get("args", {})}
    stacks = CpuStacks(events)
    n = max(1, sum(1 for e in events if e.get("ph") == "X" and e.get("cat") in CPU_CATS
                   and str(e.get("name", "")).startswith("ProfilerStep#")))  # fmt: skip
    rows: dict[tuple[str, str], dict] = defaultdict(lambda: {"us": 0.0, "calls": 0})
    for g in gpu:
        r = runtime.get(g.get("args", {}).get("correlation"))
        label = _label(stacks.enclosing(r.get("tid"), r["ts"]), depth) if r else "(no launch)"
        if r:
            label = f"{r['name']} @ {label}"
        row = rows[(g["name"][:160], label)]
        row["us"] += g.get("dur", 0)
        row["calls"] += 1
    out = [{"kernel": k, "launched_by": op, "us_per_step": round(v["us"] / n, 1),
            "calls_per_step": v["calls"] / n} for (k, op), v in rows.items()]  # fmt: skip
    return sorted(out, key=lambda x: -x["us_per_step"])[:top]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="chrome trace (.json or .json.gz) from torch.profiler")
    ap.add_argument("--min-gap-us", type=float, default=10.0)
    ap.add_argument("--depth", type=int, default=2, help="launching op names kept per gap")
    ap.add_argument("--out", default="")
    ap.add_argument("--kernels", action="store_true",
                    help="also list device time per kernel and the host ops that launched it")
    args = ap.parse_args(argv)
    events = load(args.trace)
    res = analyse(events, args.min_gap_us, args.depth)
    if args.kernels:
        res["kernels"] = kernels_by_op(events, depth=3)
        for k in res["kernels"]:
            print(f"{k['us_per_step']:8.1f} us x{k['calls_per_step']:.1f}  {k['kernel'][:110]}"
                  f"  <- {k['launched_by'][:160]}")
    for s in res["steps"]:
        print(f"{s['step']}: wall {s['wall_us']:.0f} us, GPU busy {s['busy_us']:.0f}, "
              f"idle {s['idle_us']:.0f}")  # fmt: skip
    print("idle per step by launching op (us):")
    for k, v in res["idle_by_launching_op_us_per_step"].items():
        print(f"  {v:8.1f}  {k}")
    print("blocking host calls per step:", json.dumps(res["blocking_host_calls_per_step"]))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
