"""The per-rank rules of resuming on another world size (no process group needed): the RNG of a
rank the checkpoint has no state for, and Lightning's batch counters moved with the data."""

from __future__ import annotations

import random

import numpy as np
import torch

from rocmtrain import checkpoint_reshard as reshard


def _saved_rng() -> dict:
    torch.manual_seed(7)
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def test_new_rank_rng_is_a_function_of_rank_zero_state_and_rank():
    saved = _saved_rng()
    a, b, again = (
        reshard.derived_rng(saved, 2),
        reshard.derived_rng(saved, 3),
        reshard.derived_rng(saved, 2),
    )
    assert torch.equal(a["torch"], again["torch"]) and a["python"] == again["python"]
    assert not torch.equal(a["torch"], b["torch"])
    assert not torch.equal(a["torch"], saved["torch"])
    torch.set_rng_state(a["torch"])
    first = torch.rand(3)
    torch.set_rng_state(again["torch"])
    assert torch.equal(first, torch.rand(3))
    other = _saved_rng()
    other["torch"] = torch.Generator().manual_seed(8).get_state()
    assert not torch.equal(reshard.derived_rng(other, 2)["torch"], a["torch"])


def test_batch_counters_shift_with_the_data_position():
    counters = {"ready": 3, "started": 3, "processed": 3, "completed": 2}
    extras = {
        "loops": {
            "fit_loop": {
                "epoch_loop.batch_progress": {
                    "current": dict(counters),
                    "total": {k: v + 10 for k, v in counters.items()},
                }
            }
        }
    }
    reshard._move_batch_counters(extras, 3, 7)
    progress = extras["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    assert progress["current"] == {"ready": 7, "started": 7, "processed": 7, "completed": 6}
    assert progress["total"]["completed"] == 16
