"""``DLRMModule``: the LightningModule of rocmtrain's recipes (loss, AUC, NE, samples/s).

    module = DLRMModule(ModelConfig())          # tables on meta: train it under TorchRecStrategy
    trainer = pl.Trainer(strategy="torchrec", accelerator="cpu", devices=2, max_epochs=1)
    trainer.fit(module, datamodule=dm)           # dm yields torchrec.datasets.utils.Batch
    module.history                               # [{"epoch", "train_loss", "val_auc", ...}]

Only the dense (MLP) parameters go to ``configure_optimizers``; the embeddings are updated by
TorchRec's fused optimizer inside the backward (``apply_optimizer_in_backward``), so their
parameters are filtered out with ``in_backward_optimizer_filter``. Metrics are torchmetrics
objects (synced across ranks when computed); AUC is exact with ``model.auc_num_thresholds=null``
(the default) and binned (``rocmtrain.metrics.BinnedBinaryAUROC``) with a number. Per-epoch
summaries are printed on rank 0.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
import torchmetrics
from torchrec.datasets.utils import Batch
from torchrec.optim.optimizers import in_backward_optimizer_filter

from rocmtrain.callbacks.progress import loggers_write
from rocmtrain.callbacks.throughput import STEADY_KEY
from rocmtrain.config.model import ModelConfig
from rocmtrain.metrics import BinnedBinaryAUROC, NormalizedEntropy
from rocmtrain.models.dlrm import (
    apply_embedding_optimizer,
    build_dlrm,
    dense_optimizer,
    mark_step,
    warn_without_cuda_graphs,
)

_FLUSH_EVERY = 256
"""Per-step loss records are copied to the host in groups of this many steps."""


class DLRMModule(pl.LightningModule):
    """DLRM on TorchRec; ``forward(dense, kjt) -> logits [B]``."""

    def __init__(
        self, cfg: ModelConfig, *, dense_device: torch.device | None = None, verbose: bool = True
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.verbose = verbose
        self.model = build_dlrm(cfg, dense_device=dense_device)
        apply_embedding_optimizer(self.model, cfg)
        thresholds = cfg.auc_num_thresholds
        # nan_strategy="disable": the default NaN check syncs with the GPU on every update (a NaN
        # loss still shows: it makes the epoch mean NaN)
        self.train_loss = torchmetrics.MeanMetric(nan_strategy="disable")
        self.val_loss = torchmetrics.MeanMetric(nan_strategy="disable")
        # exact AUC when thresholds is None (torchmetrics' own update); binned with an O(B)
        # update otherwise (same values as BinaryAUROC(thresholds=T), no T-step loop per batch)
        self.train_auc = BinnedBinaryAUROC(thresholds=thresholds)
        self.val_auc = BinnedBinaryAUROC(thresholds=thresholds)
        self.val_ne = NormalizedEntropy()
        self.history: list[dict[str, float]] = []
        self._step_losses: list[float] = []
        self._step_label_sums: list[float] = []
        self._pending_steps: list[torch.Tensor] = []  # [loss, label sum] per step, not yet on host
        self._restored_losses: list[float] = []  # steps before the checkpoint this fit resumed
        self._restored_label_sums: list[float] = []
        self._last_val: dict[str, float] = {}
        self._t0 = 0.0
        self._t_last = 0.0
        self._samples = 0

    def forward(self, batch: Batch) -> torch.Tensor:
        """Logits ``[B]`` of a ``Batch`` (one input, so TorchRec's pipeline can trace it)."""
        return self.model(batch.dense_features, batch.sparse_features).squeeze(-1)

    def _step(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        mark_step(self.cfg)
        logits = self(batch)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, logits

    # -- training ----------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        if self.trainer.is_global_zero:
            warn_without_cuda_graphs(self.cfg, self.device)

    def on_train_start(self) -> None:
        # a fit resumed inside an epoch gets no on_train_epoch_start for that epoch: its rate
        # counts from here, over the batches this fit trains
        self.on_train_epoch_start()

    def on_train_epoch_start(self) -> None:
        self._t0 = self._t_last = time.perf_counter()
        self._samples = 0

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        loss, logits = self._step(batch)
        self._record(loss, logits, batch.labels)
        return loss

    @property
    def step_losses(self) -> list[float]:
        """Local (this rank's) training loss of every step, in order (tests compare these)."""
        self._flush_steps()
        return self._step_losses

    @property
    def step_label_sums(self) -> list[float]:
        """Sum of the labels of every training step (tests check the data order with it)."""
        self._flush_steps()
        return self._step_label_sums

    #: per-rank checkpoint key of the run's per-step record (see :attr:`run_step_losses`)
    STEP_RECORD_KEY = "rocmtrain_step_record"

    @property
    def run_step_losses(self) -> list[float]:
        """This rank's training loss of every step of the *run*, resumes included: the steps
        restored from the checkpoint this fit resumed from, then this fit's own
        (:attr:`step_losses` holds only this fit's). Checkpoints carry it, so a run requeued
        many times still has the loss of every step it trained, each from the attempt whose
        state the run continued from."""
        return self._restored_losses + self.step_losses

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[self.STEP_RECORD_KEY] = {
            "loss": self.run_step_losses,
            "label_sum": self._restored_label_sums + self.step_label_sums,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        record = checkpoint.get(self.STEP_RECORD_KEY) or {}  # absent in older checkpoints
        self._restored_losses = list(record.get("loss", ()))
        self._restored_label_sums = list(record.get("label_sum", ()))

    def _flush_steps(self) -> None:
        # one host copy per _FLUSH_EVERY steps instead of a GPU sync per step
        if self._pending_steps:
            rows = torch.stack(self._pending_steps).double().cpu().tolist()
            self._pending_steps = []
            self._step_losses.extend(row[0] for row in rows)
            self._step_label_sums.extend(row[1] for row in rows)

    def _record(self, loss: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor) -> None:
        detached = loss.detach()
        label_sum = labels.detach().sum().float()
        self._pending_steps.append(torch.stack([detached.float(), label_sum]))
        if len(self._pending_steps) >= _FLUSH_EVERY:
            self._flush_steps()
        self.train_loss.update(detached)
        self.train_auc.update(torch.sigmoid(logits.detach()), labels.long())
        batch_size = int(labels.shape[0])
        self._samples += batch_size
        # On the writing steps only and not to the bar: each self.log costs host time a
        # host-bound GPU step pays, and a bar value is a host sync every step (rocmtrain.callbacks.progress)
        if loggers_write(self.trainer):
            self.log("loss", detached, on_step=True, on_epoch=False, batch_size=batch_size)
            self._flush_steps()  # the loggers sync at this step anyway

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._t_last = time.perf_counter()

    @property
    def progress_metrics(self) -> dict[str, float]:
        """Host-side numbers for the progress bar (no device sync): samples/s of this epoch and
        the loss of the last step copied to the host (at the last logging step)."""
        out: dict[str, float] = {}
        if self._step_losses:
            out["loss"] = self._step_losses[-1]
        if self._t_last > self._t0 and self._samples:
            world = self.trainer.world_size if self._trainer is not None else 1
            out["samples/s"] = self._samples * world / (self._t_last - self._t0)
        return out

    def on_train_epoch_end(self) -> None:
        if not self._samples:  # resumed at this epoch's end: it trained no batch in this run
            self.train_loss.reset()
            self.train_auc.reset()
            return
        elapsed = max(self._t_last - self._t0, 1e-9)
        whole = self._samples * self.trainer.world_size / elapsed
        steady = _steady_rate(self.trainer)
        row = {
            "epoch": float(self.current_epoch),
            "train_loss": float(self.train_loss.compute()),
            "train_auc": float(self.train_auc.compute()),
            # the steady-state rate (rocmtrain.callbacks.throughput: after warm-up, the benchmarks' number)
            # when the epoch had windows; else the whole epoch's, warm-up included
            "samples_per_s": whole if steady is None else steady,
            "samples_per_s_epoch": whole,
            **self._last_val,
        }
        self.train_loss.reset()
        self.train_auc.reset()
        # values are already reduced over ranks (torchmetrics); sync_dist averages equal values
        self.log_dict({k: v for k, v in row.items() if k != "epoch"}, sync_dist=True, batch_size=1)
        self.history.append(row)
        self._last_val = {}
        if self.verbose:  # rank 0 only, through the progress bar so lines do not interleave
            self.print(format_epoch(row, self.trainer.max_epochs))

    # -- validation --------------------------------------------------------------------------
    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        loss, logits = self._step(batch)
        probs = torch.sigmoid(logits)
        self.val_loss.update(loss, weight=batch.labels.shape[0])
        self.val_auc.update(probs, batch.labels.long())
        self.val_ne.update(logits, batch.labels)

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:
            for metric in (self.val_loss, self.val_auc, self.val_ne):
                metric.reset()
            return
        self._last_val = {
            "val_loss": float(self.val_loss.compute()),
            "val_auc": float(self.val_auc.compute()),
            "val_ne": float(self.val_ne.compute()),
        }
        for metric in (self.val_loss, self.val_auc, self.val_ne):
            metric.reset()
        if not self.trainer.training:  # trainer.validate(): log here, no train epoch end follows
            self.log_dict(self._last_val, sync_dist=True, batch_size=1)

    # -- optimizers --------------------------------------------------------------------------
    def configure_optimizers(self) -> torch.optim.Optimizer:
        # After sharding, the embedding parameters carry an in-backward (fused) optimizer.
        dense = dict(in_backward_optimizer_filter(self.named_parameters()))
        return dense_optimizer(list(dense.values()), self.cfg)


def _steady_rate(trainer: pl.Trainer) -> float | None:
    """This epoch's steady-state samples/s logged by ``ThroughputCallback`` (None: no window)."""
    value = trainer.callback_metrics.get(STEADY_KEY)
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def format_epoch(row: dict[str, float], max_epochs: int | None = None) -> str:
    """One line per epoch: ``epoch 2/3: train_loss=0.4512 train_auc=0.7801 val_loss=...``; the
    rate is the steady-state one, or marked ``(whole epoch)`` when the epoch was all warm-up."""
    rates = ("epoch", "samples_per_s", "samples_per_s_epoch")
    parts = [f"{k}={v:.4f}" for k, v in row.items() if k not in rates]
    if "samples_per_s" in row:
        whole = row["samples_per_s"] == row.get("samples_per_s_epoch")
        parts.append(f"samples/s={row['samples_per_s']:,.0f}" + (" (whole epoch)" if whole else ""))
    total = f"/{max_epochs}" if max_epochs and max_epochs > 0 else ""
    return f"epoch {int(row['epoch']) + 1}{total}: " + " ".join(parts)


class PipelinedDLRMModule(DLRMModule):
    """``DLRMModule`` trained through one of TorchRec's own train pipeline classes.

    Not needed for pipelining: the strategy pipelines ``DLRMModule`` (and any ordinary module)
    itself, with ``strategy.pipeline=sparse_dist|semi_sync|auto``. This module is for comparing
    against TorchRec's own ``TrainPipelineSparseDist`` and ``TrainPipelineSemiSync``, which own
    the data iterator.

    The pipeline starts the input all-to-all of batch i+1 (and the host-to-device copy of batch
    i+2, on GPU streams) while batch i computes. It owns the data iterator, so this module uses
    Lightning's ``training_step(self, dataloader_iter)`` form with manual optimization; the
    pipeline calls the (Lightning-wrapped) dense optimizer itself and the embedding update stays
    fused in the backward. At the end of an epoch the batches still queued in the pipeline are
    trained before Lightning closes the epoch, so every batch is trained exactly once, in order.
    It drives ``TrainPipelineSemiSync`` under ``strategy.pipeline=semi_sync``, else
    ``TrainPipelineSparseDist``.
    """

    #: TorchRecStrategy calls training_step directly (not through the DMP/DDP wrapper): the
    #: step runs the wrapped model itself, once per pipelined batch.
    calls_model_itself = True

    def __init__(self, cfg: ModelConfig, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.automatic_optimization = False
        self._pipeline: Any = None

    def _pipeline_fwd(self, batch: Batch) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        mark_step(self.cfg)
        logits = self.trainer.strategy.model(batch)  # DMP -> DDP -> self.forward
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)

    def _new_pipeline(self) -> Any:
        # TrainPipelineSparseDist, or TrainPipelineSemiSync for strategy.pipeline=semi_sync
        return self.trainer.strategy.make_train_pipeline(
            self.optimizers(), execute_all_batches=True, custom_model_fwd=self._pipeline_fwd
        )

    def training_step(self, dataloader_iter: Any) -> None:  # type: ignore[override]
        if self._pipeline is None:
            self._pipeline = self._new_pipeline()  # one per fit; detached between epochs
        dmp = self.trainer.strategy.dmp
        if not dmp.training:  # Lightning's validation sets trainer.model (the DMP) to eval and
            dmp.train()  # restores only this module; the pipeline skips backward in eval mode
        batches = (item[0] if isinstance(item, tuple) else item for item in dataloader_iter)
        self._progress(batches)
        if self.trainer.fit_loop._data_fetcher.done:  # source exhausted: drain the queue
            while self._progress(iter(())):
                pass
            self._detach()  # validation runs next, with the plain forward

    def _progress(self, batches: Any) -> bool:
        try:
            loss, logits, labels = self._pipeline.progress(batches)
        except StopIteration:
            return False
        self._record(loss, logits, labels)
        # The pipeline pulls up to 2 batches ahead and Lightning calls no batch-transfer hook in
        # the dataloader_iter form: count the batch just trained on, so a mid-epoch checkpoint
        # saves the position of the next batch to train, not of the next one fetched.
        mark_consumed = getattr(self.trainer.datamodule, "mark_consumed", None)
        if mark_consumed is not None:
            mark_consumed()
        return True

    def _detach(self) -> None:
        # back to the plain forward (validation) and an empty queue; the next progress()
        # re-attaches and refills from the new epoch's iterator
        if self._pipeline is not None:
            self._pipeline.detach()
            self._pipeline.reset()

    def on_validation_epoch_start(self) -> None:
        # Mid-epoch validation (val_check_interval < 1 epoch) is not supported here: the
        # batches queued in the pipeline would be dropped. Epoch-end validation is fine.
        self._detach()

    def on_train_epoch_end(self) -> None:
        self._detach()  # stopped early (max_steps): drop the queue
        super().on_train_epoch_end()
