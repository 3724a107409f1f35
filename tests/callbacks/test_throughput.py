"""ThroughputCallback in a real (CPU) Lightning fit: windows, warm-up, epochs, throughput.json."""

import json
from dataclasses import dataclass

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from rocmtrain.callbacks.throughput import ThroughputCallback


@dataclass
class _B:  # like torchrec's Batch: the callback reads the batch size from .labels
    x: torch.Tensor
    labels: torch.Tensor


def _collate(rows):
    x, y = zip(*rows, strict=True)
    return _B(torch.stack(x), torch.stack(y))


class _Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.history = [{"val_auc": 0.5}]

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.lin(batch.x).squeeze(-1), batch.labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_windows_after_warmup_per_epoch_and_json(tmp_path):
    data = TensorDataset(torch.randn(96, 4), torch.randn(96))
    cb = ThroughputCallback(tmp_path, warmup_steps=3, sync_every=2)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        callbacks=[cb],
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(_Tiny(), DataLoader(data, batch_size=8, collate_fn=_collate))  # 12 steps per epoch
    doc = json.loads((tmp_path / "throughput.json").read_text())
    # epoch 1: marks at steps 4, 6, ..., 12 (>= 3 warm-up) -> 4 windows; epoch 2: marks at its
    # steps 2..12 -> 5 windows (a window never spans the epoch end)
    assert [w["end_step"] for w in doc["windows"]] == [6, 8, 10, 12, 16, 18, 20, 22, 24]
    assert all(w["samples"] == 16 for w in doc["windows"])
    rates = sorted(w["samples"] / w["seconds"] for w in doc["windows"])
    assert doc["samples_per_s"] == rates[len(rates) // 2]
    assert doc["measured_steps"] == 18 and doc["final"] is True
    assert doc["history"] == [{"val_auc": 0.5}] and doc["peak_mem_alloc_gib_per_rank"] == [0.0]


def test_window_clock_rejects_an_unknown_mode(monkeypatch):
    from rocmtrain.callbacks.throughput import WindowClock

    monkeypatch.setenv("E2E_CLOCK", "wall")
    with pytest.raises(ValueError, match="E2E_CLOCK='wall'"):
        WindowClock(torch.device("cpu"))
    monkeypatch.setenv("E2E_CLOCK", "events")
    assert WindowClock(torch.device("cpu")).name == "host"  # no events on a CPU device


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_window_clock_times_gpu_work_without_a_host_sync(monkeypatch):
    """CUDA-event marks return while earlier GPU work is still running (no host sync; the host
    clock's marks wait for it), and the time between two event marks is the GPU work queued
    between them, within the host's view of it."""
    import time

    from rocmtrain.callbacks.throughput import WindowClock

    dev = torch.device("cuda")

    def mark_behind_busy_gpu(clock):
        """A mark taken right after queueing ~0.1 s of GPU work; whether that work was still
        running when the mark returned."""
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # a spin kernel: ~0.1 s at the H200's clocks
        queued = torch.cuda.Event()
        queued.record()
        m = clock.mark()
        return m, not queued.query()

    monkeypatch.setenv("E2E_CLOCK", "events")
    clock = WindowClock(dev)
    assert clock.name == "cuda_events"
    t0 = time.perf_counter()
    m0, pending0 = mark_behind_busy_gpu(clock)
    m1, pending1 = mark_behind_busy_gpu(clock)
    torch.cuda.synchronize()
    host = time.perf_counter() - t0
    assert pending0 and pending1  # the marks did not wait for the GPU
    gpu = clock.seconds(m0, m1)  # the second spin kernel, queued between the marks
    assert 0.02 < gpu <= host
    monkeypatch.setenv("E2E_CLOCK", "host")
    host_clock = WindowClock(dev)
    assert host_clock.name == "host"
    assert mark_behind_busy_gpu(host_clock)[1] is False  # the host clock's mark synchronises
