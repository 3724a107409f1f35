"""What reaches the loggers and the progress bar without costing a step host time.

Lightning writes step values to the loggers only on every ``trainer.log_every_n_steps``-th step
(:func:`loggers_write`), and turns every value logged with ``prog_bar=True`` into a Python number
at the end of EVERY training step from then on, a host sync per step on a GPU. So rocmtrain logs
on the writing steps only, to the loggers, and its bar (:class:`HostMetricsProgressBar`) shows a
module's ``progress_metrics`` (``DLRMModule``: loss of the last logging step, samples/s), read on
the host when the bar refreshes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import TQDMProgressBar


def loggers_write(trainer: pl.Trainer) -> bool:
    """Whether Lightning writes this training step's logged values (call inside the step, before
    the optimizer step): the rule of its logger connector (``should_update_logs``)."""
    return (trainer.global_step + 1) % max(1, trainer.log_every_n_steps) == 0 or trainer.should_stop


def write_step_metrics_now(trainer: pl.Trainer) -> None:
    """Write this training step's logged values to the loggers now, from ``on_train_batch_end``,
    and skip Lightning's own write of them that follows the step's hooks.

    A checkpoint saved in ``on_train_batch_end`` would otherwise exist on disk before the row of
    its step does: a process killed in between resumes after that step, and the row is lost for
    good. Callers write first, then save. Uses the logger connector's private method (as
    Lightning's loop does); a Lightning without it writes the rows after the save, as before."""
    conn = getattr(trainer, "_logger_connector", None)
    write = getattr(conn, "update_train_step_metrics", None)
    if write is None or "update_train_step_metrics" in vars(conn):
        return  # not this Lightning, or written already this step

    def skip_once() -> None:
        del conn.update_train_step_metrics

    write()
    conn.update_train_step_metrics = skip_once


def after_epoch_metrics_written(trainer: pl.Trainer, action: Callable[[], None]) -> None:
    """Run ``action`` (an epoch-end checkpoint) right after Lightning writes the epoch's logged
    values to the loggers, not now.

    Lightning calls the callbacks' ``on_train_epoch_end`` before the LightningModule's, where
    epoch rows are logged (``DLRMModule``: train loss and AUC, the validation metrics, samples/s),
    and writes those rows after both: a checkpoint saved in the callback's hook existed on disk
    before the epoch's row did, and a process killed in between resumed past an epoch whose row
    no attempt had written. The action runs with the loop's counters as the epoch-end hooks saw
    them (Lightning lowers the stepped-batch count by one around its write so the epoch row
    shares the last step's index). Uses the logger connector's private method, as Lightning's
    loop does; on a Lightning without it the action runs now."""
    conn = getattr(trainer, "_logger_connector", None)
    write = getattr(conn, "update_train_epoch_metrics", None)
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    if write is None or not hasattr(loop, "_batches_that_stepped"):
        action()
        return
    if "update_train_epoch_metrics" in vars(conn):  # one deferred action per epoch end
        return

    def write_then_act() -> None:
        del conn.update_train_epoch_metrics
        write()
        loop._batches_that_stepped += 1
        try:
            action()
        finally:
            loop._batches_that_stepped -= 1

    conn.update_train_epoch_metrics = write_then_act


class HostMetricsProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` that adds the module's ``progress_metrics`` (host floats)."""

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        extra = getattr(pl_module, "progress_metrics", None)
        if isinstance(extra, dict):
            metrics.update({k: f"{v:.4g}" for k, v in extra.items()})
        return metrics
