"""host_profile.py's summary: only the samples inside a step count, compiling ones do not.

The input is py-spy's raw format as py-spy 0.4 writes it (``Class.method (file:line)`` frames,
outermost first, then the sample count).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "bench"))

import host_profile  # noqa: E402

STEP = "_TrainingEpochLoop.advance (pytorch_lightning/loops/training_epoch_loop.py:{})"
RAW = "\n".join(
    [
        f"main (x.py:1);{STEP.format(300)};Adagrad.step (torch/optim/adagrad.py:10) 30",
        f"main (x.py:1);{STEP.format(301)};ShardedEmbeddingBagCollection.input_dist "
        "(torchrec/distributed/embeddingbag.py:5);_get_recat (torchrec/distributed/dist_data.py:145) 50",
        f"main (x.py:1);{STEP.format(300)};_compile (torch/_dynamo/convert_frame.py:9) 900",
        f"main (x.py:1);{STEP.format(302)};DLRMModule._record (rocmtrain/models/module.py:120) 20",
        "main (x.py:1);Trainer.fit (pytorch_lightning/trainer/trainer.py:1) 400",
    ]
)


def test_summary_counts_the_step_samples_that_are_not_compiling() -> None:
    stacks = host_profile.parse_raw(RAW)
    assert sum(c for _, c in stacks) == 1400
    md = host_profile.summarise(stacks, step_frame="advance")
    assert "100 samples inside `advance` and not compiling, of 1400 in all." in md
    # one row per function: the step frame's three line numbers are one function
    assert (
        "| `_TrainingEpochLoop.advance` | pytorch_lightning/loops/training_epoch_loop.py | 100.0 % |"
        in md
    )
    assert "| `_get_recat` | torchrec/distributed/dist_data.py | 50.0 % | 50.0 % |" in md
    assert "| torchrec | 50.0 % |" in md and "| rocmtrain | 20.0 % |" in md
    assert "| torch.optim | 30.0 % |" in md
    assert "_compile" not in md


def test_summary_says_which_frame_to_pass_when_nothing_matched() -> None:
    md = host_profile.summarise(host_profile.parse_raw(RAW), step_frame="training_step")
    assert "No sample inside a `training_step` frame" in md and "--step-frame" in md
