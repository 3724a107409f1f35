"""Build TorchRec ``Batch`` objects from per-feature id tensors, and the seeding helper.

Shape legend: ``B`` samples, ``F`` categorical features, ``D`` dense features, ``L[f]`` ids per
sample of feature ``f`` (multi-hot size; 1 for Criteo). Values are key-major::

    keys      cat_0               cat_1
    sample    s0    s1    s2      s0  s1  s2       (B=3, L=[2, 1])
    values    a a | b b | c c     d | e | f
    lengths   2     2     2       1   1   1
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import numpy as np
import torch
from torchrec.datasets.criteo import DEFAULT_CAT_NAMES
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rocmtrain.config.data import DataConfigError


def feature_keys(num_features: int) -> list[str]:
    """The KJT keys for ``num_features`` categorical features: ``cat_0 .. cat_{F-1}``."""
    if not 1 <= num_features <= len(DEFAULT_CAT_NAMES):
        raise DataConfigError(
            f"model.num_embeddings_per_feature has {num_features} tables; the data has "
            f"1..{len(DEFAULT_CAT_NAMES)} categorical features (cat_0..cat_25): use 1-26 tables"
        )
    return list(DEFAULT_CAT_NAMES[:num_features])


def make_batch(dense: torch.Tensor, ids: Sequence[torch.Tensor], labels: torch.Tensor) -> Batch:
    """Pack one batch.

    Args:
        dense: float32 ``[B, D]``.
        ids: one int64 ``[B, L[f]]`` tensor per feature (fixed multi-hot size per feature).
        labels: ``[B]`` (converted to float32).
    """
    values = torch.cat([t.reshape(-1) for t in ids])
    return make_batch_from_values(dense, values, [int(t.shape[1]) for t in ids], labels)


def make_batch_from_values(
    dense: torch.Tensor,
    values: torch.Tensor,
    sizes: Sequence[int],
    labels: torch.Tensor,
    *,
    widen: bool = True,
) -> Batch:
    """Pack one batch whose key-major ``values`` are already concatenated (no copy of them).

    Lengths are the constant ``sizes`` (``L[f]``) known on the host, so building the
    KeyedJaggedTensor reads nothing back from ``values``. ``widen``: cast values to int64 (False
    keeps int32 ids as read, for a batch widened on its device after the copy).
    """
    batch_size = dense.shape[0]
    keys = feature_keys(len(sizes))
    if widen and values.dtype != torch.int64:
        values = values.to(torch.int64)
    # from a per-device template: torch.tensor(list, device=gpu) would copy from pageable host
    # memory, which waits for the stream (a host sync per batch)
    lengths = _sizes_on(tuple(int(s) for s in sizes), values.device).repeat_interleave(batch_size)
    length_per_key = [batch_size * int(size) for size in sizes]
    kjt = KeyedJaggedTensor(
        keys=keys,
        values=values,
        lengths=lengths,
        stride=batch_size,
        length_per_key=length_per_key,
        offset_per_key=[0, *itertools.accumulate(length_per_key)],
    )
    return Batch(
        dense_features=dense.to(torch.float32).contiguous(),
        sparse_features=kjt,
        labels=labels.to(torch.float32).reshape(-1),
    )


@functools.lru_cache(maxsize=64)
def _sizes_on(sizes: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(sizes, dtype=torch.int32, device=device)


def derive_seed(*parts: int) -> int:
    """A 63-bit seed mixed from integers (data seed, split, epoch, block ...), stable across runs."""
    state = np.random.SeedSequence([int(p) & 0xFFFFFFFFFFFFFFFF for p in parts])
    return int(state.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def generator(*parts: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with :func:`derive_seed` of ``parts``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(*parts))
    return gen


def concat_rows(parts: Sequence[tuple[Batch, int, int]]) -> Batch:
    """Rows ``[lo, hi)`` of each ``(batch, lo, hi)``, one after another, as one batch (batches of
    fixed multi-hot sizes, as every data kind makes)."""
    dense = torch.cat([b.dense_features[lo:hi] for b, lo, hi in parts])
    labels = torch.cat([b.labels[lo:hi] for b, lo, hi in parts])
    ids = []
    for key in parts[0][0].sparse_features.keys():
        ids.append(
            torch.cat(
                [
                    b.sparse_features[key].values().reshape(len(b.labels), -1)[lo:hi]
                    for b, lo, hi in parts
                ]
            )
        )
    return make_batch(dense, ids, labels)
