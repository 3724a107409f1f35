"""scripts/bench/bench_tbe.py runs end to end on CPU (tiny sizes) with its fp64 checks passing,
with and without fbgemm_gpu importable."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "bench_tbe.py"


def _load(monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_tbe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_tbe", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.parametrize("hide_fbgemm", [False, True])
def test_bench_tbe_cpu_quick(tmp_path, monkeypatch, hide_fbgemm):
    if hide_fbgemm:
        monkeypatch.setitem(sys.modules, "fbgemm_gpu", None)  # import fails like a missing wheel
    bench = _load(monkeypatch)
    argv = ["--cpu-smoke", "--no-dlrm", "--only", "float32 D=16 L=1 uniform",
            "--out", str(tmp_path)]  # fmt: skip
    assert bench.main(argv) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    rows = data["results"]
    provs = {r["provider"] for r in rows if r["ms"]}
    assert {"ours", "torch_dense", "torch_sparse"} <= provs
    assert ("fbgemm" in provs) is not hide_fbgemm
    ours = next(r for r in rows if r["provider"] == "ours" and r["mode"] == "fwd")
    assert ours["checks"]["fwd"] < 1e-6 and ours["checks"]["step"] < 1e-6
    # >= 2 interleaved rounds per provider, median inside [min, max], ratios per round
    assert len(ours["rounds"]) == data["meta"]["rounds"] >= 2
    assert ours["ms"]["min"] <= ours["ms"]["median"] <= ours["ms"]["max"]
    assert "torch_dense" in ours["ratios"]
    assert ("fbgemm" in ours["ratios"]) is not hide_fbgemm
    assert data["meta"]["copy_gbps"]["median"] > 0
    md = (tmp_path / "results.md").read_text()
    assert "| float32 D=16 L=1 uniform | fwd+bwd+adagrad |" in md
    assert ("fbgemm_gpu is not importable" in md) is hide_fbgemm
    assert "judged by the ratio's lower bound" in md and "[" in md


@pytest.mark.slow
def test_bench_targets_use_the_lower_bound(monkeypatch):
    """A ratio whose median meets the target but whose lower bound does not is MISSED."""
    bench = _load(monkeypatch)
    big = bench.TARGET_CASES[0]

    def res(prov, rounds):
        return bench.Result(big, prov, "fwd+bwd+sgd", bench.summary(rounds), rounds=rounds)

    ours, fb = res("ours", [1.0, 1.0, 1.0, 1.0, 1.0]), res("fbgemm", [1.3, 1.3, 1.3, 1.3, 1.0])
    ours.ratios["fbgemm"] = bench.summary(
        [a / b for a, b in zip(fb.rounds, ours.rounds, strict=True)]
    )
    lines = bench.targets([ours, fb])
    line = next(x for x in lines if x.startswith(f"- ours {big} fwd+bwd+sgd"))
    assert "MISSED" in line and "1.30x" in line  # median 1.3 >= 1.1, lower bound 1.0 < 1.1


def test_torch_reference_provider_takes_the_batch_from_its_inputs(monkeypatch):
    """The correctness check runs a smaller batch than the timed one (at most 2048 bags): the
    torch providers must read B from the offsets (a multi-table case once indexed past them)."""
    import torch

    bench = _load(monkeypatch)
    case = bench.Case("t", [50, 40, 30], 8, [1, 3, 2], 64, torch.float32, "uniform", sets=1)
    small = bench.Case("t", case.rows, 8, case.hot, 16, torch.float32, "uniform", sets=1)
    idx, off = bench.make_inputs(small, torch.device("cpu"), seed=3)[0]
    torch_eb = bench.TorchEB(case, torch.device("cpu"), sparse=True)
    want = bench.reference_forward(torch_eb.weights(), small, 16, idx)
    got = torch_eb.fwd(idx, off)
    assert got.shape == (16, 3 * 8)
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-6, atol=1e-6)


def test_reading_reps_make_a_reading_last_long_enough(monkeypatch):
    """Calls per reading grow until the fastest provider's reading lasts --min-reading-ms (real
    CPU timer, a 1 ms call), never below --reps nor above --max-reps; 0 turns it off."""
    import argparse
    import time

    import torch

    bench = _load(monkeypatch)
    timer = bench.Timer(torch.device("cpu"), reps=2)
    fns = [lambda: time.sleep(0.001), lambda: time.sleep(0.003)]
    args = argparse.Namespace(reps=2, min_reading_ms=10.0, max_reps=500)
    assert 3 <= bench.reading_reps(timer, fns, args) <= 10  # from the 1 ms one: >= 1 ms a call
    args.max_reps = 4
    assert bench.reading_reps(timer, fns, args) <= 4
    args.min_reading_ms = 0.0
    assert bench.reading_reps(timer, fns, args) == 2


@pytest.mark.slow
def test_autotune_report_pairs_prefetch_twins(monkeypatch):
    """``--autotune``'s report on the CPU (interpreter, one tiny case): every candidate timed in
    each round, sorted by median, and each tile whose bag takes two steps paired with its
    prefetch twin, whose per-round ratio is the twin's reading over the tile's."""
    import torch

    bench = _load(monkeypatch)
    case = bench.Case("float32 D=16 L=4 zipf", [500], 16, [4], 16, torch.float32, "zipf")
    rows = bench.autotune_report(case, torch.device("cpu"), rounds=2)
    assert [r["ms"]["median"] for r in rows] == sorted(r["ms"]["median"] for r in rows)
    assert sum(r["table"] for r in rows) == 1
    for r in rows:
        assert r["ms"]["min"] <= r["ms"]["median"] <= r["ms"]["max"]
        paired = 2 * r["block_l"] <= 4
        assert (r["twin_over_this"] is not None) is paired, r
        if paired:
            twin = next(
                t
                for t in rows
                if t["prefetch"] != r["prefetch"]
                and all(t[k] == r[k] for k in ("bags", "block_l", "num_warps", "waves_per_eu"))
            )
            assert twin["twin_over_this"] is not None
            # the two ratios are per-round reciprocals: their medians multiply to about 1
            assert 0.5 < r["twin_over_this"]["median"] * twin["twin_over_this"]["median"] < 2.0
