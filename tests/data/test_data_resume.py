"""The data position is saveable: a resumed run sees exactly the batches of an uninterrupted one."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch

from rocmtrain.config.data import DataConfig
from rocmtrain.data import build_datamodule


def _dm(**cfg):
    cfg = {"batch_size": 32, "num_train_batches": 7, "num_val_batches": 2, **cfg}
    dm = build_datamodule(
        DataConfig(**cfg),
        num_embeddings_per_feature=[100] * 4,
        multi_hot_sizes=[1, 2, 1, 3],
        num_dense=13,
        seed=3,
    )
    return dm


def _key(batch) -> tuple:
    return (
        batch.dense_features.sum().item(),
        tuple(batch.labels.tolist()),
        tuple(batch.sparse_features.values().tolist()),
    )


def _position(state: dict) -> dict:
    """The batch position of a saved data state (its sample count etc. left out)."""
    return {"epoch": state["epoch"], "batch": state["batch"]}


def _take(loader, n_epochs: int, stop_after: int | None = None) -> list[tuple]:
    out: list[tuple] = []
    for _ in range(n_epochs):
        for batch in loader:
            out.append(_key(batch))
            if stop_after is not None and len(out) == stop_after:
                return out
    return out


@pytest.mark.parametrize("stop_after", [3, 7, 10, 14])
def test_resume_continues_exactly_like_an_uninterrupted_run(stop_after):
    reference = _take(_dm().train_dataloader(), n_epochs=3)
    assert len(reference) == 21 and len(set(reference[:7])) == 7

    first = _dm()
    first.setup()
    seen = _take(first.train_dataloader(), n_epochs=3, stop_after=stop_after)
    state = first.state_dict()
    assert (state["epoch"], state["batch"]) == ((stop_after - 1) // 7, (stop_after - 1) % 7 + 1)

    resumed = _dm()
    resumed.load_state_dict(state)  # before setup, as Lightning does on restore
    loader = resumed.train_dataloader()
    rest = _take(loader, n_epochs=3 - stop_after // 7)
    assert seen + rest == reference


def test_load_after_setup_and_epoch_end_state_moves_to_next_epoch():
    reference = _take(_dm().train_dataloader(), n_epochs=2)
    dm = _dm()
    dm.setup()
    dm.load_state_dict({"epoch": 0, "batch": 7})  # saved at the end of epoch 0
    assert _take(dm.train_dataloader(), n_epochs=1) == reference[7:]


def test_resume_with_dataloader_workers_gives_the_same_batches():
    reference = _take(_dm().train_dataloader(), n_epochs=1)
    dm = _dm(num_workers=2)
    dm.load_state_dict({"epoch": 0, "batch": 2})
    assert _take(dm.train_dataloader(), n_epochs=1) == reference[2:]
    full = _dm(num_workers=2)
    assert _take(full.train_dataloader(), n_epochs=1) == reference


def test_a_loop_that_fetches_ahead_saves_only_what_it_trained_on():
    """A pipelined loop pulls 2 batches ahead and calls mark_consumed per batch it trains on;
    the saved position excludes the look-ahead, so the resume repeats nothing and skips nothing."""
    reference = _take(_dm().train_dataloader(), n_epochs=2)
    dm = _dm()
    it = iter(dm.train_dataloader())
    queue = [next(it), next(it)]  # look-ahead of 2
    trained = []
    for _ in range(4):
        queue.append(next(it))
        dm.mark_consumed()
        trained.append(_key(queue.pop(0)))
    state = dm.state_dict()
    assert (state["epoch"], state["batch"]) == (0, 4)  # 6 handed out, 4 trained on
    resumed = _dm()
    resumed.load_state_dict(dm.state_dict())
    rest = _take(resumed.train_dataloader(), n_epochs=2)
    assert trained + rest == reference


def test_validation_data_is_fixed_across_epochs():
    dm = _dm()
    loader = dm.val_dataloader()
    a, b = _take(loader, 1), _take(loader, 1)
    assert a == b and len(a) == 2
    assert torch.is_tensor(next(iter(loader)).labels)


class _Recorder(pl.LightningModule):
    """Tiny model that records the batches it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(13, 1)
        self.seen: list[tuple] = []
        self.validated = 0

    def validation_step(self, batch, batch_idx):
        self.validated += 1

    def training_step(self, batch, batch_idx):
        self.seen.append(_key(batch))
        logits = self.linear(batch.dense_features).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _SaveAt(pl.Callback):
    def __init__(self, step: int, path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def _trainer(max_steps: int, callbacks=()) -> pl.Trainer:
    return pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=1,
        val_check_interval=3,
        callbacks=list(callbacks),
    )


@pytest.mark.parametrize("save_steps", [[3], [7], [3, 5], [9, 13]])
def test_lightning_checkpoint_resume_trains_on_the_uninterrupted_batches(tmp_path, save_steps):
    """Real Lightning fits with a validation loop every 3 steps: checkpoint at each of
    ``save_steps`` (mid-epoch, at an epoch end, twice in one epoch), resume from it, and compare
    the batches trained on with an uninterrupted run (7 batches per epoch, 16 steps)."""
    reference = _Recorder()
    _trainer(16).fit(reference, datamodule=_dm())
    assert len(reference.seen) == 16 and reference.validated > 0

    seen: list[tuple] = []
    ckpt = None
    for i, step in enumerate(save_steps):
        path = tmp_path / f"step{step}.ckpt"
        run = _Recorder()
        _trainer(16, [_SaveAt(step, path)]).fit(run, datamodule=_dm(), ckpt_path=ckpt)
        previous = save_steps[i - 1] if i else 0
        seen += run.seen[: step - previous]
        saved = torch.load(path, weights_only=False)
        position = {"epoch": (step - 1) // 7, "batch": (step - 1) % 7 + 1}
        assert _position(saved["RecDataModule"]) == position
        (loader_state,) = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        assert _position(loader_state) == position
        ckpt = path
    resumed = _Recorder()
    _trainer(16).fit(resumed, datamodule=_dm(), ckpt_path=ckpt)
    assert seen + resumed.seen == reference.seen
