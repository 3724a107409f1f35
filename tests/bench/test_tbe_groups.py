"""scripts/bench/tbe_groups.py on the CPU (Triton interpreter): the equality gate between the
grouped and the one-tile module passes, the first batch's groups are the DLRM set's one-hot and
multi-hot features, and every provider has a reading per round and mode."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the interpreter")
def test_tbe_groups_cpu_smoke(tmp_path):
    import bench_tbe as bt
    import tbe_groups

    assert tbe_groups.main(["--cpu-smoke", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "tbe_groups.json").read_text())
    assert res["gate"]["ok"] and res["ids"] == 4 * sum(bt.DLRM_HOT)
    onehot = [f for f, n in enumerate(bt.DLRM_HOT) if n == 1]
    multi = [f for f, n in enumerate(bt.DLRM_HOT) if n > 1]
    assert [ids for ids, _ in res["groups"]] == [onehot, multi]
    assert res["groups"][1][1] == pytest.approx(sum(bt.DLRM_HOT[f] for f in multi) / len(multi))
    for mode in tbe_groups.MODES:
        rows = res["modes"][mode]
        assert set(rows) == {"grouped", "one_tile"}  # no FBGEMM on the CPU
        for r in rows.values():
            assert 0 < r["ms"]["min"] <= r["ms"]["median"] <= r["ms"]["max"]
        assert rows["grouped"]["over_grouped"]["median"] == 1.0
