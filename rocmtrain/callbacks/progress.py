"""What reaches the loggers and the progress bar without costing a step host time.

Lightning writes step values to the loggers only on every ``trainer.log_every_n_steps``-th step
(:func:`loggers_write`), and turns every value logged with ``prog_bar=True`` into a Python number
at the end of EVERY training step from then on, a host sync per step on a GPU. So rocmtrain logs
on the writing steps only, to the loggers, and its bar (:class:`HostMetricsProgressBar`) shows a
module's ``progress_metrics`` (``DLRMModule``: loss of the last logging step, samples/s), read on
the host when the bar refreshes.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import TQDMProgressBar


def loggers_write(trainer: pl.Trainer) -> bool:
    """Whether Lightning writes this training step's logged values (call inside the step, before
    the optimizer step): the rule of its logger connector (``should_update_logs``)."""
    return (trainer.global_step + 1) % max(1, trainer.log_every_n_steps) == 0 or trainer.should_stop


class HostMetricsProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` that adds the module's ``progress_metrics`` (host floats)."""

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        extra = getattr(pl_module, "progress_metrics", None)
        if isinstance(extra, dict):
            metrics.update({k: f"{v:.4g}" for k, v in extra.items()})
        return metrics
