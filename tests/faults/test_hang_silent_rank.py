"""A rank stopped (SIGSTOP, a debugger) while its peers wait for it in a collective: every rank's
heartbeat shows the same step and phase, but only the peers' watchdog threads answer the dump
request. The report names the silent rank, not every rank (found by ``scripts/chaos.py``)."""

from __future__ import annotations

from rocmtrain.faults import hang_report as hr
from rocmtrain.faults.heartbeat import Heartbeat


def _hb(rank: int) -> Heartbeat:
    return Heartbeat(
        rank=rank, step=34, beat_in_step=3, phase="barrier", collective="", seq=343,
        wall_time=0.0, timeout_s=4.0, pid=100 + rank, host="h", pid_ns="",
    )  # fmt: skip


def test_the_rank_that_does_not_answer_is_the_stuck_one() -> None:
    beats = {r: _hb(r) for r in range(3)}
    same = hr.classify(beats, world_size=3, dead=set(), stale={0, 1, 2})
    assert same["stuck_ranks"] == [0, 1, 2]  # the heartbeats alone cannot tell them apart
    d = hr.refine_with_answers(same, answered={1, 2})
    assert (d["cause"], d["stuck_ranks"]) == ("stall", [0])
    assert "[0] stopped answering" in d["summary"] and "[1, 2] answered" in d["summary"]


def test_answers_change_nothing_when_they_cannot_tell() -> None:
    same = hr.classify({r: _hb(r) for r in range(2)}, world_size=2, dead=set(), stale={0, 1})
    assert hr.refine_with_answers(same, answered={0, 1}) == same  # all answered: a network hang
    assert hr.refine_with_answers(same, answered=set()) == same  # none answered: no evidence
    behind = {"cause": "stall", "stuck_ranks": [1], "summary": "rank 1 behind"}
    assert hr.refine_with_answers(behind, answered={0}) == behind  # one rank already named
    gone = {"cause": "peer_exited", "stuck_ranks": [0, 1], "summary": "gone"}
    assert hr.refine_with_answers(gone, answered={1}) == gone
