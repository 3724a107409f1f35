"""Benchmark rocmtrain's TBE against FBGEMM TBE and torch.nn.EmbeddingBag in one run.

Providers (interleaved per case): ``ours`` (rocmtrain.kernels, Triton on GPU), ``fbgemm``
(SplitTableBatchedEmbeddingBagsCodegen; skipped with a note when fbgemm_gpu is missing), ``torch``
(nn.EmbeddingBag: dense-grad and sparse-grad SGD). Modes: ``fwd``, ``fwd+bwd+sgd`` (EXACT SGD),
``fwd+bwd+adagrad`` (rowwise Adagrad; not in torch). Each case is checked against an fp64
reference before timing (forward of every provider; one SGD step of ours and FBGEMM).

Bytes are counted FBGEMM's way: forward = out_bytes*B*sum(D) + w_bytes*B*sum(D)*L, forward +
backward + update = 3x that. Times are ``triton.testing.do_bench`` medians over rotating input
sets; the device copy bandwidth (read+write) is measured in the same run.

Commands::

    # H200, full (< 6 min): all synthetic cases + the MLPerf DLRM-DCNv2 table set
    PYTHONPATH=/tmp/site python3 scripts/bench/bench_tbe.py --out $OUT/tbe
    # quick GPU smoke (~1 min), and the CPU self-test of this script
    python3 scripts/bench/bench_tbe.py --quick --out /tmp/tbe
    .venv/bin/python scripts/bench/bench_tbe.py --device cpu --quick --out /tmp/tbe_cpu
"""

from __future__ import annotations

import argparse
import gc
import json
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
# --device cpu --quick: a few cases that exercise every code path of this script
CPU_QUICK = {(torch.float32, 1, "uniform"), (torch.float32, 4, "zipf"),
             (torch.float16, 4, "uniform")}  # fmt: skip


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

    @property
    def fwd_bytes(self) -> float:
        wb = torch.tensor([], dtype=self.dtype).element_size()
        T = len(self.rows)
        return 4 * self.batch * T * self.dim + wb * self.batch * self.dim * sum(self.hot)


@dataclass
class Result:
    case: str
    provider: str
    mode: str
    ms: float | None
    gbps: float | None = None
    pct_copy: float | None = None
    vs_fbgemm: float | None = None
    vs_torch_dense: float | None = None
    note: str = ""
    checks: dict = field(default_factory=dict)


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def bench(fn, dev, quick: bool) -> float:  # noqa: D401
    """Median ms: do_bench on GPU (L2 flushed per call), a plain timer loop on CPU."""
    if dev.type == "cuda":
        import triton

        return triton.testing.do_bench(fn, warmup=10 if quick else 25, rep=40 if quick else 100,
                                       return_mode="median")  # fmt: skip
    fn()
    ts = []
    for _ in range(5 if quick else 20):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def copy_bandwidth_gbps(dev, quick: bool) -> float:
    n = (1 << 28) if dev.type == "cuda" else (1 << 22)  # 1 GiB / 16 MiB fp32
    src = torch.randn(n, device=dev)
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src), dev, quick)
    return 2 * n * 4 / ms / 1e6


def make_inputs(case: Case, dev, seed: int):
    """``sets`` KJT inputs (int64 indices, F*B+1 offsets), feature-major, fixed bag lengths."""
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
        lengths = torch.tensor(case.hot, device=dev).repeat_interleave(case.batch)
        off = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=dev)
        off[1:] = lengths.cumsum(0)
        sets.append((torch.cat(vals), off))
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

    def __init__(self, case, dev, kind):
        self.m = TableBatchedEmbeddingBags(
            [(r, case.dim) for r in case.rows], optimizer=OptimizerSpec(kind, lr=LR),
            weights_dtype=case.dtype, bounds_check=False, device=dev,
        )  # fmt: skip

    def weights(self):
        return self.m.split_embedding_weights()

    def fwd(self, idx, off):
        return self.m(idx, off)


class Fbgemm:
    name = "fbgemm"

    def __init__(self, case, dev, kind):
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
        self.m = SplitTableBatchedEmbeddingBagsCodegen(
            [(r, case.dim, loc, cd) for r in case.rows], optimizer=opt, learning_rate=LR, eps=1e-8,
            weights_precision=wp, output_dtype=SparseType.FP32, pooling_mode=PoolingMode.SUM,
            bounds_check_mode=BoundsCheckMode.NONE, device=dev,
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
        B, outs, p = self.case.batch, [], 0
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
    if provider == "ours":
        return Ours(case, dev, kind)
    if provider == "fbgemm":
        return Fbgemm(case, dev, kind)
    return TorchEB(case, dev, sparse=provider == "torch_sparse")


# ------------------------------------------------------------------ the run
def check_case(case: Case, dev, provs: dict, kind: str, seed: int) -> dict:
    """fp64 checks of every provider against its own weights, on a sub-batch (fresh inputs):
    forward, and (SGD) the touched rows after one step. Returns {provider: {"fwd", "step"}}.
    Only touched rows are gathered, so this fits next to 100 GB of tables."""
    Bc = min(case.batch, 2048)
    sub = Case(case.name, case.rows, case.dim, case.hot, Bc, case.dtype, case.dist, sets=1)
    idx, off = make_inputs(sub, dev, seed)[0]
    grad = torch.randn(Bc, len(case.rows) * case.dim, device=dev) * 0.1
    res = {}
    for name, p in provs.items():
        W = p.weights()
        ref = reference_forward(W, sub, Bc, idx)
        step_ref = reference_sgd(W, sub, Bc, idx, grad) if kind == "sgd" else None
        with torch.no_grad():
            r = {"fwd": rel_err(p.fwd(idx, off), ref)}
        if step_ref is not None and name != "torch_dense":  # dense: same math, huge memory
            p.fwd(idx, off).backward(grad)
            if isinstance(p, TorchEB):
                p.step()
            r["step"] = max(rel_err(W[t][u], new) for t, (u, new) in enumerate(step_ref))
        res[name] = r
    return res


def tolerance(dtype) -> dict:
    return {"fwd": 1e-4, "step": 1e-5 if dtype == torch.float32 else 3e-3}


def _time_one(case, dev, args, provs, n, mode, inputs, grad, notes) -> Result:
    if n not in provs:
        return Result(case.name, n, mode, None, note=notes.get(n, ""))
    p = provs[n]
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

    fn = fwd if mode == "fwd" else train
    try:
        for _ in range(3):  # compile / autotune outside the timed region
            fn()
        return Result(case.name, n, mode, bench(fn, dev, args.quick), note=notes.get(n, ""))
    except Exception as e:
        return Result(case.name, n, mode, None, note=f"failed: {type(e).__name__}: {str(e)[:80]}")


def run_case(case, dev, args, copy_gbps, have_fbgemm) -> list[Result]:
    inputs = make_inputs(case, dev, seed=1)
    grad = torch.randn(case.batch, len(case.rows) * case.dim, device=dev)
    wbytes = sum(case.rows) * case.dim * torch.tensor([], dtype=case.dtype).element_size()
    free = torch.cuda.mem_get_info()[0] if dev.type == "cuda" else 1 << 40
    names = ["ours"] + (["fbgemm"] if have_fbgemm else [])
    notes = {}
    if 2 * wbytes < 0.6 * free:
        names += ["torch_dense"]
    else:
        notes["torch_dense"] = "n/a: dense [rows, D] gradient does not fit"
    names += ["torch_sparse"]
    # providers side by side when they fit, else one at a time (the DLRM set at a 40M cap)
    together = len(names) * wbytes * 1.1 < 0.7 * free
    out: list[Result] = []
    plan = (("sgd", ("fwd", "fwd+bwd+sgd")), ("rowwise_adagrad", ("fwd+bwd+adagrad",)))
    for kind, modes in plan:
        cur = [n for n in names if kind == "sgd" or n in ("ours", "fbgemm")]
        for group in [cur] if together else [[n] for n in cur]:
            provs = {}
            for n in ["ours"] + [g for g in group if g != "ours"]:
                try:
                    provs[n] = build(n, case, dev, kind)
                except Exception as e:  # a provider that cannot run this case: say so
                    notes[n] = f"build failed: {type(e).__name__}: {str(e)[:80]}"
            checks = check_case(case, dev, provs, kind, seed=7)
            for mode in modes:
                for n in group:  # interleaved: every provider of this mode back to back
                    out.append(_time_one(case, dev, args, provs, n, mode, inputs, grad, notes))
                    out[-1].checks = checks.get(n, {}) if mode == modes[0] else {}
            del provs
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    for n, why in notes.items():
        if n not in {r.provider for r in out}:
            out.append(Result(case.name, n, "fwd", None, note=why))
    factor = {"fwd": 1.0}
    for r in out:
        if r.ms:
            r.gbps = case.fwd_bytes * factor.get(r.mode, 3.0) / r.ms / 1e6
            r.pct_copy = 100 * r.gbps / copy_gbps
    for r in out:
        for ref_name, attr in (("fbgemm", "vs_fbgemm"), ("torch_dense", "vs_torch_dense")):
            ref = next((x for x in out if x.provider == ref_name and x.mode == r.mode), None)
            if r.ms and ref and ref.ms:
                setattr(r, attr, ref.ms / r.ms)
    return out


def cases(args, dev) -> list[Case]:
    out = []
    gpu = dev.type == "cuda"
    rows = args.rows or (4_000_000 if gpu else 2_000)
    B = args.batch or (16384 if gpu else 64)
    dtypes = [torch.float32] if args.quick and gpu else [torch.float32, torch.float16]
    dims = ([128] if args.quick else [64, 128, 256]) if gpu else [16]
    Ls = [1, 32] if gpu else [1, 4]
    for dt in dtypes:
        for D in dims:
            for L in Ls:
                for dist in ("uniform", "zipf"):
                    if not gpu and args.quick and (dt, L, dist) not in CPU_QUICK:
                        continue
                    nm = f"{str(dt)[6:]} D={D} L={L} {dist}"
                    out.append(Case(nm, [rows], D, [L], B, dt, dist))
    if not args.no_dlrm:
        cap = args.dlrm_rows_cap or (40_000_000 if gpu and not args.quick else 2_000_000)
        if not gpu:
            cap = min(cap, 1000)
        db = args.dlrm_batch or (65536 if gpu and not args.quick else 8192 if gpu else 16)
        out.append(Case(f"DLRM-DCNv2 26x128 cap={cap:g} B={db}", [min(r, cap) for r in DLRM_ROWS],
                        128, DLRM_HOT, db, torch.float32, "uniform", sets=2))  # fmt: skip
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
        "triton": package_version("triton") or package_version("pytorch-triton-rocm"),
        "fbgemm_gpu": package_version("fbgemm-gpu") or package_version("fbgemm-gpu-cpu")
        or package_version("fbgemm_gpu"),
    }  # fmt: skip


def fmt(x, spec=".3f"):
    return "—" if x is None else format(x, spec)


def markdown(results: list[Result], meta: dict, copy_gbps: float, have_fbgemm: bool) -> str:
    lines = [
        f"Run {meta['date']} on {meta['device']} ({meta['arch']}); torch {meta['torch']}, "
        f"triton {meta['triton']}, fbgemm_gpu {meta['fbgemm_gpu'] or 'MISSING'}.",
        f"Command: `{meta['command']}`. Device copy bandwidth (read+write): {copy_gbps:.0f} GB/s.",
    ]
    if not have_fbgemm:
        lines.append("**fbgemm_gpu is not importable here: the FBGEMM column is empty.**")
    lines += [
        "",
        "| case | mode | ours ms | fbgemm ms | torch dense ms | torch sparse ms | ours GB/s "
        "| ours % copy | ours vs fbgemm | ours vs torch dense | checks (rel err) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = []
    for r in results:
        if (r.case, r.mode) not in keys:
            keys.append((r.case, r.mode))
    for case, mode in keys:
        row = {r.provider: r for r in results if r.case == case and r.mode == mode}
        o = row.get("ours")

        def ms(n, row=row):
            r = row.get(n)
            return fmt(r.ms) if r and r.ms else ("n/a" if r and r.note else "—")

        chk = "; ".join(
            f"{n}: " + ",".join(f"{k} {v:.1e}" for k, v in r.checks.items())
            for n, r in row.items()
            if r.checks
        )
        lines.append(
            f"| {case} | {mode} | {ms('ours')} | {ms('fbgemm')} | {ms('torch_dense')} | "
            f"{ms('torch_sparse')} | {fmt(o.gbps if o else None, '.0f')} | "
            f"{fmt(o.pct_copy if o else None, '.0f')} | {fmt(o.vs_fbgemm if o else None, '.2f')}x | "
            f"{fmt(o.vs_torch_dense if o else None, '.1f')}x | {chk} |"
        )
    notes = sorted({f"{r.provider}: {r.note}" for r in results if r.note})
    if notes:
        lines += ["", "Notes: " + "; ".join(notes)]
    return "\n".join(lines)


def targets(results: list[Result]) -> list[str]:
    """The issue's targets on the large uniform case (fp32, D=128, L=32, uniform)."""
    big = "float32 D=128 L=32 uniform"

    def get(mode):
        return next((r for r in results if r.case == big and r.provider == "ours"
                     and r.mode == mode), None)  # fmt: skip

    out = []
    for mode, what, val, goal in (
        ("fwd", "fwd vs FBGEMM", "vs_fbgemm", 1.15),
        ("fwd", "fwd % of copy BW", "pct_copy", 90.0),
        ("fwd+bwd+sgd", "fwd+bwd+SGD vs FBGEMM", "vs_fbgemm", 1.1),
        ("fwd+bwd+adagrad", "fwd+bwd+rowwise Adagrad vs FBGEMM", "vs_fbgemm", 1.1),
        ("fwd+bwd+sgd", "fwd+bwd+SGD vs torch dense", "vs_torch_dense", 5.0),
    ):
        r = get(mode)
        v = getattr(r, val) if r else None
        status = "n/a" if v is None else ("MET" if v >= goal else f"MISSED by {goal - v:.2f}")
        out.append(f"- {what}: {fmt(v, '.2f')} (target >= {goal}) {status}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="fewer cases, shorter timing")
    ap.add_argument("--out", default="bench_tbe_out", help="folder for results.json + results.md")
    ap.add_argument("--rows", type=int, default=0, help="rows of the synthetic table (4M on GPU)")
    ap.add_argument("--batch", type=int, default=0, help="B of the synthetic cases (16384)")
    ap.add_argument("--dlrm-rows-cap", type=int, default=0, help="row cap of DLRM tables (40M)")
    ap.add_argument("--dlrm-batch", type=int, default=0, help="B of the DLRM case (65536)")
    ap.add_argument("--no-dlrm", action="store_true", help="skip the DLRM-DCNv2 table set")
    ap.add_argument("--only", default="", help="run only cases whose name contains this")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    try:
        import fbgemm_gpu  # noqa: F401

        have_fbgemm = True
    except Exception as e:  # missing wheel or ABI mismatch
        print(f"fbgemm_gpu not importable ({type(e).__name__}: {e}); FBGEMM column left empty")
        have_fbgemm = False
    t0 = time.time()
    copy_gbps = copy_bandwidth_gbps(dev, args.quick)
    print(f"device copy bandwidth: {copy_gbps:.0f} GB/s (read+write)", flush=True)
    results: list[Result] = []
    for case in cases(args, dev):
        if args.only and args.only not in case.name:
            continue
        t = time.time()
        res = run_case(case, dev, args, copy_gbps, have_fbgemm)
        results += res
        ours = {r.mode: r.ms for r in res if r.provider == "ours"}
        fb = {r.mode: r.ms for r in res if r.provider == "fbgemm"}
        print(f"[{time.time() - t0:6.1f}s] {case.name}: ours {ours} fbgemm {fb} "
              f"({time.time() - t:.1f}s)", flush=True)  # fmt: skip
    meta = env_info(dev)
    meta["copy_gbps"] = copy_gbps
    meta["wall_s"] = time.time() - t0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown(results, meta, copy_gbps, have_fbgemm)
    tg = targets(results)
    bad = []
    for r in results:  # torch's fp16 EmbeddingBag accumulates in fp16: shown, not fatal
        if r.provider not in ("ours", "fbgemm"):
            continue
        tol = tolerance(torch.float16 if "float16" in r.case else torch.float32)
        bad += [f"{r.case} {r.provider} {k}={v:.1e}" for k, v in r.checks.items()
                if not (v <= tol[k])]  # fmt: skip
    md += "\n\nTargets (large uniform case):\n" + "\n".join(tg)
    if bad:
        md += "\n\n**CHECK FAILED** (rel err above tolerance): " + "; ".join(bad)
    (out / "results.md").write_text(md + "\n")
    (out / "results.json").write_text(json.dumps(
        {"meta": meta, "results": [asdict(r) for r in results]}, indent=1, default=str))  # fmt: skip
    print(md)
    print(f"wrote {out}/results.md and results.json in {meta['wall_s']:.0f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
