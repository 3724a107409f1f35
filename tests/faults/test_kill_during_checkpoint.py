"""A job SIGKILLed while writing a checkpoint: the previous checkpoint stays loadable and the
resumed job loads it (``rocmtrain.checkpoint``: temp folder + completion marker + rename).

Real processes: 2 gloo ranks write step 1, then start step 2 (128 MB, so the write takes a while);
the moment step 2's temp folder holds data but no marker, both ranks get SIGKILL (what Slurm does
to a job at its time limit). Two fresh ranks then run ``find_resume`` + ``read_sharded``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import wd_worker

from rocmtrain import checkpoint as ckpt


@pytest.mark.slow
def test_kill_mid_write_keeps_previous_checkpoint_and_resume_loads_it(tmp_path: Path) -> None:
    world = 2
    writers = wd_worker.start_ckpt(world, tmp_path, mode="write", numel=32 * 2**20)
    tmp = tmp_path / "ckpts" / f".{ckpt.checkpoint_name(2)}.tmp"
    deadline = time.monotonic() + 120
    while not (tmp.is_dir() and any(f.suffix == ".distcp" for f in tmp.iterdir())):
        assert all(p.exitcode is None for p in writers), [p.exitcode for p in writers]
        assert time.monotonic() < deadline, "step 2 never started writing"
        time.sleep(0.005)
    for p in writers:
        os.kill(p.pid, signal.SIGKILL)
    for p in writers:
        p.join()
    assert not list(tmp_path.glob("wrote_all_rank*")), "the write finished before the kill: retry"
    assert tmp.is_dir() and not (tmp / ckpt.MARKER).exists()  # killed mid-write
    assert not (tmp_path / "ckpts" / ckpt.checkpoint_name(2)).exists()
    assert ckpt.find_resume(tmp_path / "ckpts") == tmp_path / "ckpts" / ckpt.checkpoint_name(1)

    loaders = wd_worker.start_ckpt(world, tmp_path, mode="load", numel=0)
    for p in loaders:
        p.join(120)
    assert [p.exitcode for p in loaders] == [0] * world
    for r in range(world):
        got = json.loads((tmp_path / f"loaded_rank{r}.json").read_text())
        assert got["path"] == ckpt.checkpoint_name(1)
        assert got["w"] == [1.0]  # step 1's values, not zeros and not step 2's
        assert got["mine"] == [r + 10.0] * 4
        assert (got["own"]["global_step"], got["own"]["rank"]) == (1, r)
