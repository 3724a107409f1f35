"""Backward kernel variants of rocmtrain's TBE at the DLRM-DCNv2 table set, timed side by side.

What it answers: which backward configuration (tile of sorted positions, warps per program, how a
tile sums a row's run — segmented scan or same-key matrix product —, bags gathered in sorted
order or through ``perm``) is fastest at ≈14 M ids per call, and where the time goes (per-kernel
GPU times from torch.profiler). Each variant is first checked against the baseline variant on a
smaller table set (same inputs, same initial rows: updated weights and rowwise state within 1e-5
relative), then all variants are timed in ``--rounds`` interleaved rounds (rotating order), each
reading = CUDA-event time of ``--reps`` back-to-back ``backward_update`` calls / reps.

Commands::

    # H200 (~1 min for 3 variants): uniform and Zipf ids
    python3 scripts/bench/bwd_variants.py --variants scan8x2,scan8x2_ht32,scan16x4 --out $OUT/bwd
    # a kernel change against the code before it, same run (``--impl NAME=FILE``: another copy
    # of the kernel file; variant "NAME" runs it with the table's config, "NAME+<variant>" with a
    # variant's); s4 = 4 steps per tile program; _r72 = 72 registers at most
    git show HEAD~1:rocmtrain/kernels/tbe_backward.py > /tmp/prev.py
    python3 scripts/bench/bwd_variants.py --variants prev,prev+scan8x2_r72,table,s4,s4_r72 \
        --impl prev=/tmp/prev.py
    # the end-to-end recipe's case: its synthetic ids (Zipf 1.05, hottest ids first) and bf16
    # pooled-output gradients
    python3 scripts/bench/bwd_variants.py --variants table --dists recipe --grad-dtype bfloat16
    # CPU self-test (Triton interpreter, tiny sizes; the scan variants take ~30 s each there)
    TRITON_INTERPRET=1 .venv/bin/python scripts/bench/bwd_variants.py --cpu-smoke --out /tmp/bwd
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_tbe as bt  # noqa: E402

import rocmtrain.kernels.tbe_backward as tb  # noqa: E402
from rocmtrain.kernels import OptimizerSpec, TableBatchedEmbeddingBags  # noqa: E402

#: one step of 8 positions x 2 warps, scan, sorted bags, no register cap: the H200 table of the
#: seventh and eighth sessions, which the named variants below vary
_ONE_STEP = dict(step=8, num_warps=2, reduce="scan", bag_sorted=True, hot_tiles=16,
                 hot_num_warps=4, maxnreg=0, steps=1)  # fmt: skip
# name -> overrides of the arch table's backward config: "step" (sorted positions per step of the
# tile program) and any LaunchConfig field (num_warps, reduce, bag_sorted, hot_tiles, hot_num_warps,
# maxnreg: the tile kernel's register cap, steps: steps per tile program); {} = the table's
# own choice
VARIANTS: dict[str, dict] = {
    "table": {},
    "scan8x2": _ONE_STEP,
    "scan8x2_hot2": {**_ONE_STEP, "hot_num_warps": 2},
    "scan8x2_ht32": {**_ONE_STEP, "hot_tiles": 32},
    "scan8x2_perm": {**_ONE_STEP, "bag_sorted": False},
    "scan8x2_r64": {**_ONE_STEP, "maxnreg": 64},
    "scan8x2_r72": {**_ONE_STEP, "maxnreg": 72},
    "scan8x2_r80": {**_ONE_STEP, "maxnreg": 80},
    "scan16x4": {**_ONE_STEP, "step": 16, "num_warps": 4},
    "dot16x4": {**_ONE_STEP, "reduce": "dot", "step": 16, "num_warps": 4},
}
_STEPPED = re.compile(r"s(\d+)((?:_[wtrp]\d+)*)")


def variant_config(name: str) -> dict:
    """A variant's overrides: a name from ``VARIANTS``, or ``s<steps>`` with optional
    ``_w<warps>`` (warps per tile program), ``_t<step>`` (positions per step), ``_r<cap>``
    (register cap; without it none, whatever the table sets) and ``_p<n>`` (steps per loop
    iteration of an interior piece; without it the table's), e.g. ``s4_w4_r64``, ``s8_r80_p1``."""
    if name in VARIANTS:
        return dict(VARIANTS[name])
    m = _STEPPED.fullmatch(name)
    if not m:
        raise KeyError(name)
    out = dict(steps=int(m.group(1)), maxnreg=0)
    keys = {"w": "num_warps", "t": "step", "r": "maxnreg", "p": "piece_steps"}
    for part in filter(None, m.group(2).split("_")):
        out[keys[part[0]]] = int(part[1:])
    return out


#: "NAME" / "NAME+<variant>": the table's / a variant's config run by another version of
#: ``tbe_backward.py`` loaded as NAME (``--impl NAME=FILE``), to time kernel changes against
#: the code before them in the same run
_IMPLS = {"current": tb}
_ACTIVE = ["current"]


def _split(name: str) -> tuple[str, str]:
    """(implementation, variant) of a variant name: "prev+scan8x2_r72" -> ("prev", ...) when
    an implementation "prev" is loaded; names without "+" that are not one run the table's
    config of the current file, or a named variant."""
    impl, plus, variant = name.partition("+")
    if impl in _IMPLS and impl != "current":
        return impl, variant if plus else "table"
    return "current", name


def use_variant(name: str) -> None:
    """Make ``backward_update`` launch with this variant's config (steps, warps, reduction, bag
    order, hot-row blocks, register cap) in the chosen copy of the kernel file."""
    impl, variant = _split(name)
    _ACTIVE[0] = impl
    over = variant_config(variant)
    step = over.pop("step", None)

    def config(info, *, max_dim):
        cfg, table_step = _ORIG_CONFIG(info, max_dim=max_dim)
        return dataclasses.replace(cfg, **over), step or table_step

    for mod in _IMPLS.values():
        mod.backward_config = config if over or step else _ORIG_CONFIG


_ORIG_CONFIG = tb.backward_config


def _restore() -> None:
    for mod in _IMPLS.values():
        mod.backward_config = _ORIG_CONFIG


#: the ``dlrm_dcnv2_h200`` recipe's ids: ``configs/data/synthetic.yaml``'s ``zipf_exponent`` (a
#: test keeps them equal); P(id) ~ (id + 1) ** -1.05 per table, the hottest ids first
RECIPE_ZIPF = 1.05
DISTS = ("uniform", "zipf", "recipe")


def inputs(case: bt.Case, dev, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``case.sets`` (indices, offsets) pairs: bench_tbe's uniform / Zipf(1.15) ids, or for
    ``dist == "recipe"`` the ids the end-to-end recipe trains on (its synthetic data's sampler:
    at the DLRM set 2.4 M distinct rows of 14 M ids, 64 % of the ids on 14.5 K rows seen > 64
    times, against 8.8 M / 1.3 M distinct rows for uniform / Zipf(1.15))."""
    if case.dist != "recipe":
        return bt.make_inputs(case, dev, seed)
    from rocmtrain.data.batch import generator
    from rocmtrain.data.synthetic import PlantedSignal

    sig = PlantedSignal(num_embeddings_per_feature=case.rows, multi_hot_sizes=case.hot,
                        num_dense=1, seed=seed, signal_strength=1.0, num_signal_dense=1,
                        num_signal_sparse=1, zipf_exponent=RECIPE_ZIPF, base_ctr=0.25)  # fmt: skip
    off = bt.bag_offsets(case, dev).to(case.index_dtype)
    sets = []
    for k in range(case.sets):
        ids = sig.sample_ids((case.batch, sum(case.hot)), generator(seed, 10 + k))
        idx = torch.cat([x.reshape(-1) for x in ids])  # feature-major, a bag's ids contiguous
        sets.append((idx.to(dev, case.index_dtype), off))
    return sets


def dlrm_case(rows_cap: int, batch: int, dist: str) -> bt.Case:
    rows = [min(r, rows_cap) for r in bt.DLRM_ROWS]
    return bt.Case("dlrm", rows, 128, list(bt.DLRM_HOT), batch, torch.float32, dist, sets=2)


def make_module(case: bt.Case, dev) -> TableBatchedEmbeddingBags:
    return TableBatchedEmbeddingBags(
        [(r, case.dim) for r in case.rows], optimizer=OptimizerSpec("rowwise_adagrad", lr=bt.LR),
        bounds_check=False, cuda_graph=False, device=dev,
    )  # fmt: skip


def load_impl(name: str, path: str) -> None:
    """Import another version of ``tbe_backward.py`` (e.g. ``git show REV:rocmtrain/kernels/
    tbe_backward.py > /tmp/prev.py``) as a sibling module, so its relative imports resolve,
    and name it ``name`` for the variant names."""
    import importlib.util

    taken = name == "current" or name in VARIANTS or _STEPPED.fullmatch(name)
    if not re.fullmatch(r"[a-z][a-z0-9]*", name) or taken:
        raise SystemExit(f"--impl {name}={path}: NAME must be lowercase letters and digits, "
                         f"not 'current' or a variant name")  # fmt: skip
    if not Path(path).is_file():
        raise SystemExit(f"--impl {name}={path}: no such file (give a copy of tbe_backward.py)")
    spec = importlib.util.spec_from_file_location(f"rocmtrain.kernels._bwd_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _IMPLS[name] = mod


def call(m: TableBatchedEmbeddingBags, grad, idx, off) -> None:
    _IMPLS[_ACTIVE[0]].backward_update(
        m.layout, m.weights.data, m.states(), grad, idx, off, None, pooling="sum",
        spec=m.optimizer, step=1, stochastic_rounding=False, need_psw_grad=False,
        deterministic=False, seed=0,
    )  # fmt: skip


def check(names, dev, small: bt.Case, grad_dtype: torch.dtype) -> dict:
    """Each variant vs the first on the small case: max relative difference of rows and state."""
    idx, off = inputs(small, dev, seed=1)[0]
    base = make_module(small, dev)
    w0, s0 = base.weights.detach().clone(), base.states()["momentum"].clone()
    grad = torch.randn(small.batch, len(small.rows) * small.dim, device=dev).to(grad_dtype)
    out = {}
    ref = None
    for name in names:
        use_variant(name)
        base.weights.data.copy_(w0)
        base.states()["momentum"].copy_(s0)
        call(base, grad, idx, off)
        got = (base.weights.detach().clone(), base.states()["momentum"].clone())
        if ref is None:
            ref = got
        dw = float(((got[0] - ref[0]).abs().max() / ref[0].abs().max()).item())
        dm = float(((got[1] - ref[1]).abs().max() / ref[1].abs().max().clamp(min=1e-30)).item())
        out[name] = {"weights_rel": dw, "state_rel": dm, "ok": dw < 1e-5 and dm < 1e-5}
    return out


def time_case(case: bt.Case, names: list[str], args, dev, timer: bt.Timer) -> dict:
    """Every variant on one table set, in interleaved rounds; kernel split per variant."""
    m = make_module(case, dev)
    sets = inputs(case, dev, seed=2)
    grad = torch.randn(case.batch, len(case.rows) * case.dim, device=dev).to(args.grad_dtype)
    k = [0]

    def fn():
        idx, off = sets[k[0] % len(sets)]
        k[0] += 1
        call(m, grad, idx, off)

    for name in names:  # compile + warm
        use_variant(name)
        for _ in range(args.warmup):
            fn()
    times = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            use_variant(name)
            times[name].append(timer.time(fn))
    base, rows = names[0], {}
    for name in names:
        use_variant(name)
        ratio = [b / t for b, t in zip(times[base], times[name], strict=True)]
        rows[name] = {"ms": bt.summary(times[name]), "speedup_vs_" + base: bt.summary(ratio),
                      "kernels_us": bt.kernel_split(lambda: call(m, grad, *sets[0]), dev)}  # fmt: skip
        print(f"{case.dist:8s} {name:16s} {rows[name]['ms']['median']:.3f} ms "
              f"[{rows[name]['ms']['min']:.3f}-{rows[name]['ms']['max']:.3f}]  "
              f"x{statistics.median(ratio):.2f} vs {base}", flush=True)  # fmt: skip
    return {"ids": int(sets[0][0].numel()), "rows": sum(case.rows), "variants": rows}


def run(args) -> dict:
    dev = torch.device(args.device)
    for spec in args.impl:
        name, eq, path = spec.partition("=")
        if not eq:
            raise SystemExit(f"--impl {spec}: expected NAME=FILE, e.g. prev=/tmp/prev.py")
        load_impl(name, path)
    names = args.variants.split(",") if args.variants else list(VARIANTS)
    unknown = []
    for n in names:
        try:
            variant_config(_split(n)[1])
        except KeyError:
            unknown.append(n)
    if unknown:
        impls = [n for n in _IMPLS if n != "current"]
        raise SystemExit(f"--variants: unknown {unknown}; known: {[*VARIANTS, *impls]}, "
                         f"s<steps>[_w<warps>][_t<step>][_r<regs>] and '<impl>+<variant>' "
                         f"for an implementation loaded with --impl NAME=FILE")  # fmt: skip
    bad = [d for d in args.dists.split(",") if d not in DISTS]
    if bad:
        raise SystemExit(f"--dists: unknown {bad}; use a comma list of {', '.join(DISTS)}")
    res: dict = {"variants": names, "cases": {}, "grad_dtype": str(args.grad_dtype)}
    small = dlrm_case(args.check_rows_cap, args.check_batch, "zipf")
    try:
        res["check"] = check(names, dev, small, args.grad_dtype)
    finally:
        _restore()
    print("check:", json.dumps(res["check"]), flush=True)
    timer = bt.Timer(dev, args.reps)
    try:
        for dist in args.dists.split(","):
            case = dlrm_case(args.rows_cap, args.batch, dist)
            res["cases"][dist] = time_case(case, names, args, dev, timer)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    finally:  # the arch table's config again (the script also runs inside a test process)
        _restore()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--variants", default="", help="comma list (default: all); the first is the base"
    )
    ap.add_argument("--impl", action="append", default=[], metavar="NAME=FILE",
                    help="another tbe_backward.py, timed as variants NAME and NAME+<variant> "
                    "(repeatable)")  # fmt: skip
    ap.add_argument(
        "--dists",
        default="uniform,zipf",
        help=f"comma list of {', '.join(DISTS)} (recipe: the end-to-end recipe's ids)",
    )
    ap.add_argument(
        "--grad-dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="dtype of the pooled-output gradient (the recipe's bf16 run: bfloat16)",
    )
    ap.add_argument("--rows-cap", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--check-rows-cap", type=int, default=100_000)
    ap.add_argument("--check-batch", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3, help="calls per variant before timing")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    args.grad_dtype = getattr(torch, args.grad_dtype)
    if args.cpu_smoke:
        args.device, args.rows_cap, args.batch, args.rounds, args.reps = "cpu", 200, 4, 2, 1
        args.check_rows_cap, args.check_batch, args.warmup = 100, 2, 1
        args.variants = args.variants or "table,dot16x4"
    res = run(args)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bwd_variants.json").write_text(json.dumps(res, indent=1))
    bad = [n for n, c in res["check"].items() if not c["ok"]]
    if bad:
        print("CHECK FAILED:", bad)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
