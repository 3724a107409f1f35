"""A plain Lightning script selects ``strategy="torchrec_table_wise"`` by name and trains on 2
real gloo ranks (Lightning's own launcher re-runs the script for rank 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("plain_lightning_script.py")


def test_plain_lightning_script_uses_strategy_by_name(tmp_path):
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "torchrec_table_wise"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]
    for r, res in enumerate(ranks):
        assert res["rank"] == r and res["world_size"] == 2
        assert res["strategy"] == "TorchRecStrategy"
        assert all(kind == "table_wise" and len(rs) == 1 for kind, rs in res["plan"].values())
        # this rank materialised only its own tables: the others have no local shard
        own = {t for t, (_, rs) in res["plan"].items() if rs == [r]}
        have = {k.split(".")[-2] for k, shards in res["local_shards"].items() if shards}
        assert have == own and 0 < len(own) < 4
        losses = res["losses"]
        assert len(losses) == 2 * 2048 // 64 // 2  # 2 epochs, each rank gets half the batches
        # the label is a function of f0's id: the sharded embedding must learn it
        assert sum(losses[-4:]) / 4 < 0.5 * sum(losses[:4]) / 4, losses
