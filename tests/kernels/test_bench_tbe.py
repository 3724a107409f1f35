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
    argv = ["--device", "cpu", "--quick", "--no-dlrm", "--rows", "500", "--batch", "16",
            "--only", "float32 D=16 L=1 uniform", "--out", str(tmp_path)]  # fmt: skip
    assert bench.main(argv) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    rows = data["results"]
    provs = {r["provider"] for r in rows if r["ms"]}
    assert {"ours", "torch_dense", "torch_sparse"} <= provs
    assert ("fbgemm" in provs) is not hide_fbgemm
    ours = next(r for r in rows if r["provider"] == "ours" and r["mode"] == "fwd")
    assert ours["checks"]["fwd"] < 1e-6 and ours["checks"]["step"] < 1e-6
    md = (tmp_path / "results.md").read_text()
    assert "| float32 D=16 L=1 uniform | fwd+bwd+adagrad |" in md
    assert ("fbgemm_gpu is not importable" in md) is hide_fbgemm
