"""Benchmark rocmtrain's TBE against FBGEMM TBE and torch.nn.EmbeddingBag, in interleaved rounds.

Providers: ``ours`` (rocmtrain.kernels, Triton, the module's default: ``cuda_graph="auto"``, i.e. the
backward replayed from a CUDA graph once its input signature repeats; ``ROCMTRAIN_TBE_CUDA_GRAPH=0``
makes it the eager path), ``ours_graph`` (same with ``cuda_graph=True``: a graph for every
signature; training modes only), ``fbgemm`` (SplitTableBatchedEmbeddingBagsCodegen,
skipped with a note when fbgemm_gpu is missing), ``torch_dense`` / ``torch_sparse``
(nn.EmbeddingBag + SGD). Modes: ``fwd``, ``fwd+bwd+sgd`` (EXACT SGD), ``fwd+bwd+adagrad``
(rowwise Adagrad; not in torch). Every provider is checked against an fp64 reference on fresh
inputs before timing (forward; the touched rows after one SGD step); a failed check of ours or
FBGEMM exits 1 with CHECK FAILED.

Timing that one noisy reading cannot decide:
- each (case, mode) runs ``--rounds`` (>= 5) rounds; a round times every provider once, in
  rotating order (ours, FBGEMM, torch, then FBGEMM, torch, ours, ...), so drift hits all alike;
- a provider's reading in a round = CUDA-event time of ``reps`` back-to-back calls / reps, with
  ``reps`` raised per (case, mode) until the fastest provider's reading lasts >= 100 ms
  (``--min-reading-ms``): at 0.1 ms a call, 20 calls are a 2 ms reading that one scheduling
  hiccup moves by tens of per cent (seen as 0.7-0.85x single rounds of 1.2-1.7x cases), and
  at 25 ms one 10-30 ms stall of the host still made a 0.47-0.79x round of a 1.2-1.4x case
  (2026-12-02; both providers host-bound, the stall in ours); inputs
  rotated over sets that together exceed the L2 cache (no cached indices; host launch cost is
  included, as in training); the host's enqueue time per call is recorded next to it (equal to
  the GPU time = host-bound); the L2 is flushed (a 2x-L2 buffer written) before each round;
- Python's garbage collector is off while a reading's calls run (as in ``timeit``): at this
  size every provider is host-bound, and a collection pass inside one reading is noise;
- outputs come from the allocator's cache (warm-up first), clocks are raised by >= 0.5 s of
  copies at start and each provider is warmed >= 20 calls before its first round;
- per provider: median and min-max over rounds; ratio per round = other / ours of that round,
  reported as median [min, max]; a target is MET only if the ratio's lower bound meets it;
- one profiled call per provider and mode (torch.profiler) records the GPU kernels that ran
  (names, us) in the JSON, so which FBGEMM path ran (and any index cast) is on record;
- ``--index-dtype int32`` feeds int32 indices/offsets to every provider (FBGEMM has separate
  int32 / int64 kernels); the default is int64, KJT's usual dtype.
``--autotune`` times every forward tile candidate of each case by kernel time alone (a CUDA graph
of 20 launches per reading, L2 flushed, 5 interleaved rounds) and reports for each tile that has
an index-prefetch twin the per-round ratio twin / tile, so a table entry is chosen on a median
with its range, not one reading.
Bytes FBGEMM's way: forward = 4*B*sum(D) + w_bytes*B*sum(D)*L; training modes 3x that. The
device copy bandwidth (read+write, 1 GiB) is measured in the same run, in rounds too.

Commands::

    # H200, the issue's target cases only (~2 min)
    PYTHONPATH=/tmp/site python3 scripts/bench/bench_tbe.py --quick --out $OUT/tbe_quick
    # H200, all 72 (case, mode) pairs + the MLPerf DLRM-DCNv2 table set (~6-8 min)
    PYTHONPATH=/tmp/site python3 scripts/bench/bench_tbe.py --out $OUT/tbe
    # best forward tile per case (to update rocmtrain/kernels/arch.py), with --quick or alone
    PYTHONPATH=/tmp/site python3 scripts/bench/bench_tbe.py --quick --autotune --out $OUT/tune
    # CPU self-test of this script (Triton interpreter, tiny sizes)
    TRITON_INTERPRET=1 .venv/bin/python scripts/bench/bench_tbe.py --cpu-smoke --out /tmp/tbe_cpu
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rocmtrain.kernels import OptimizerSpec, TableBatchedEmbeddingBags  # noqa: E402

# MLPerf Training DLRM-DCNv2 (Criteo 1TB multi-hot): rows per table and multi-hot sizes
DLRM_ROWS = [40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282,
             10, 2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108,
             36]  # fmt: skip
DLRM_HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
LR = 0.01
# the issue's target cases (--quick): (dtype, D, L, dist)
QUICK = {(torch.float32, 128, 32, "uniform"), (torch.float32, 128, 32, "zipf"),
         (torch.float32, 64, 1, "uniform")}  # fmt: skip
# --cpu-smoke: a few tiny cases that exercise every code path of this script
CPU_SMOKE = {(torch.float32, 16, 1, "uniform"), (torch.float32, 16, 4, "zipf"),
             (torch.float16, 16, 4, "uniform")}  # fmt: skip
MODES = ("fwd", "fwd+bwd+sgd", "fwd+bwd+adagrad")
TRAIN_FACTOR = 3.0  # training modes move ~3x the forward's bytes (FBGEMM's convention)


@dataclass
class Case:
    name: str
    rows: list[int]
    dim: int
    hot: list[int]  # bag length per table (fixed, like MLPerf multi-hot)
    batch: int
    dtype: torch.dtype
    dist: str  # uniform | zipf
    sets: int = 4
    index_dtype: torch.dtype = torch.int64

    @property
    def fwd_bytes(self) -> float:
        wb = torch.tensor([], dtype=self.dtype).element_size()
        T = len(self.rows)
        return 4 * self.batch * T * self.dim + wb * self.batch * self.dim * sum(self.hot)


def bag_offsets(case: Case, dev) -> torch.Tensor:
    """F*B+1 offsets (int64) of feature-major bags with the case's fixed bag lengths."""
    lengths = torch.tensor(case.hot, device=dev).repeat_interleave(case.batch)
    off = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=dev)
    off[1:] = lengths.cumsum(0)
    return off


def make_inputs(case: Case, dev, seed: int):
    """``sets`` KJT inputs (indices, F*B+1 offsets in ``case.index_dtype``), feature-major,
    fixed bag lengths."""
    g = torch.Generator(device=dev).manual_seed(seed)
    sets = []
    for _ in range(case.sets):
        vals = []
        for rows, L in zip(case.rows, case.hot, strict=True):
            n = case.batch * L
            if case.dist == "zipf" and rows > 1:
                vals.append(_zipf(rows, n, dev, g))
            else:
                vals.append(torch.randint(0, rows, (n,), device=dev, generator=g))
        off = bag_offsets(case, dev)
        sets.append((torch.cat(vals).to(case.index_dtype), off.to(case.index_dtype)))
    return sets


_ZIPF_CDF: dict = {}


def _zipf(rows, n, dev, g, alpha=1.15):
    key = (rows, str(dev))
    if key not in _ZIPF_CDF:
        k = torch.arange(1, rows + 1, device=dev, dtype=torch.float64)
        cdf = torch.cumsum(k.pow(-alpha), 0)
        perm = torch.randperm(rows, device=dev, generator=g)  # scatter hot rows over the table
        _ZIPF_CDF[key] = (cdf / cdf[-1], perm)
    cdf, perm = _ZIPF_CDF[key]
    u = torch.rand(n, device=dev, generator=g, dtype=torch.float64)
    return perm[torch.searchsorted(cdf, u).clamp_(max=rows - 1)]


def reference_forward(weights: list[torch.Tensor], case: Case, B: int, idx) -> torch.Tensor:
    """fp64 pooled output of B bags (fixed bag length per table)."""
    outs, p = [], 0
    for t, W in enumerate(weights):
        L = case.hot[t]
        outs.append(W[idx[p : p + B * L]].double().view(B, L, -1).sum(1))
        p += B * L
    return torch.cat(outs, 1)


def reference_sgd(weights, case: Case, B: int, idx, grad):
    """Per table: (touched row ids, fp64 rows after one exact SGD step with upstream ``grad``)."""
    D, p, out = case.dim, 0, []
    for t, W in enumerate(weights):
        L = case.hot[t]
        uniq, inv = torch.unique(idx[p : p + B * L], return_inverse=True)
        g = grad[:, t * D : (t + 1) * D].double().repeat_interleave(L, 0)
        acc = torch.zeros(uniq.numel(), D, dtype=torch.float64, device=W.device)
        acc.index_add_(0, inv, g)
        out.append((uniq, W[uniq].double() - LR * acc))
        p += B * L
    return out


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a = a.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - ref).norm() / ref.norm().clamp(min=1e-30))


# ------------------------------------------------------------------ providers
class Ours:
    name = "ours"

    def __init__(self, case, dev, kind, graph=False):
        self.graph = True  # default "auto" or True: warm the graph before the checked step
        self.m = TableBatchedEmbeddingBags(
            [(r, case.dim) for r in case.rows], optimizer=OptimizerSpec(kind, lr=LR),
            weights_dtype=case.dtype, bounds_check=False, device=dev,
            cuda_graph=True if graph else None,  # None: the default / ROCMTRAIN_TBE_CUDA_GRAPH
            pooling_factors=[float(L) for L in case.hot] if len(case.hot) > 1 else None,
        )  # fmt: skip

    def weights(self):
        return self.m.split_embedding_weights()

    def fwd(self, idx, off):
        return self.m(idx, off)


class Fbgemm:
    name = "fbgemm"

    def __init__(self, case, dev, kind, *, output_dtype=torch.float32, bounds_check="NONE"):
        """``output_dtype`` fp32 / bf16 / fp16; ``bounds_check`` a ``BoundsCheckMode`` name
        (TorchRec builds FBGEMM's TBE with ``WARNING``)."""
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            BoundsCheckMode,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            EmbeddingLocation,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        gpu = dev.type == "cuda"
        loc = EmbeddingLocation.DEVICE if gpu else EmbeddingLocation.HOST
        cd = ComputeDevice.CUDA if gpu else ComputeDevice.CPU
        opt = {"sgd": EmbOptimType.EXACT_SGD,
               "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD}[kind]  # fmt: skip
        wp = SparseType.FP32 if case.dtype == torch.float32 else SparseType.FP16
        sparse = {torch.float32: SparseType.FP32, torch.bfloat16: SparseType.BF16,
                  torch.float16: SparseType.FP16}  # fmt: skip
        self.m = SplitTableBatchedEmbeddingBagsCodegen(
            [(r, case.dim, loc, cd) for r in case.rows], optimizer=opt, learning_rate=LR, eps=1e-8,
            weights_precision=wp, output_dtype=sparse[output_dtype], pooling_mode=PoolingMode.SUM,
            bounds_check_mode=BoundsCheckMode[bounds_check], device=dev,
        )  # fmt: skip

    def weights(self):
        return self.m.split_embedding_weights()

    def fwd(self, idx, off):
        return self.m(idx, off)


class TorchEB:
    name = "torch"

    def __init__(self, case, dev, sparse):
        self.bags = torch.nn.ModuleList(
            torch.nn.EmbeddingBag(
                r,
                case.dim,
                mode="sum",
                sparse=sparse,
                include_last_offset=True,
                device=dev,
                dtype=case.dtype,
            )  # fmt: skip
            for r in case.rows
        )
        self.case = case
        self.opt = torch.optim.SGD(self.bags.parameters(), lr=LR)

    def weights(self):
        return [b.weight.data for b in self.bags]

    def fwd(self, idx, off):
        # B from the offsets, not the case: the correctness check runs a smaller batch
        # (every bag of table t holds hot[t] ids: slice on the host, no device read)
        B, outs, p = (off.numel() - 1) // len(self.bags), [], 0
        for t, bag in enumerate(self.bags):
            L = self.case.hot[t]
            o = off[t * B : (t + 1) * B + 1] - off[t * B]
            outs.append(bag(idx[p : p + B * L], o).float())
            p += B * L
        return torch.cat(outs, 1)

    def step(self):
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def build(provider: str, case: Case, dev, kind: str):
    if provider in ("ours", "ours_graph"):
        return Ours(case, dev, kind, graph=provider == "ours_graph")
    if provider == "fbgemm":
        return Fbgemm(case, dev, kind)
    return TorchEB(case, dev, sparse=provider == "torch_sparse")


# ------------------------------------------------------------------ the run
def _check_one(name, p, sub, Bc, idx, off, grad, kind) -> dict:
    W = p.weights()
    ref = reference_forward(W, sub, Bc, idx)
    step_ref = reference_sgd(W, sub, Bc, idx, grad) if kind == "sgd" else None
    if getattr(p, "graph", False) and step_ref is not None:
        for _ in range(2):  # zero-grad steps (no change); the checked step is then a graph one
            # (True: warm-up, capture+replay, replay; "auto": eager, warm-up, capture+replay)
            p.fwd(idx, off).backward(torch.zeros_like(grad))
    with torch.no_grad():
        r = {"fwd": rel_err(p.fwd(idx, off), ref)}
    if step_ref is not None and name != "torch_dense":  # dense: same math, huge memory
        p.fwd(idx, off).backward(grad)
        if isinstance(p, TorchEB):
            p.step()
        r["step"] = max(rel_err(W[t][u], new) for t, (u, new) in enumerate(step_ref))
    return r


def check_case(case: Case, dev, provs: dict, kind: str, seed: int) -> dict:
    """fp64 checks of every provider against its own weights, on a sub-batch (fresh inputs):
    forward, and (SGD) the touched rows after one step. Returns {provider: {"fwd", "step"}}.
    Only touched rows are gathered, so this fits next to 100 GB of tables."""
    Bc = min(case.batch, 2048)
    sub = Case(
        case.name,
        case.rows,
        case.dim,
        case.hot,
        Bc,
        case.dtype,
        case.dist,
        sets=1,
        index_dtype=case.index_dtype,
    )
    idx, off = make_inputs(sub, dev, seed)[0]
    grad = torch.randn(Bc, len(case.rows) * case.dim, device=dev) * 0.1
    res = {}
    for name, p in provs.items():
        try:
            res[name] = _check_one(name, p, sub, Bc, idx, off, grad, kind)
        except Exception as e:  # recorded as a failed check (exit 1), the run goes on
            print(f"CHECK of {name} on {case.name} raised {type(e).__name__}: {e}", flush=True)
            res[name] = {"fwd": float("inf")}
    return res


def tolerance(dtype) -> dict:
    return {"fwd": 1e-4, "step": 1e-5 if dtype == torch.float32 else 3e-3}


# ------------------------------------------------------------------ timing
class Timer:
    """Back-to-back calls timed with CUDA events (perf_counter on CPU); L2 flush per round."""

    def __init__(self, dev, reps: int):
        self.dev, self.reps = dev, reps
        self.last_host_ms = 0.0
        self.gpu = dev.type == "cuda"
        l2 = 0
        if self.gpu:
            l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or (64 << 20)
        self.l2_bytes = l2
        self.flush_buf = torch.empty(max(2 * l2, 1 << 20) // 4, device=dev) if self.gpu else None

    def flush(self):
        if self.flush_buf is not None:
            self.flush_buf.zero_()

    def sync(self):
        if self.gpu:
            torch.cuda.synchronize(self.dev)

    def time(self, fn, reps: int | None = None) -> float:
        """ms per call of ``reps`` (default: the timer's) back-to-back calls (after an L2 flush),
        Python's garbage collector off while they run (as ``timeit`` does: a collection pass
        inside one provider's host-bound reading is noise, not its cost)."""
        with _gc_off():
            return self._time(fn, reps or self.reps)

    def _time(self, fn, reps: int) -> float:
        self.flush()
        self.sync()
        if self.gpu:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            # host time to enqueue the calls: ~= the GPU time means the provider is host-bound
            self.last_host_ms = (time.perf_counter() - t) * 1e3 / reps
            e1.record()
            e1.synchronize()
            return e0.elapsed_time(e1) / reps
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        self.last_host_ms = (time.perf_counter() - t) * 1e3 / reps
        return self.last_host_ms


@contextlib.contextmanager
def _gc_off():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def warm_clocks(dev, seconds: float) -> None:
    """Keep the GPU busy long enough for its clocks to ramp up before the first reading."""
    if dev.type != "cuda":
        return
    a = torch.empty(1 << 26, device=dev)
    b = torch.empty_like(a)
    t = time.time()
    while time.time() - t < seconds:
        for _ in range(20):
            b.copy_(a)
        torch.cuda.synchronize()


def copy_bandwidth(dev, timer: Timer, rounds: int) -> dict:
    n = (1 << 28) if dev.type == "cuda" else (1 << 20)  # 1 GiB / 4 MiB fp32
    src = torch.randn(n, device=dev)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    gbps = [2 * n * 4 / timer.time(lambda: dst.copy_(src)) / 1e6 for _ in range(rounds)]
    return {"median": statistics.median(gbps), "min": min(gbps), "max": max(gbps), "rounds": gbps}


def profile_kernels(fn, dev) -> list[dict]:
    """GPU kernels of one call (name, device us), in launch order; [] on CPU."""
    if dev.type != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out = []
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type):
            us = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)
            out.append({"name": e.name[:160], "us": round(float(us), 2)})
    return out


def kernel_split(fn, dev) -> dict[str, float]:
    """GPU microseconds per kernel name (first 60 characters) of one ``fn()`` call, largest
    first; {} on CPU."""
    split: dict[str, float] = {}
    for k in profile_kernels(fn, dev):
        split[k["name"][:60]] = round(split.get(k["name"][:60], 0.0) + k["us"], 1)
    return dict(sorted(split.items(), key=lambda kv: -kv[1]))


def summary(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


@dataclass
class Result:
    case: str
    provider: str
    mode: str
    ms: dict | None  # median / min / max over rounds
    rounds: list[float] = field(default_factory=list)
    host_ms: dict | None = None  # host enqueue time per call (median/min/max over rounds)
    gbps: float | None = None
    pct_copy: dict | None = None  # per-round % of the median copy bandwidth: median/min/max
    ratios: dict = field(default_factory=dict)  # vs provider -> median/min/max of other/ours
    kernels: list = field(default_factory=list)
    note: str = ""
    checks: dict = field(default_factory=dict)
    reps: int = 0  # calls per reading (the same for every provider of this case and mode)


def _callables(p, mode, inputs, grad):
    counter = iter(range(1 << 62))

    def nxt():  # rotate input sets
        return inputs[next(counter) % len(inputs)]

    def fwd():
        with torch.no_grad():
            p.fwd(*nxt())

    def train():
        p.fwd(*nxt()).backward(grad)
        if isinstance(p, TorchEB):
            p.step()

    return fwd if mode == "fwd" else train


def reading_reps(timer: Timer, fns: list, args) -> int:
    """Calls per reading for one (case, mode): at least ``--reps``, and enough that the fastest
    provider's reading lasts ``--min-reading-ms`` (sub-millisecond calls are host-bound, and a
    2 ms reading moves by tens of per cent with one scheduling hiccup). Same for all providers."""
    if not fns or args.min_reading_ms <= 0:
        return args.reps
    fastest = min(timer.time(fn, args.reps) for fn in fns)
    return max(args.reps, min(args.max_reps, math.ceil(args.min_reading_ms / max(fastest, 1e-6))))


def time_modes(case, dev, args, timer, provs, modes, inputs, grad, notes) -> list[Result]:
    """Interleaved rounds over the providers of ``provs`` for each mode."""
    out = []
    for mode in modes:
        names = [n for n in provs if not (mode == "fwd" and n == "ours_graph")]
        fns, rounds, failed = {}, {n: [] for n in names}, {}
        host = {n: [] for n in names}
        for n in names:
            try:
                fns[n] = _callables(provs[n], mode, inputs, grad)
                for _ in range(args.warmup):  # compile, autotune, graph capture, allocator
                    fns[n]()
            except Exception as e:
                failed[n] = f"failed: {type(e).__name__}: {str(e)[:100]}"
        live = [n for n in names if n not in failed]
        reps = reading_reps(timer, [fns[n] for n in live], args)
        for r in range(args.rounds):
            order = live[r % len(live) :] + live[: r % len(live)] if live else []
            for n in order:
                try:
                    rounds[n].append(timer.time(fns[n], reps))
                    host[n].append(timer.last_host_ms)
                except Exception as e:
                    failed[n] = f"failed: {type(e).__name__}: {str(e)[:100]}"
                    live = [x for x in live if x != n]
        for n in names:
            res = Result(case.name, n, mode, None, note=failed.get(n, notes.get(n, "")))
            if n not in failed and rounds[n]:
                res.ms, res.rounds = summary(rounds[n]), rounds[n]
                res.host_ms = summary(host[n])
                res.reps = reps
                res.kernels = profile_kernels(fns[n], dev)
            out.append(res)
    return out


def run_case(case, dev, args, timer, copy, have_fbgemm) -> list[Result]:
    sets = case.sets
    if dev.type == "cuda":  # input sets together larger than the L2: no index reuse in cache
        idx_bytes = case.batch * sum(case.hot) * case.index_dtype.itemsize
        sets = max(2, min(16, -(-2 * timer.l2_bytes // max(idx_bytes, 1))))
    case = Case(case.name, case.rows, case.dim, case.hot, case.batch, case.dtype, case.dist,
                sets=sets, index_dtype=case.index_dtype)  # fmt: skip
    inputs = make_inputs(case, dev, seed=1)
    grad = torch.randn(case.batch, len(case.rows) * case.dim, device=dev)
    wbytes = sum(case.rows) * case.dim * torch.tensor([], dtype=case.dtype).element_size()
    free = torch.cuda.mem_get_info()[0] if dev.type == "cuda" else 1 << 40
    names = ["ours"] + (["ours_graph"] if dev.type == "cuda" and not args.no_graph else [])
    names += ["fbgemm"] if have_fbgemm else []
    notes = {}
    if 2 * wbytes < 0.6 * free and not args.no_torch:
        names += ["torch_dense"]
    else:
        notes["torch_dense"] = "n/a: dense [rows, D] gradient does not fit / skipped"
    if not args.no_torch:
        names += ["torch_sparse"]
    together = len(names) * wbytes * 1.1 < 0.7 * free
    out: list[Result] = []
    plan = [("sgd", [m for m in ("fwd", "fwd+bwd+sgd") if m in args.modes]),
            ("rowwise_adagrad", [m for m in ("fwd+bwd+adagrad",) if m in args.modes])]  # fmt: skip
    for kind, modes in plan:
        if not modes:
            continue
        cur = [n for n in names if kind == "sgd" or n in ("ours", "ours_graph", "fbgemm")]
        for group in [cur] if together else [[n] for n in cur]:
            provs = {}
            for n in group:
                try:
                    provs[n] = build(n, case, dev, kind)
                except Exception as e:  # a provider that cannot run this case: say so
                    notes[n] = f"build failed: {type(e).__name__}: {str(e)[:80]}"
            checks = check_case(case, dev, provs, kind, seed=7)
            res = time_modes(case, dev, args, timer, provs, modes, inputs, grad, notes)
            for r in res:
                r.checks = checks.get(r.provider, {}) if r.mode == modes[0] else {}
            out += res
            del provs
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    for n, why in notes.items():
        if n not in {r.provider for r in out}:
            out.append(Result(case.name, n, "fwd", None, note=why))
    for r in out:
        if r.ms:
            f = 1.0 if r.mode == "fwd" else TRAIN_FACTOR
            r.gbps = case.fwd_bytes * f / r.ms["median"] / 1e6
            r.pct_copy = summary([100 * case.fwd_bytes * f / x / 1e6 / copy["median"]
                                  for x in r.rounds])  # fmt: skip
    for r in out:  # ratio per round: other provider's time / this provider's time, same round
        if not r.ms or not r.provider.startswith("ours"):
            continue
        for x in out:
            if x.mode == r.mode and x.ms and x.provider != r.provider and (
                    not x.provider.startswith("ours")) and len(x.rounds) == len(r.rounds):  # fmt: skip
                r.ratios[x.provider] = summary([a / b for a, b in zip(x.rounds, r.rounds,
                                                                      strict=True)])  # fmt: skip
    return out


def cases(args, dev) -> list[Case]:
    out = []
    gpu = dev.type == "cuda"
    rows = args.rows or (4_000_000 if gpu else 500)
    B = args.batch or (16384 if gpu else 16)
    for dt in (torch.float32, torch.float16):
        for D in (64, 128, 256) if gpu else (16,):
            for L in (1, 32) if gpu else (1, 4):
                for dist in ("uniform", "zipf"):
                    if args.quick and (dt, D, L, dist) not in QUICK:
                        continue
                    if args.cpu_smoke and (dt, D, L, dist) not in CPU_SMOKE:
                        continue
                    nm = f"{str(dt)[6:]} D={D} L={L} {dist}"
                    out.append(Case(nm, [rows], D, [L], B, dt, dist,
                                    index_dtype=args.index_dtype))  # fmt: skip
    if not (args.no_dlrm or args.quick):
        cap = args.dlrm_rows_cap or (40_000_000 if gpu else 1000)
        db = args.dlrm_batch or (65536 if gpu else 16)
        out.append(Case(f"DLRM-DCNv2 26x128 cap={cap:g} B={db}", [min(r, cap) for r in DLRM_ROWS],
                        128, DLRM_HOT, db, torch.float32, "uniform", sets=2,
                        index_dtype=args.index_dtype))  # fmt: skip
    return out


def env_info(dev) -> dict:
    from rocmtrain.platform import device_info, package_version

    info = device_info(0) if dev.type == "cuda" else None
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "device": info.name if info else platform.processor() or "cpu",
        "arch": info.arch if info else None,
        "torch": torch.__version__,
        "triton": package_version("triton-rocm") or package_version("pytorch-triton-rocm")
        or package_version("triton"),
        "fbgemm_gpu": package_version("fbgemm-gpu") or package_version("fbgemm-gpu-cpu")
        or package_version("fbgemm_gpu"),
    }  # fmt: skip


def fmt(x, spec=".3f"):
    return "—" if x is None else format(x, spec)


def fmt_range(d, spec=".3f", suffix=""):
    if not d:
        return "—"
    return (
        f"{format(d['median'], spec)}{suffix} [{format(d['min'], spec)}–{format(d['max'], spec)}]"
    )


PROVIDERS = ("ours", "ours_graph", "fbgemm", "torch_dense", "torch_sparse")


def markdown(results: list[Result], meta: dict, copy: dict, have_fbgemm: bool) -> str:
    lines = [
        f"Run {meta['date']} on {meta['device']} ({meta['arch']}); torch {meta['torch']}, "
        f"triton {meta['triton']}, fbgemm_gpu {meta['fbgemm_gpu'] or 'MISSING'}; "
        f"{meta['rounds']} interleaved rounds x >= {meta['reps']} calls (more where a reading "
        f"would last < {meta.get('min_reading_ms', 0):g} ms; per case in the JSON), "
        f"indices {meta['index_dtype']}.",
        f"Command: `{meta['command']}`. Device copy bandwidth (read+write): "
        f"{fmt_range(copy, '.0f')} GB/s.",
        "Times: ms per call, median [min–max] over rounds. Ratios: other / ours per round, "
        "median [min–max] (> 1 = ours faster).",
    ]
    if not have_fbgemm:
        lines.append("**fbgemm_gpu is not importable here: the FBGEMM column is empty.**")
    lines += [
        "",
        "| case | mode | "
        + " | ".join(f"{p} ms" for p in PROVIDERS)
        + " | ours % copy | ours vs fbgemm | ours_graph vs fbgemm | ours vs torch dense "
        "| host ms/call (ours, ours_graph, fbgemm) | checks |",
        "|---|---|" + "---|" * (len(PROVIDERS) + 6),
    ]
    keys = []
    for r in results:
        if (r.case, r.mode) not in keys:
            keys.append((r.case, r.mode))
    for case, mode in keys:
        row = {r.provider: r for r in results if r.case == case and r.mode == mode}

        def ms(n, row=row):
            r = row.get(n)
            return fmt_range(r.ms) if r and r.ms else ("n/a" if r and r.note else "—")

        def ratio(n, other, row=row):
            r = row.get(n)
            return fmt_range(r.ratios.get(other), ".2f", "x") if r else "—"

        o = row.get("ours")
        hosts = ", ".join(
            fmt(row[n].host_ms["median"]) if n in row and row[n].host_ms else "—"
            for n in ("ours", "ours_graph", "fbgemm")
        )
        chk = "; ".join(
            f"{n}: " + ",".join(f"{k} {v:.1e}" for k, v in r.checks.items())
            for n, r in row.items()
            if r.checks
        )
        lines.append(
            f"| {case} | {mode} | "
            + " | ".join(ms(p) for p in PROVIDERS)
            + f" | {fmt_range(o.pct_copy if o else None, '.0f')} | {ratio('ours', 'fbgemm')} | "
            f"{ratio('ours_graph', 'fbgemm')} | {ratio('ours', 'torch_dense')} | {hosts} | {chk} |"
        )
    notes = sorted({f"{r.case} {r.provider}: {r.note}" for r in results if r.note})
    if notes:
        lines += ["", "Notes: " + "; ".join(notes)]
    return "\n".join(lines)


TARGET_CASES = ("float32 D=128 L=32 uniform", "float32 D=128 L=32 zipf", "float32 D=64 L=1 uniform")


def targets(results: list[Result]) -> list[str]:
    """The issue's targets, each judged by the lower bound (min over rounds) of its ratio."""

    def get(case, prov, mode):
        return next((r for r in results if r.case == case and r.provider == prov
                     and r.mode == mode and r.ms), None)  # fmt: skip

    def judge(what, d, goal):
        if not d:
            return f"- {what}: n/a (target >= {goal})"
        lo = d["min"]
        status = "MET" if lo >= goal else f"MISSED (lower bound {lo:.2f} < {goal})"
        sfx = "" if "%" in what else "x"
        return f"- {what}: {fmt_range(d, '.2f', sfx)} (target lower bound >= {goal}) {status}"

    out = []
    big = TARGET_CASES[0]
    o = get(big, "ours", "fwd")
    out.append(judge(f"{big} fwd vs FBGEMM", o.ratios.get("fbgemm") if o else None, 1.15))
    out.append(judge(f"{big} fwd % of copy BW", o.pct_copy if o else None, 90.0))
    for prov in ("ours", "ours_graph"):
        for case in TARGET_CASES:
            for mode in ("fwd+bwd+sgd", "fwd+bwd+adagrad"):
                r = get(case, prov, mode)
                out.append(judge(f"{prov} {case} {mode} vs FBGEMM",
                                 r.ratios.get("fbgemm") if r else None, 1.1))  # fmt: skip
    for prov in ("ours", "ours_graph"):
        lows = [(r.ratios["fbgemm"]["min"], r.case, r.mode) for r in results
                if r.provider == prov and "fbgemm" in r.ratios and not r.case.startswith("DLRM")]  # fmt: skip
        if lows:
            lo = min(lows)
            status = "MET" if lo[0] >= 0.9 else "MISSED"
            out.append(f"- {prov}: no case below 0.9x FBGEMM (lower bounds): worst {lo[0]:.2f}x "
                       f"({lo[1]}, {lo[2]}) over {len(lows)} (case, mode) pairs {status}")  # fmt: skip
    return out


def autotune_report(case: Case, dev, rounds: int = 5) -> list[dict]:
    """Time every forward tile candidate of ``case`` (ours), the fastest (median) first.

    Kernel time only: on a GPU each reading replays a CUDA graph of ``launches`` captured
    launches (no host time, which at this size is as long as the kernel and moves from run to
    run), after an L2 flush; the candidates run in ``rounds`` interleaved rounds (rotating
    order). Each row: the tile, ``ms`` median/min/max per launch, ``gbps`` at the median, and
    for a tile with an index-prefetch twin the per-round ratio twin / this tile."""
    import rocmtrain.kernels.tbe_forward as tf
    from rocmtrain.kernels.arch import forward_candidates

    p = Ours(case, dev, "sgd")
    idx, off = make_inputs(case, dev, seed=3)[0]
    lay, w = p.m.layout, p.m.weights.data
    info = tf._device_info(w.device.index)
    B = lay.batch_size(off)
    avg = idx.numel() / max(1, B * lay.num_features)
    cands = forward_candidates(info, max_dim=lay.max_dim, avg_len=avg, elem_bytes=w.element_size(),
                               wide=True)  # fmt: skip
    out_t = torch.empty(B, lay.total_dim, device=dev)
    gpu = dev.type == "cuda"
    launches = 20 if gpu else 1
    timer = Timer(dev, reps=1)
    fns = []
    for cfg in cands:

        def call(cfg=cfg):
            tf._launch(cfg, lay, w, idx, off, None, out_t, "sum", B)

        call()  # compile outside the capture
        if gpu:
            torch.cuda.synchronize(dev)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(launches):
                    call()
            fns.append(g.replay)
        else:
            fns.append(call)
    times: list[list[float]] = [[] for _ in cands]
    for r in range(rounds):
        order = list(range(len(cands)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for k in order:
            times[k].append(timer.time(fns[k]) / launches)
    index = {cfg: k for k, cfg in enumerate(cands)}
    rows = []
    for k, cfg in enumerate(cands):
        twin = index.get(dataclasses.replace(cfg, prefetch=not cfg.prefetch))
        ms = summary(times[k])
        rows.append({"table": k == 0, "bags": cfg.bags, "block_l": cfg.block_l,
                     "num_warps": cfg.num_warps, "waves_per_eu": cfg.waves_per_eu,
                     "prefetch": cfg.prefetch, "ms": ms, "gbps": case.fwd_bytes / ms["median"] / 1e6,
                     "twin_over_this": None if twin is None else summary(
                         [b / a for a, b in zip(times[k], times[twin], strict=True)])})  # fmt: skip
    return sorted(rows, key=lambda r: r["ms"]["median"])


def _tile(r: dict) -> str:
    return (f"bags={r['bags']} block_l={r['block_l']} num_warps={r['num_warps']} "
            f"waves_per_eu={r['waves_per_eu']} prefetch={int(r['prefetch'])}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="the issue's target cases only")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="CPU self-test: Triton interpreter, tiny sizes")  # fmt: skip
    ap.add_argument("--out", default="bench_tbe_out", help="folder for results.json + results.md")
    ap.add_argument("--rounds", type=int, default=0, help="interleaved rounds (default 7, smoke 2)")
    ap.add_argument("--reps", type=int, default=0, help="calls per reading (default 20, smoke 1)")
    ap.add_argument("--min-reading-ms", type=float, default=-1.0,
                    help="more calls per reading until the fastest provider's lasts this long "
                    "(default 100 on GPUs, 0 = off; smoke 0)")  # fmt: skip
    ap.add_argument("--max-reps", type=int, default=2000, help="calls per reading at most")
    ap.add_argument("--warmup", type=int, default=0, help="calls before timing (default 20)")
    ap.add_argument("--index-dtype", choices=("int64", "int32"), default="int64")
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of " + ", ".join(MODES))
    ap.add_argument("--rows", type=int, default=0, help="rows of the synthetic table (4M on GPU)")
    ap.add_argument("--batch", type=int, default=0, help="B of the synthetic cases (16384)")
    ap.add_argument("--dlrm-rows-cap", type=int, default=0, help="row cap of DLRM tables (40M)")
    ap.add_argument("--dlrm-batch", type=int, default=0, help="B of the DLRM case (65536)")
    ap.add_argument("--no-dlrm", action="store_true", help="skip the DLRM-DCNv2 table set")
    ap.add_argument("--no-graph", action="store_true", help="skip the ours_graph provider")
    ap.add_argument("--no-torch", action="store_true", help="skip torch.nn.EmbeddingBag")
    ap.add_argument("--autotune", action="store_true",
                    help="print the best forward tile per case (for kernels/arch.py)")  # fmt: skip
    ap.add_argument("--only", default="",
                    help="run only cases whose name contains one of these (comma list)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.cpu_smoke:
        args.device = "cpu"
        os.environ.setdefault("TRITON_INTERPRET", "1")
    dev = torch.device(args.device)
    smoke = dev.type == "cpu"
    args.rounds = args.rounds or (2 if smoke else 7)
    args.reps = args.reps or (1 if smoke else 20)
    args.warmup = args.warmup or (2 if smoke else 20)
    if args.min_reading_ms < 0:
        args.min_reading_ms = 0.0 if smoke else 100.0
    args.index_dtype = torch.int32 if args.index_dtype == "int32" else torch.int64
    args.modes = [m for m in args.modes.split(",") if m]
    if dev.type == "cpu" and not args.cpu_smoke and not args.rows:
        args.cpu_smoke = True  # CPU runs are always the smoke sizes
    try:
        import fbgemm_gpu  # noqa: F401

        have_fbgemm = True
    except Exception as e:  # missing wheel or ABI mismatch
        print(f"fbgemm_gpu not importable ({type(e).__name__}: {e}); FBGEMM column left empty")
        have_fbgemm = False
    t0 = time.time()
    timer = Timer(dev, args.reps)
    warm_clocks(dev, 0.5 if args.quick else 1.0)
    copy = copy_bandwidth(dev, timer, max(args.rounds, 3))
    print(f"device copy bandwidth: {fmt_range(copy, '.0f')} GB/s (read+write)", flush=True)
    results: list[Result] = []
    tune: dict[str, list] = {}
    for case in cases(args, dev):
        if args.only and not any(x in case.name for x in args.only.split(",")):
            continue
        t = time.time()
        if args.autotune:
            try:
                tune[case.name] = autotune_report(case, dev)
                b = tune[case.name][0]
                tab = next(r for r in tune[case.name] if r["table"])
                print(f"[autotune] {case.name}: best {_tile(b)} {fmt_range(b['ms'], '.4f')} ms "
                      f"({b['gbps']:.0f} GB/s); table's choice {_tile(tab)} "
                      f"{fmt_range(tab['ms'], '.4f')} ms", flush=True)  # fmt: skip
            except Exception as e:  # the tuning sweep is advisory: note it, keep going
                print(f"[autotune] {case.name} failed: {type(e).__name__}: {e}", flush=True)
                tune.pop(case.name, None)
        try:
            res = run_case(case, dev, args, timer, copy, have_fbgemm)
        except Exception as e:  # an unattended run keeps going; the case says why it is empty
            print(f"case {case.name} failed: {type(e).__name__}: {e}", flush=True)
            res = [Result(case.name, "ours", "fwd", None, note=f"case failed: {type(e).__name__}: "
                          f"{str(e)[:100]}")]  # fmt: skip
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        results += res
        summ = {(r.provider, r.mode): round(r.ms["median"], 4) for r in res if r.ms}
        print(
            f"[{time.time() - t0:6.1f}s] {case.name} ({time.time() - t:.1f}s): {summ}", flush=True
        )
    meta = env_info(dev)
    meta.update(copy_gbps=copy, wall_s=time.time() - t0, rounds=args.rounds, reps=args.reps,
                min_reading_ms=args.min_reading_ms,
                index_dtype=str(args.index_dtype)[6:])  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(results, meta, copy, have_fbgemm)
    tg = targets(results)
    bad = []
    for r in results:  # torch's fp16 EmbeddingBag accumulates in fp16: shown, not fatal
        if not (r.provider.startswith("ours") or r.provider == "fbgemm"):
            continue
        tol = tolerance(torch.float16 if "float16" in r.case else torch.float32)
        bad += [f"{r.case} {r.provider} {k}={v:.1e}" for k, v in r.checks.items()
                if not (v <= tol[k])]  # fmt: skip
    md += "\n\nTargets (judged by the ratio's lower bound over rounds):\n" + "\n".join(tg)
    if tune:
        md += "\n\nForward autotune (kernel time per launch, CUDA graphs, interleaved rounds; " \
              "best tile per case, then the table's):\n" + "\n".join(
            f"- {k}: {_tile(v[0])}: {fmt_range(v[0]['ms'], '.4f')} ms; table "
            f"{_tile(t)}: {fmt_range(t['ms'], '.4f')} ms"
            for k, v in tune.items() for t in [next(r for r in v if r["table"])])  # fmt: skip
    kern = {}
    for r in results:  # the per-kernel split of one call, in launch order (all cases: JSON)
        if r.kernels and r.case in TARGET_CASES and r.provider != "torch_dense":
            tot = sum(k["us"] for k in r.kernels)
            kern[f"{r.case}, {r.provider}, {r.mode} ({len(r.kernels)} GPU ops, {tot:.0f} us)"] = [
                f"{k['name'][:60]} {k['us']:.1f}" for k in r.kernels]  # fmt: skip
    if kern:
        md += "\n\nGPU kernels of one profiled call (name us):\n" + "\n".join(
            f"- {k}: " + "; ".join(v) for k, v in kern.items())  # fmt: skip
    if bad:
        md += "\n\n**CHECK FAILED** (rel err above tolerance): " + "; ".join(bad)
    (out / "results.md").write_text(md + "\n")
    (out / "results.json").write_text(json.dumps(
        {"meta": meta, "results": [asdict(r) for r in results], "autotune": tune},
        indent=1, default=str))  # fmt: skip
    print(md)
    print(f"wrote {out}/results.md and results.json in {meta['wall_s']:.0f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
