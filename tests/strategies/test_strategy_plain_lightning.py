"""A plain Lightning script swaps in rocmtrain's strategy (by name, or as an object) and trains on 2
real gloo ranks (Lightning's own launcher re-runs the script for rank 1): it gets the sharding and
everything the CLI gets (environment guard, hang watchdog, exit 75)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("plain_lightning_script.py")


def _run(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "RCCL_PROTO": "LL"}  # folklore knob: must be warned about, never read
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "result.json"), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _warned_fake_knob(stderr: str) -> bool:
    return any("RCCL_PROTO" in line and "NCCL_PROTO" in line for line in stderr.splitlines())


@pytest.mark.parametrize("strategy", ["torchrec_table_wise", "object"])
def test_plain_lightning_script_swaps_the_strategy_in(tmp_path, strategy):
    out = tmp_path / "result.json"
    proc = _run(tmp_path, strategy)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _warned_fake_knob(proc.stderr), proc.stderr[-3000:]
    # the strategy's INFO lines reach a script that configured no logging, once (rank 0's)
    assert proc.stderr.count("sharding plan:") == 1, proc.stderr[-3000:]
    assert "watchdog: rank 0/2" in proc.stderr and "watchdog: rank 1/2" not in proc.stderr
    ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]
    for r, res in enumerate(ranks):
        assert res["rank"] == r and res["world_size"] == 2
        assert res["strategy"] == "TorchRecStrategy"
        # the strategy's protection is its own object: the trainer's callbacks are the user's
        # and Lightning's, as before fit, with nothing of rocmtrain's added (or left behind)
        assert res["callbacks_after"] == res["callbacks_before"], res["callbacks_after"]
        assert any(name.endswith("UserCallback") for name in res["callbacks_after"])
        assert not any(name.startswith("rocmtrain.") for name in res["callbacks_after"])
        assert all(kind == "table_wise" and len(rs) == 1 for kind, rs in res["plan"].values())
        # this rank materialised only its own tables: the others have no local shard
        own = {t for t, (_, rs) in res["plan"].items() if rs == [r]}
        have = {k.split(".")[-2] for k, shards in res["local_shards"].items() if shards}
        assert have == own and 0 < len(own) < 4
        losses = res["losses"]
        assert len(losses) == 2 * 2048 // 64 // 2  # 2 epochs, each rank gets half the batches
        # the label is a function of f0's id: the sharded embedding must learn it
        assert sum(losses[-4:]) / 4 < 0.5 * sum(losses[:4]) / 4, losses
        # the strategy ended the process group before interpreter teardown could abort the rank
        at_exit = json.loads(Path(f"{out}.exit.rank{r}").read_text())
        assert at_exit == {"initialized_at_exit": False}


@pytest.mark.parametrize(
    ("strategy", "stall", "limit_s"),
    [
        # hang_timeout_seconds=15 from the first step on
        ("object", "stall=3", 150),
        # by name, defaults: after 20 steps the timeout is learned (10 x slowest step, floor 60 s)
        ("torchrec_table_wise", "stall=24", 240),
    ],
)
def test_plain_lightning_script_names_the_stuck_rank_and_exits_75(
    tmp_path, strategy, stall, limit_s
):
    start = time.monotonic()
    proc = _run(tmp_path, strategy, stall, timeout=limit_s + 120)
    took = time.monotonic() - start
    assert proc.returncode == 75, proc.stderr[-3000:]
    report = (tmp_path / "hang_report.txt").read_text()
    assert "stuck rank(s): [1]" in report, report
    assert "stuck rank(s): [1]" in proc.stderr
    # start-up (imports, 2 ranks, gloo, planner) + the hang timeout + report, on a loaded 2-core box
    assert took < limit_s, took
    assert _warned_fake_knob(proc.stderr)


def test_rank_0_failing_alone_exits_1_not_killed(tmp_path):
    """Rank 0 raises and ends its peer; its own cleanup takes a few seconds. Lightning's child
    watcher must not then SIGKILL it for the peer it ended itself (137 reads as an OOM kill)."""
    proc = _run(tmp_path, "object", "raise0", timeout=200)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "rank 0 fails alone" in proc.stderr
