"""``OrderedSparseArch`` against TorchRec's ``SparseArch``: the same output and gradients, without
the copy when the collection's keys are already in the arch's order."""

from __future__ import annotations

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedTensor
from torchrec.models.dlrm import SparseArch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rocmtrain.models.dlrm import OrderedSparseArch

D, B = 4, 5


def _ebc(order: list[int]) -> EmbeddingBagCollection:
    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=D, num_embeddings=10 + i, feature_names=[f"f{i}"]
        )
        for i in order
    ]
    return EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))


def _features() -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(0, 3, (3 * B,), generator=g)
    values = torch.randint(0, 10, (int(lengths.sum()),), generator=g)
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1", "f2"], values=values, lengths=lengths
    )


def _out_and_grads(arch: torch.nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
    out = arch(_features())
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    (out * weight).sum().backward()
    return out.detach(), [p.grad.clone() for p in arch.parameters()]


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 0, 1]])
def test_same_output_and_gradients_as_torchrec(order):
    ref = SparseArch(_ebc(order))
    ours = SparseArch(_ebc(order))
    ours.__class__ = OrderedSparseArch
    want, want_grads = _out_and_grads(ref)
    got, got_grads = _out_and_grads(ours)
    assert got.shape == (B, 3, D)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_in_order_keys_are_viewed_not_copied():
    arch = SparseArch(_ebc([0, 1, 2]))
    arch.__class__ = OrderedSparseArch
    seen: list[KeyedTensor] = []
    arch.embedding_bag_collection.register_forward_hook(lambda m, i, o: seen.append(o))
    out = arch(_features())
    assert out.data_ptr() == seen[0].values().data_ptr()


def test_out_of_order_keys_are_reordered():
    arch = SparseArch(_ebc([0, 1, 2]))
    arch.__class__ = OrderedSparseArch
    arch._sparse_feature_names = ["f2", "f0", "f1"]  # the arch wants another order
    pooled = arch.embedding_bag_collection(_features()).to_dict()
    out = arch(_features())
    torch.testing.assert_close(out[:, 0], pooled["f2"], rtol=0, atol=0)
    torch.testing.assert_close(out[:, 1], pooled["f0"], rtol=0, atol=0)
