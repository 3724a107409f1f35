"""Helpers for the strategy tests: run a function on N real gloo ranks (torch.multiprocessing
spawn), each rank a normal Lightning process (``LOCAL_RANK`` etc. set, as a launcher would)."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn: Callable[..., Any], world: int, port: int, out: str, args: tuple) -> None:
    # what Lightning's own launcher / torchrun / srun hand each rank
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world),
        NODE_RANK="0",
        LOCAL_RANK=str(rank),
        RANK=str(rank),
    )
    import torch

    torch.set_num_threads(1)
    result = fn(rank, *args)
    torch.save(result, Path(out) / f"result_{rank}.pt")


def run_ranks(fn: Callable[..., Any], world: int = 2, *args: Any) -> list[Any]:
    """Run ``fn(rank, *args)`` on ``world`` spawned ranks; returns each rank's return value."""
    import torch

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_entry, args=(fn, world, free_port(), out, args), nprocs=world, join=True)
        return [torch.load(Path(out) / f"result_{r}.pt", weights_only=False) for r in range(world)]
