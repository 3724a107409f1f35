"""Two-phase process-group timeouts: long for init and the first step, short in steady state.

The strategy creates the process group with ``timeout=rccl.init_timeout_seconds`` (long: RCCL
communicator creation, the planner, compilation and the first all-to-all can take minutes). After
the first training step every rank passes a barrier — proof that all of them are alive and in step —
and :func:`enter_steady_state` switches every process group to ``rccl.train_timeout_seconds``, so a
later hang surfaces in minutes instead of half an hour (torchtitan does the same).

PyTorch has no public setter; ``torch.distributed.distributed_c10d._set_pg_timeout(timeout, group)``
(present since torch 2.4, unchanged in 2.13) sets the default timeout of the group's gloo and NCCL
backends for every later collective. It only affects collectives issued afterwards.

::

    enter_steady_state(rccl_cfg)                     # by hand, after step 1, on every rank
    Trainer(callbacks=[TwoPhaseTimeoutCallback(rccl_cfg)])   # or let the callback do it
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytorch_lightning as pl
import torch.distributed as dist

from rocmtrain.config.rccl import RcclConfig

log = logging.getLogger(__name__)


def _setter() -> Any:
    fn = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if fn is None:
        raise RuntimeError(
            "this torch has no torch.distributed.distributed_c10d._set_pg_timeout (added in 2.4); "
            "upgrade torch or set watchdog.two_phase_timeouts=false"
        )
    return fn


def all_process_groups() -> list[dist.ProcessGroup]:
    """The default group first, then every other group this rank belongs to."""
    default = dist.distributed_c10d._get_default_group()
    others = [
        pg
        for pg in list(dist.distributed_c10d._world.pg_map)
        if pg is not default and pg is not dist.GroupMember.NON_GROUP_MEMBER
    ]
    return [default, *others]


def set_process_group_timeout(
    seconds: float, *, groups: list[dist.ProcessGroup] | None = None
) -> int:
    """Set the collective timeout of ``groups`` (default: all of this rank's groups); returns how many."""
    if not seconds > 0:
        raise ValueError(f"timeout seconds={seconds!r} is invalid: use a positive number")
    setter = _setter()
    groups = all_process_groups() if groups is None else groups
    for pg in groups:
        setter(timedelta(seconds=seconds), pg)
    return len(groups)


def enter_steady_state(rccl_cfg: RcclConfig, *, barrier: bool = True) -> float:
    """Barrier (under the long init timeout), then the short ``train_timeout_seconds`` everywhere.

    Call on every rank at the same point (collective). Returns the new timeout in seconds.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return rccl_cfg.train_timeout_seconds
    if barrier:
        dist.barrier()
    n = set_process_group_timeout(rccl_cfg.train_timeout_seconds)
    log.info(
        "process-group timeout: %.0f s (init) -> %.0f s (steady state) on %d group(s)",
        rccl_cfg.init_timeout_seconds,
        rccl_cfg.train_timeout_seconds,
        n,
    )
    return rccl_cfg.train_timeout_seconds


class TwoPhaseTimeoutCallback(pl.Callback):
    """After the first completed training step: barrier + switch to the steady-state timeout."""

    def __init__(self, rccl_cfg: RcclConfig) -> None:
        self._rccl = rccl_cfg
        self.switched = False

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if not self.switched:
            enter_steady_state(self._rccl)
            self.switched = True
