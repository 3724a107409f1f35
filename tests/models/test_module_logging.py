"""DLRMModule logs nothing to Lightning's progress bar during training steps.

Lightning turns every progress-bar value into a Python number at the end of EVERY training step,
from the step it was first logged on (``_ResultCollection.metrics`` -> ``convert_tensors_to_scalars``;
a logged float becomes a device tensor first): on a GPU a host sync per step, which stops the host
from queueing the next step ahead of the GPU. Real Lightning fit through the strategy (1 CPU
rank); the conversion function is wrapped (it still runs) to record when a tensor is converted.
The loss still reaches the logger at its interval, with the values the module trained on, and the
progress bar gets host-side numbers (``progress_metrics``).
"""

from __future__ import annotations

import csv
import dataclasses
import os
import socket

import pytest

pytestmark = pytest.mark.slow

STEPS, EVERY = 9, 3


def test_loss_reaches_the_logger_without_a_sync_per_step(tmp_path, monkeypatch):
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.loggers import CSVLogger
    from pytorch_lightning.trainer.connectors.logger_connector import result

    import rocmtrain
    from rocmtrain.callbacks.progress import HostMetricsProgressBar
    from rocmtrain.config.data import DataConfig
    from rocmtrain.config.model import ModelConfig
    from rocmtrain.data import build_datamodule
    from rocmtrain.models.module import DLRMModule

    converted_at: list[int] = []
    original = result.convert_tensors_to_scalars

    def spy(data):
        if any(
            isinstance(v, torch.Tensor)
            for v in (data.values() if isinstance(data, dict) else [data])
        ):
            converted_at.append(trainer.global_step)
        return original(data)

    monkeypatch.setattr(result, "convert_tensors_to_scalars", spy)
    # this process hosts the rendezvous: on a free port, given back after the test
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(sock.getsockname()[1]))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    cfg = dataclasses.replace(
        ModelConfig(),
        num_embeddings_per_feature=[50, 40],
        embedding_dim=8,
        dense_arch_layer_sizes=[8, 8],
        over_arch_layer_sizes=[8, 1],
    )
    pl.seed_everything(0, verbose=False)
    dm = build_datamodule(
        DataConfig(kind="synthetic", batch_size=32, num_train_batches=STEPS, num_val_batches=1),
        num_embeddings_per_feature=cfg.table_rows(),
        multi_hot_sizes=None,
        num_dense=13,
        seed=0,
    )
    module = DLRMModule(cfg, verbose=False)
    trainer = pl.Trainer(
        strategy=rocmtrain.TorchRecStrategy(watchdog=None),
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        limit_val_batches=0,
        log_every_n_steps=EVERY,
        logger=CSVLogger(tmp_path, name="", version=""),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    saved_env = dict(os.environ)  # Lightning sets WORLD_SIZE, LOCAL_RANK ... in this process
    try:
        trainer.fit(module, datamodule=dm)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved_env)
    # no progress-bar tensor was converted to a number during the training steps
    assert [s for s in converted_at if s < STEPS] == []
    rows = [r for r in csv.DictReader((tmp_path / "metrics.csv").open()) if r.get("loss")]
    logged = {int(r["step"]): float(r["loss"]) for r in rows}
    assert sorted(logged) == [EVERY * k - 1 for k in range(1, STEPS // EVERY + 1)]
    losses = module.step_losses
    for step, value in logged.items():
        assert value == pytest.approx(losses[step], rel=1e-6)
    # the progress bar's numbers come from the host
    shown = module.progress_metrics
    assert shown["loss"] == losses[-1] and shown["samples/s"] > 0
    bar = HostMetricsProgressBar().get_metrics(trainer, module)
    assert float(bar["loss"]) == pytest.approx(losses[-1], rel=1e-3) and "samples/s" in bar
