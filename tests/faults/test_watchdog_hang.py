"""The watchdog on real gloo process groups: a stalled rank, a SIGKILLed rank, no false positives.

Every case runs 2-3 real rank processes (``wd_worker.py``) with a real gloo group, a real TCPStore
(or the files channel) and the real monitor threads; nothing is mocked.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import wd_worker

from rocmtrain import exit_codes


def _join(procs, timeout_s: float) -> list[float]:
    """Join every process; returns their exit times (monotonic). Kills leftovers and fails."""
    deadline = time.monotonic() + timeout_s
    exited = [0.0] * len(procs)
    while any(p.exitcode is None for p in procs):
        for i, p in enumerate(procs):
            if p.exitcode is None:
                p.join(0.05)
                if p.exitcode is not None:
                    exited[i] = time.monotonic()
        if time.monotonic() > deadline:
            for p in procs:
                if p.exitcode is None:
                    p.kill()
            pytest.fail(f"ranks still running after {timeout_s} s: {[p.exitcode for p in procs]}")
    return exited


def _logs(run_dir: Path) -> str:
    return "\n".join(
        f"--- {f.name}\n{f.read_text()[-3000:]}" for f in sorted(run_dir.glob("log_rank*.txt"))
    )


STALLS = [
    # (world, stalled rank, learned timeout, channel); "every" = every rank monitors
    pytest.param(3, 1, False, "tcpstore-every", id="3ranks-rank1-every-rank-monitors"),
    pytest.param(3, 0, False, "tcpstore", id="3ranks-rank0-hosts-store"),
    pytest.param(3, 2, False, "files", id="3ranks-rank2-files-channel"),
    pytest.param(2, 1, True, "tcpstore", id="2ranks-rank1-learned-timeout"),
    pytest.param(2, 0, False, "files", id="2ranks-rank0-files-channel"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("world", "stalled", "learn", "channel"), STALLS)
def test_stalled_rank_is_named_and_all_exit_requeue(
    tmp_path: Path, world: int, stalled: int, learn: bool, channel: str
) -> None:
    timeout = 3.0
    procs = wd_worker.start_ranks(
        world,
        tmp_path,
        mode="stall",
        stall_rank=stalled,
        stall_step=30,
        timeout=timeout,
        learn=learn,
        floor=2.0,
        channel=channel.removesuffix("-every"),
        every=channel.endswith("-every"),
        steps=10_000,
    )
    exits = _join(procs, 120)
    codes = [p.exitcode for p in procs]
    assert codes == [exit_codes.REQUEUE] * world, _logs(tmp_path)

    stall_started = float((tmp_path / "stall_started").read_text())
    wall_now, mono_now = time.time(), time.monotonic()
    last_exit_wall = wall_now - (mono_now - max(exits))
    assert last_exit_wall - stall_started <= timeout + 10, (
        f"took {last_exit_wall - stall_started:.1f} s"
    )

    report = json.loads((tmp_path / "hang_report.json").read_text())
    assert report["cause"] == "stall"
    assert report["stuck_ranks"] == [stalled]
    assert report["stuck_steps"] == {str(stalled): 30}
    by_rank = {e["rank"]: e for e in report["ranks"]}
    assert all(e["answered"] for e in report["ranks"]), report
    assert by_rank[stalled]["phase"] == "forward"
    assert all(by_rank[r]["phase"] == "all_reduce" for r in by_rank if r != stalled)
    # the stalled rank's own stack dump shows where it is; the others wait in all_reduce
    assert "in stall_here" in Path(by_rank[stalled]["stacks_file"]).read_text()
    for r in by_rank:
        if r != stalled:
            assert "in all_reduce" in Path(by_rank[r]["stacks_file"]).read_text()
    # gloo flight recorder (torch >= 2.8): the others already issued one more collective
    seq = {r: e["last"]["collective_seq_id"] for r, e in by_rank.items()}
    assert all(seq[r] == seq[stalled] + 1 for r in seq if r != stalled), seq
    text = (tmp_path / "hang_report.txt").read_text()
    assert f"stuck rank(s): [{stalled}]" in text and "in stall_here" in text


@pytest.mark.slow
@pytest.mark.parametrize("killed", [1, 0], ids=["kill-rank1", "kill-rank0-store-host"])
def test_sigkilled_rank_survivors_exit_within_timeout(tmp_path: Path, killed: int) -> None:
    timeout, world = 5.0, 3
    procs = wd_worker.start_ranks(world, tmp_path, mode="forever", timeout=timeout)
    deadline = time.monotonic() + 90
    while not all((tmp_path / f"ready_rank{r}").exists() for r in range(world)):
        assert time.monotonic() < deadline, _logs(tmp_path)
        assert all(p.exitcode is None for p in procs), _logs(tmp_path)
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(procs[killed].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    procs[killed].join()
    survivors = [p for r, p in enumerate(procs) if r != killed]
    exits = _join(survivors, 60)
    assert max(exits) - killed_at < timeout, f"survivors took {max(exits) - killed_at:.1f} s"
    assert [p.exitcode for p in survivors] == [exit_codes.REQUEUE] * (world - 1), _logs(tmp_path)
    reports = [json.loads(f.read_text()) for f in tmp_path.glob("hang_report*.json")]
    assert reports, _logs(tmp_path)
    for rep in reports:
        assert rep["cause"] == "peer_exited", rep["summary"]
        assert rep["stuck_ranks"] == [killed]


@pytest.mark.slow
@pytest.mark.parametrize(
    "opts",
    [
        pytest.param(
            dict(timeout=2.0, learn=False, hiccup_every=100, hiccup_s=1.0),
            id="fixed-2s-with-1s-hiccups",
        ),
        pytest.param(dict(timeout=5.0, learn=True, floor=1.5), id="learned-floor-1.5s"),
    ],
)
def test_no_false_positive_over_600_jittered_steps(tmp_path: Path, opts: dict) -> None:
    world, steps = 2, 600
    procs = wd_worker.start_ranks(
        world, tmp_path, mode="run", steps=steps, step_ms=5.0, poll=0.1, **opts
    )
    _join(procs, 120)
    assert [p.exitcode for p in procs] == [0] * world, _logs(tmp_path)
    assert [int((tmp_path / f"done_rank{r}").read_text()) for r in range(world)] == [steps] * world
    assert not list(tmp_path.glob("hang_report*"))
