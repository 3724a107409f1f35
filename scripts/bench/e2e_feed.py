"""The ordinary DataLoader the swap-in stages feed a user's module with, and the plain-TorchRec
anchor with the same loader: ``DataLoader(FreshBatches(pool, steps), batch_size=None,
pin_memory=True)``, the way Lightning's and TorchRec's docs feed a model.

Each step yields NEW CPU tensors (a copy of one of a few pre-made planted-signal batches, as a
reader that materialises every batch does), so pinning and the host-to-device copy are paid every
step, as with real data. The pre-made pool keeps the generator's ~0.5 s per 65,536-sample batch
out of the measurement: what is measured is what the trainer does with an ordinary loader.
"""

from __future__ import annotations

from torch.utils.data import DataLoader, IterableDataset
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


def fresh_copy(batch: Batch) -> Batch:
    """``batch`` in new CPU memory (every tensor cloned)."""
    kjt = batch.sparse_features
    return Batch(
        dense_features=batch.dense_features.clone(),
        sparse_features=KeyedJaggedTensor(
            keys=kjt.keys(),
            values=kjt.values().clone(),
            lengths=kjt.lengths().clone(),
            stride=kjt.stride(),
            length_per_key=kjt.length_per_key(),
            offset_per_key=kjt.offset_per_key(),
        ),
        labels=batch.labels.clone(),
    )


class FreshBatches(IterableDataset):
    """``steps`` new CPU batches cycling over copies of ``pool``."""

    def __init__(self, pool: list[Batch], steps: int) -> None:
        self.pool, self.steps = pool, steps

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        for i in range(self.steps):
            yield fresh_copy(self.pool[i % len(self.pool)])


def ordinary_loader(pool: list[Batch], steps: int, *, pin_memory: bool = True) -> DataLoader:
    """The user's loader: no workers, ``batch_size=None`` (the dataset yields whole batches)."""
    return DataLoader(FreshBatches(pool, steps), batch_size=None, pin_memory=pin_memory)
