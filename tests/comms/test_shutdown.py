"""The process group ends before the interpreter does: real gloo ranks in fresh interpreters, and
an exit handler registered before ours (exit handlers run last-registered first) that records
what it finds after ours ran."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

WORKER = textwrap.dedent(
    """
    import atexit, json, sys
    import torch, torch.distributed as dist
    from rocmtrain.comms.shutdown import close_at_exit

    out, rank, world, init, register = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]

    def observe():  # registered first, so it runs after every later handler
        with open(f"{out}.rank{rank}", "w") as f:
            json.dump({"initialized_at_exit": dist.is_initialized()}, f)
        if dist.is_initialized():  # keep the control run from aborting at teardown
            dist.destroy_process_group()

    atexit.register(observe)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    for _ in range(int(register)):
        close_at_exit()
    got = [torch.empty(1) for _ in range(world)]
    dist.all_gather(got, torch.tensor([float(rank)]))
    assert [int(t) for t in got] == list(range(world))
    """
)


def _run_ranks(tmp_path: Path, world: int, register: int) -> list[dict]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "exit.json"
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(out), str(r), str(world), init, str(register)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(world)]


@pytest.mark.parametrize("register", [1, 2])
def test_close_at_exit_destroys_the_group_before_the_interpreter_ends(tmp_path, register):
    # registering twice (a second fit in the process) still closes once and exits cleanly
    ranks = _run_ranks(tmp_path, world=3, register=register)
    assert [r["initialized_at_exit"] for r in ranks] == [False, False, False]


def test_without_close_at_exit_the_group_outlives_the_exit_handlers(tmp_path):
    # the observer can see a live group: the assertion above is not vacuous
    ranks = _run_ranks(tmp_path, world=2, register=0)
    assert [r["initialized_at_exit"] for r in ranks] == [True, True]
