"""scripts/bench/tbe_host_cost.py on the CPU: host time per call for each mode, no call that
waited for the device, and a cProfile table of distinct functions."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))


def test_tbe_host_cost_cpu_smoke(tmp_path):
    import tbe_host_cost

    assert tbe_host_cost.main(["--cpu-smoke", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "tbe_host_cost.json").read_text())
    assert set(res) == {"fwd sgd", "fwd+bwd sgd", "fwd+bwd rowwise_adagrad"}
    for row in res.values():
        assert 0 < row["host_us"]["median"] <= row["host_us"]["max"]
        assert row["host_us"]["blocked"] == []  # nothing on the CPU waits 50 ms
    own = [r["fn"] for r in res["fwd+bwd sgd"]["top"]]
    assert len(own) == len(set(own)) > 0
    cum = {r["fn"]: r["cum_us"] for r in res["fwd+bwd sgd"]["top"]}
    assert all(v >= 0 for v in cum.values())
