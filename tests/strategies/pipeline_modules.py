"""Modules and batches for the input-pipeline tests (CPU gloo ranks and the GPU), written the
way users write them, knowing nothing about rocmtrain."""

from __future__ import annotations

from pathlib import Path

STEPS, EPOCHS, B = 5, 2, 16
ROWS = [40, 30, 20]


def batches(rank: int):
    import torch
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(STEPS):
        lengths = torch.randint(0, 4, (len(ROWS) * B,), generator=g, dtype=torch.int32)
        per_key = lengths.view(len(ROWS), B).sum(1).tolist()
        values = torch.cat(
            [torch.randint(0, r, (n,), generator=g) for r, n in zip(ROWS, per_key, strict=True)]
        )
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=[f"f{i}" for i in range(len(ROWS))], values=values, lengths=lengths
        )
        dense = torch.randn(B, 5, generator=g)
        labels = (dense[:, 0] > 0).float()
        out.append(Batch(dense_features=dense, sparse_features=kjt, labels=labels))
    return out


def meta_ebc(dim: int):
    """An EmbeddingBagCollection of the ROWS tables (feature f<i> -> table t<i>) on the meta
    device: the sharding strategy materialises it."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=dim, num_embeddings=r, feature_names=[f"f{i}"]
        )
        for i, r in enumerate(ROWS)
    ]
    return EmbeddingBagCollection(tables=tables, device=torch.device("meta"))


def user_module():
    import pytorch_lightning as pl
    import torch
    from torchrec.models.dlrm import DLRM, DLRMTrain
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    class UserDLRM(pl.LightningModule):
        """Written like a TorchRec user would, knowing nothing about rocmtrain."""

        def __init__(self) -> None:
            super().__init__()
            ebc = meta_ebc(dim=8)
            self.model = DLRMTrain(
                DLRM(
                    embedding_bag_collection=ebc,
                    dense_in_features=5,
                    dense_arch_layer_sizes=[8, 8],
                    over_arch_layer_sizes=[8, 1],
                )
            )
            apply_optimizer_in_backward(
                RowWiseAdagrad, self.model.model.sparse_arch.parameters(), {"lr": 0.1}
            )
            self.losses: list[float] = []

        def training_step(self, batch, batch_idx):
            loss, _ = self.model(batch)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            dense = dict(in_backward_optimizer_filter(self.named_parameters()))
            return torch.optim.Adagrad(dense.values(), lr=0.1)

    return UserDLRM()


def builds_its_kjt_module():
    import pytorch_lightning as pl
    import torch
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    class Rebuilds(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = meta_ebc(dim=4)
            apply_optimizer_in_backward(torch.optim.SGD, self.ebc.parameters(), {"lr": 0.1})
            self.head = torch.nn.Linear(4 * len(ROWS), 1)
            self.losses: list[float] = []

        def training_step(self, batch, batch_idx):
            kjt = batch.sparse_features
            rebuilt = KeyedJaggedTensor(  # a new KJT (new values tensor): not the batch's ids
                keys=kjt.keys(), values=kjt.values().clone(), lengths=kjt.lengths()
            )
            logits = self.head(self.ebc(rebuilt).values()).squeeze(-1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.head.parameters(), lr=0.1)

    return Rebuilds()


def fit(
    make,
    rank: int,
    pipeline: str,
    root: Path,
    *,
    accelerator: str = "cpu",
    devices: int = 2,
    background: bool | None = None,
):
    """Train ``make()`` for EPOCHS epochs of this rank's batches; losses, weights, pipeline state.
    ``background``: load in the pipeline's background thread (default: on GPUs only)."""
    import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader

    import rocmtrain

    pl.seed_everything(0, verbose=False)
    module = make()
    strategy = rocmtrain.TorchRecStrategy(
        sharding_type="table_wise", pipeline=pipeline, watchdog=None
    )

    class Background(pl.Callback):
        def on_fit_start(self, trainer, pl_module):  # after the strategy built its pipeline
            if background is not None and trainer.strategy.input_pipeline is not None:
                trainer.strategy.input_pipeline.background = background

    trainer = pl.Trainer(
        strategy=strategy,
        callbacks=[Background()],
        accelerator=accelerator,
        devices=devices,
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        default_root_dir=str(root / pipeline),
    )
    loader = DataLoader(batches(rank), batch_size=None)
    trainer.fit(module, loader)
    pipe = trainer.strategy.input_pipeline
    sd = module.state_dict()
    weights = {
        k: (
            [s.tensor.clone() for s in v.local_shards()]
            if hasattr(v, "local_shards")
            else [v.clone()]
        )
        for k, v in sd.items()
    }
    return dict(
        losses=module.losses,
        weights=weights,
        pipelined=None if pipe is None else pipe.pipelined,
        overlapped=None if pipe is None else pipe.overlapped_lookups,
        ahead=None if pipe is None else pipe.started_ahead,
        devices=sorted({p.device.type for p in module.parameters()}),
        torch=torch.__version__,
    )
