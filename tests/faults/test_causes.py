"""The cause table: every cause the classifier reports has a row, and the row decides the exit."""

from __future__ import annotations

from rocmtrain import exit_codes
from rocmtrain.faults import causes
from rocmtrain.faults.hang_report import classify
from rocmtrain.faults.heartbeat import Heartbeat
from rocmtrain.faults.hints import hint_for


def _beat(rank: int, step: int, phase: str = "train_batch") -> Heartbeat:
    return Heartbeat(rank=rank, step=step, beat_in_step=0, phase=phase, collective="", seq=0,
                     wall_time=0.0, timeout_s=10.0, pid=1, host="h", pid_ns="n")  # fmt: skip


def test_every_row_has_next_steps_and_an_exit_code() -> None:
    for row in causes.CAUSES.values():
        assert row.next_steps, row.name
        expected = exit_codes.REQUEUE if row.requeue else exit_codes.FAILURE
        assert row.exit_code() == expected
    assert causes.PEER_FAILED.exit_code(99) == exit_codes.FAILURE
    assert causes.STALL.exit_code(99) == 99


def test_classifier_names_only_causes_of_the_table() -> None:
    seen = {
        classify({0: _beat(0, 3), 1: _beat(1, 2)}, world_size=2, dead=set(), stale=set())["cause"],
        classify({0: _beat(0, 3)}, world_size=2, dead={1}, stale=set())["cause"],
        classify(
            {0: _beat(0, 3), 1: _beat(1, 3, "failed:ValueError")},
            world_size=2,
            dead=set(),
            stale=set(),
        )["cause"],  # fmt: skip
    }
    assert seen == {"stall", "peer_exited", "peer_failed"} and seen <= set(causes.CAUSES)


def test_hint_rules_say_whether_a_failure_is_communication() -> None:
    assert hint_for("Connection reset by peer").comm
    assert hint_for("Timed out waiting 1000ms for recv operation to complete").comm
    assert not hint_for("HIP out of memory. Tried to allocate 2.00 GiB").comm
