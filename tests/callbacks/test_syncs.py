"""The sync report: call sites grouped and counted (CPU), real sync-debug capture in a fit (GPU)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from rocmtrain.callbacks import monitor_callbacks
from rocmtrain.callbacks.syncs import SYNC_WARNING, SyncRecorder, SyncReportCallback
from rocmtrain.config.monitor import MonitorConfig


def _sync_here() -> None:
    warnings.warn(f"{SYNC_WARNING} (from a test)", UserWarning, stacklevel=1)


def _other_site() -> None:
    _sync_here()


def test_recorder_groups_call_sites_and_passes_other_warnings_on() -> None:
    rec = SyncRecorder(debug_mode=False)
    with warnings.catch_warnings(record=True) as outer:
        warnings.simplefilter("always")
        rec.start()
        for _ in range(3):
            _sync_here()
        _other_site()
        warnings.warn("an unrelated warning", UserWarning, stacklevel=1)
        rec.stop()
        _sync_here()  # after stop: not recorded
    doc = rec.report(steps=2)
    assert doc["syncs"] == 4 and doc["syncs_per_step"] == 2.0
    counts = [s["count"] for s in doc["sites"]]
    assert counts == [3, 1]
    # the innermost frame is the caller of warnings.warn; the second site went through _other_site
    assert "(_sync_here)" in doc["sites"][0]["stack"][-1]
    assert "(_other_site)" in doc["sites"][1]["stack"][-2]
    texts = [str(w.message) for w in outer]
    assert "an unrelated warning" in texts  # passed on to the previous handler
    assert sum(SYNC_WARNING in t for t in texts) == 1  # only the one after stop()


def test_sync_report_on_cpu_says_it_did_nothing(tmp_path: Path) -> None:
    cfg = MonitorConfig(enabled=False, sync_report_steps=2)
    (cb,) = monitor_callbacks(cfg, tmp_path, profile=False)
    assert isinstance(cb, SyncReportCallback)
    ds = TensorDataset(torch.randn(64, 4), torch.randn(64))
    trainer = pl.Trainer(
        max_steps=3, accelerator="cpu", devices=1, callbacks=[cb], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(_Tiny(4), DataLoader(ds, batch_size=16))
    note = (tmp_path / "syncs/NOT_RECORDED_rank0.txt").read_text()
    assert "no GPU" in note and "monitor.sync_report_steps=0" in note


def test_sync_report_config_validation() -> None:
    with pytest.raises(ValueError, match=r"monitor.sync_report_steps=-1"):
        MonitorConfig(sync_report_steps=-1)


class _Tiny(pl.LightningModule):
    def __init__(self, n: int, item_every_step: bool = False) -> None:
        super().__init__()
        self.net = nn.Linear(n, 1)
        self.item_every_step = item_every_step

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        if self.item_every_step:
            self.seen = loss.item()  # the sync the report must find
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


@pytest.mark.gpu
def test_sync_report_finds_item_in_training_step(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    cfg = MonitorConfig(enabled=False, sync_report_steps=4, sync_report_start_step=2)
    ds = TensorDataset(torch.randn(10 * 64, 256), torch.randn(10 * 64))
    trainer = pl.Trainer(
        max_steps=10, accelerator="gpu", devices=1, logger=False,
        callbacks=monitor_callbacks(cfg, tmp_path, profile=False),
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(_Tiny(256, item_every_step=True), DataLoader(ds, batch_size=64))
    doc = json.loads((tmp_path / "syncs/syncs_rank0.json").read_text())
    assert doc["steps"] == 4
    item_sites = [s for s in doc["sites"] if s["stack"][-1].endswith("(training_step)")]
    assert item_sites and item_sites[0]["count"] == 4, doc
    assert (tmp_path / "syncs/syncs_rank0.md").read_text().startswith("# Host-device syncs")
