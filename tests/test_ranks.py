"""rocmtrain.ranks: the one parser of the launcher's rank variables."""

from __future__ import annotations

import pytest

from rocmtrain.ranks import global_rank, is_launching_rank


@pytest.mark.parametrize(
    ("env", "rank"),
    [
        ({}, 0),
        ({"RANK": "3", "SLURM_PROCID": "5", "LOCAL_RANK": "1"}, 3),  # torchrun / Lightning first
        ({"SLURM_PROCID": "5", "LOCAL_RANK": "1"}, 5),  # then a Slurm task
        ({"LOCAL_RANK": "1"}, 1),
        ({"RANK": ""}, 0),
    ],
)
def test_global_rank(env, rank) -> None:
    assert global_rank(env) == rank
    assert is_launching_rank(env) is (rank == 0)
