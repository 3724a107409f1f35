"""Experiment wrapper (not shipped): bwd_variants at the recipe's ids without torchrec.

Ran on the H200 as ``exp/bwd_exp.py`` from the repository root (so ``ROOT`` = ``parents[1]``); kept
here as the record of what ran, not as a maintained benchmark.
"""

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts/bench"))
import bench_tbe as bt  # noqa
import bwd_variants as bv  # noqa

_orig = bv.inputs


def inputs(case, dev, seed):
    if case.dist != "recipe":
        return _orig(case, dev, seed)
    g = torch.Generator(device=dev).manual_seed(seed)
    sets = []
    off = bt.bag_offsets(case, dev).to(case.index_dtype)
    for _k in range(case.sets):
        parts = []
        for n, L in zip(case.rows, case.hot, strict=False):
            u = torch.rand(case.batch * L, generator=g, device=dev, dtype=torch.float64)
            a = bv.RECIPE_ZIPF
            x = torch.pow(1.0 + u * ((n + 1.0) ** (1.0 - a) - 1.0), 1.0 / (1.0 - a))
            parts.append(torch.clamp(x.to(torch.int64) - 1, 0, n - 1))
        sets.append((torch.cat(parts).to(case.index_dtype), off))
    return sets


bv.inputs = inputs
raise SystemExit(bv.main(sys.argv[1:]))
