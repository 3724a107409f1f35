"""fault_callbacks inside a real 2-rank Lightning DDP fit (gloo): a rank stalled in training_step
is named with its step and phase, and every rank exits 75; a rank that raises a real-format HIP OOM
gets the hint and the other rank leaves with 1 (a requeue would not fix it), both within seconds."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import wd_worker

from rocmtrain import exit_codes


def _join(procs, timeout_s: float) -> float:
    start = time.monotonic()
    for p in procs:
        p.join(max(1.0, timeout_s - (time.monotonic() - start)))
    for p in procs:
        if p.exitcode is None:
            p.kill()
            pytest.fail("a rank did not exit")
    return time.monotonic() - start


def _logs(run_dir: Path) -> str:
    return "\n".join(
        f"--- {f.name}\n{f.read_text()[-3000:]}" for f in sorted(run_dir.glob("log_rank*.txt"))
    )


@pytest.mark.slow
def test_lightning_stall_is_reported_with_step_and_phase(tmp_path: Path) -> None:
    procs = wd_worker.start_lightning(2, tmp_path, fault="stall", fault_rank=1, fault_step=5)
    _join(procs, 180)
    assert [p.exitcode for p in procs] == [exit_codes.REQUEUE] * 2, _logs(tmp_path)
    report = json.loads((tmp_path / "hang_report.json").read_text())
    assert (report["cause"], report["stuck_ranks"], report["stuck_steps"]) == (
        "stall",
        [1],
        {"1": 5},
    )
    by_rank = {e["rank"]: e for e in report["ranks"]}
    assert by_rank[1]["phase"] == "train_batch"  # stuck inside training_step (forward)
    assert by_rank[0]["phase"] in ("backward", "after_backward")  # waiting in DDP's all-reduce
    assert "in stall_here" in by_rank[1]["stack_excerpt"]


@pytest.mark.slow
def test_lightning_exception_gives_hint_and_peer_exits_failure(tmp_path: Path) -> None:
    procs = wd_worker.start_lightning(2, tmp_path, fault="raise", fault_rank=1, fault_step=3)
    _join(procs, 180)
    # rank 1 raised (Python exits 1); rank 0 sees "failed:RuntimeError" and exits 1, not 75
    assert [p.exitcode for p in procs] == [exit_codes.FAILURE] * 2, _logs(tmp_path)
    hint = (tmp_path / "error_hint_rank1.txt").read_text()
    assert "out_of_memory" in hint and "tried=3.31 GiB" in hint
    report = json.loads((tmp_path / "hang_report.json").read_text())
    assert (report["cause"], report["stuck_ranks"]) == ("peer_failed", [1])
    assert "rocmtrain hint: out_of_memory" in (tmp_path / "log_rank1.txt").read_text()
