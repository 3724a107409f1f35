"""This process's rank, read from the launcher's environment (one parser for the whole package).

Lightning and torchrun set ``RANK``, a Slurm task has ``SLURM_PROCID``, and a rank started with
only a local rank has ``LOCAL_RANK``; the first one present wins. Before any launcher ran (the
command a user typed) none is set: rank 0.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def global_rank(env: Mapping[str, str] | None = None) -> int:
    """Global rank from ``env`` (default ``os.environ``); 0 before any launcher set one."""
    env = os.environ if env is None else env
    return int(env.get("RANK", env.get("SLURM_PROCID", env.get("LOCAL_RANK", "0"))) or 0)


def is_launching_rank(env: Mapping[str, str] | None = None) -> bool:
    """True in the process that launches the run (global rank 0 of Lightning, torchrun or Slurm)."""
    return global_rank(env) == 0
