"""2 real gloo ranks: a same-size bit flip in the newest checkpoint's rank-1 DCP shard is caught by
its sha256 on resume; the rerun warns naming the checkpoint and the file, and resumes from the
previous checkpoint, training the same steps as the first run did from there.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from dist_ranks import run_ranks
from test_strategy_resume import BATCHES, _cfg, _fit

pytestmark = pytest.mark.slow

NEWEST, PREVIOUS = "step-000000010", "step-000000008"


def _first_run(rank: int, root: str) -> list[float]:
    # stops after step 10 (mid epoch 2): checkpoints at steps 4, 8 (interval) and 10 (stop)
    return _fit(_cfg(Path(root)), max_steps=BATCHES + 4)["losses"]


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _rerun(rank: int, root: str) -> dict:
    from rocmtrain.train import resume_path

    collect = _Collect()
    logging.getLogger("rocmtrain.checkpoint").addHandler(collect)
    cfg = _cfg(Path(root))
    found = resume_path(cfg)  # what `python -m rocmtrain` resumes from (checkpoint.resume=auto)
    losses = _fit(cfg, ckpt_path=found)["losses"]
    return dict(found=found, warnings=collect.messages, losses=losses)


def _flip_bit(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    file.write_bytes(bytes(data))


def test_corrupt_newest_checkpoint_resumes_from_the_previous(tmp_path: Path) -> None:
    first = run_ranks(_first_run, 2, str(tmp_path))
    checkpoints = tmp_path / "checkpoints"
    shard = checkpoints / NEWEST / "__1_0.distcp"
    size = shard.stat().st_size
    _flip_bit(shard)
    assert shard.stat().st_size == size  # sizes alone cannot tell
    for rank, r in enumerate(run_ranks(_rerun, 2, str(tmp_path))):
        assert r["found"] == str(checkpoints / PREVIOUS), (rank, r["found"])
        said = "\n".join(r["warnings"])
        assert f"skipping checkpoint {checkpoints / NEWEST}" in said, said
        assert "__1_0.distcp is corrupt" in said, said
        # resumed at step 8: steps 8 and 9 are the first run's steps 8 and 9, bit for bit
        assert r["losses"][:2] == first[rank][8:10], (rank, r["losses"], first[rank])
        assert len(r["losses"]) == 2 * BATCHES - 8
