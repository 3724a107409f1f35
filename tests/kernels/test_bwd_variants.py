"""scripts/bench/bwd_variants.py on the CPU: the variants agree with each other, and the JSON holds
every round, the ratio against the first variant and the per-case shape the BENCHMARKS tables use;
a second copy of the kernel file runs as variant "prev"."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))


def test_bwd_variants_cpu_smoke(tmp_path):
    import bwd_variants

    import rocmtrain.kernels.tbe_backward as tb

    config = tb.backward_config
    # "prev" = another copy of the kernel file, loaded as its own module (here: this one)
    argv = ["--cpu-smoke", "--dists", "zipf", "--variants", "table,dot16x4,s4_w1,prev,prev+s4_w1",
            "--prev-file", tb.__file__, "--out", str(tmp_path)]  # fmt: skip
    assert bwd_variants.main(argv) == 0
    assert bwd_variants._IMPLS["prev"] is not tb  # a separate module, its own kernels
    res = json.loads((tmp_path / "bwd_variants.json").read_text())
    assert res["variants"] == ["table", "dot16x4", "s4_w1", "prev", "prev+s4_w1"]
    assert all(c["ok"] for c in res["check"].values()), res["check"]
    case = res["cases"]["zipf"]
    assert case["ids"] == 4 * 214  # B x the MLPerf multi-hot sizes
    for name in res["variants"]:
        row = case["variants"][name]
        assert row["ms"]["min"] <= row["ms"]["median"] <= row["ms"]["max"]
        assert row["speedup_vs_table"]["min"] > 0
    assert case["variants"]["table"]["speedup_vs_table"]["median"] == 1.0
    assert tb.backward_config is config  # the arch table's config again for later tests
