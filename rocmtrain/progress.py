"""The progress bar of ``python -m rocmtrain``: Lightning's TQDM bar plus host-side numbers.

Values a module logs with ``prog_bar=True`` are turned into Python numbers by Lightning at the end
of every training step, a host sync per step on a GPU. Modules with a ``progress_metrics``
property (``DLRMModule``: loss of the last logging step, samples/s) show those instead, read on
the host when the bar refreshes.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import TQDMProgressBar


class HostMetricsProgressBar(TQDMProgressBar):
    """``TQDMProgressBar`` that adds the module's ``progress_metrics`` (host floats)."""

    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)
        extra = getattr(pl_module, "progress_metrics", None)
        if isinstance(extra, dict):
            metrics.update({k: f"{v:.4g}" for k, v in extra.items()})
        return metrics
