"""Experiment (not shipped): forward tiles per bag-length class at the recipe's ids.

Ran on the H200 as ``exp/fwd_exp.py`` from the repository root (so ``ROOT`` = ``parents[1]``); kept
here as the record of what ran, not as a maintained benchmark.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts/bench"))
import bwd_variants as bv  # noqa
from rocmtrain.kernels import TableBatchedEmbeddingBags, tbe_forward as tf  # noqa
from rocmtrain.kernels.arch import forward_candidates, forward_config  # noqa

# eviction-hint variant of the forward kernel, as a sibling module
src = (ROOT / "rocmtrain/kernels/tbe_forward.py").read_text()
v = src.replace("tl.load(indices_ptr", 'tl.load(eviction_policy="evict_first", pointer=indices_ptr')
v = v.replace(
    "tl.load(\n            weights_ptr",
    'tl.load(eviction_policy="evict_last", pointer=\n            weights_ptr',
)
assert v.count("evict_first") == 3 and v.count("evict_last") == 1, (
    v.count("evict_first"),
    v.count("evict_last"),
)
(ROOT / "rocmtrain/kernels/_tfv.py").write_text(v)
from rocmtrain.kernels import _tfv  # noqa

T0 = time.time()
LIMIT = float(os.environ.get("LIMIT", 300))
dev = torch.device("cuda")
case = bv.dlrm_case(10_000_000, 65536, "recipe")


def recipe_ids(case, dev, seed=5, a=bv.RECIPE_ZIPF):
    g = torch.Generator(device=dev).manual_seed(seed)
    parts = []
    for n, L in zip(case.rows, case.hot, strict=False):
        u = torch.rand(case.batch * L, generator=g, device=dev, dtype=torch.float64)
        top = (n + 1.0) ** (1.0 - a)
        x = torch.pow(1.0 + u * (top - 1.0), 1.0 / (1.0 - a))
        parts.append(torch.clamp(x.to(torch.int64) - 1, 0, n - 1))
    return torch.cat(parts), bt.bag_offsets(case, dev)


import bench_tbe as bt  # noqa

idx, off = recipe_ids(case, dev)
u = torch.unique(
    idx
    + torch.repeat_interleave(
        torch.arange(len(case.hot), device=dev) * 10**8,
        torch.tensor(case.hot, device=dev) * case.batch,
    )
)
print("ids", idx.numel(), "distinct", u.numel(), flush=True)
m = TableBatchedEmbeddingBags(
    [(r, 128) for r in case.rows],
    output_dtype=torch.bfloat16,
    bounds_check=False,
    backend="triton",
    device=dev,
)
lay, w, B = m.layout, m.weights.data, case.batch
out = torch.empty(B, lay.total_dim, dtype=torch.bfloat16, device=dev)
info = tf._device_info(0)
res = {"ids": idx.numel(), "classes": {}}


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")


with torch.no_grad():
    ref = m(idx, off).float()
    res["module_default_ms"] = [bench(lambda: m(idx, off)) for _ in range(3)]
    res["module_groups"] = [(g[0].tolist(), g[1]) for g in m._groups[str(m.weights.device)]]
    res["tuned"] = {str(k): str(c) for k, c in tf._TUNED.items()}
print("module", res["module_default_ms"], res["module_groups"], flush=True)

classes = {}
for f, L in enumerate(case.hot):
    classes.setdefault(L, []).append(f)
order = sorted(classes, key=lambda L: -L * len(classes[L]))
for L in order:
    fs = classes[L]
    feats = torch.tensor(fs, dtype=torch.int32, device=dev)
    cands = forward_candidates(info, max_dim=128, avg_len=float(L), elem_bytes=4, wide=True)
    rows = []
    for mod in (tf, _tfv):
        for c in cands if mod is tf else [r[0] for r in sorted(rows, key=lambda r: r[1])[:4]]:
            if time.time() - T0 > LIMIT:
                break

            def fn(c=c, mod=mod, feats=feats):
                return mod._launch(c, lay, w, idx, off, None, out, "sum", B, feats, 128)

            try:
                ms = bench(fn)
            except Exception as e:  # noqa
                print("fail", c, e, flush=True)
                continue
            if mod is tf:
                rows.append((c, ms))
            else:
                res["classes"].setdefault(str(L), {}).setdefault("evict", []).append((str(c), ms))
    rows.sort(key=lambda r: r[1])
    base = forward_config(info, max_dim=128, avg_len=float(L), elem_bytes=4)
    bms = [ms for c, ms in rows if c == base]
    d = res["classes"].setdefault(str(L), {})
    d.update(
        feats=fs,
        ids=L * len(fs) * B,
        table=str(base),
        table_ms=bms[0] if bms else None,
        best=[(str(c), ms) for c, ms in rows[:5]],
        n=len(rows),
    )
    print(
        L,
        fs,
        "table",
        d["table_ms"],
        "best",
        d["best"][:2],
        "evict",
        d.get("evict", [])[:2],
        flush=True,
    )
    (Path(os.environ.get("OUT", "/tmp")) / "fwd_exp.json").write_text(json.dumps(res, indent=1))
# correctness of the last launches (whole output written by per-class launches)
with torch.no_grad():
    for L in order:
        c = forward_config(info, max_dim=128, avg_len=float(L), elem_bytes=4)
        tf._launch(
            c,
            lay,
            w,
            idx,
            off,
            None,
            out,
            "sum",
            B,
            torch.tensor(classes[L], dtype=torch.int32, device=dev),
            128,
        )
    res["max_abs_err"] = float((out.float() - ref).abs().max())
print("err", res["max_abs_err"], "time", time.time() - T0)
(Path(os.environ.get("OUT", "/tmp")) / "fwd_exp.json").write_text(json.dumps(res, indent=1))
