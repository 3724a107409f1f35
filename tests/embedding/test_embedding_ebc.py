"""rocmtrain.embedding.EmbeddingBagCollection against torchrec's EmbeddingBagCollection (FBGEMM-free
nn.EmbeddingBag path) and an fp64 copy of it: forward, state_dict both ways, training steps with
the same optimizer applied by torch to torchrec's dense gradients."""

from __future__ import annotations

import pytest
import torch
from emb_workers import fp64_pooled, make_kjt, table_configs
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection as TorchrecEBC
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rocmtrain.embedding import EmbeddingBagCollection
from rocmtrain.kernels import OptimizerSpec


def _pair(spec: OptimizerSpec | None = None, *, weighted: bool = False):
    spec = spec or OptimizerSpec()
    torch.manual_seed(0)
    ref = TorchrecEBC(tables=table_configs(), is_weighted=weighted)
    ours = EmbeddingBagCollection(table_configs(), is_weighted=weighted, optimizer=spec)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _weighted(kjt: KeyedJaggedTensor, seed: int) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(kjt.values().numel(), generator=g) + 0.5
    return KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(), weights=w)


@pytest.mark.parametrize("weighted", [False, True])
def test_forward_matches_torchrec_and_fp64(weighted):
    ref, ours = _pair(weighted=weighted)
    kjt = make_kjt(513, seed=1, hot_row=True)  # 513 bags, empty bags, a row in every bag
    if weighted:
        kjt = _weighted(kjt, 2)
    kt = ours(kjt)
    if not weighted:  # torchrec's nn.EmbeddingBag path refuses per-sample weights with MEAN
        exp = ref(kjt)
        assert kt.keys() == exp.keys() and kt.length_per_key() == exp.length_per_key()
        torch.testing.assert_close(kt.values(), exp.values(), rtol=1e-5, atol=1e-6)
    ref64 = fp64_pooled(ref.state_dict(), kjt)
    torch.testing.assert_close(kt.values().double(), ref64, rtol=1e-5, atol=1e-6)


def test_key_order_of_input_does_not_matter():
    ref, ours = _pair()
    kjt = make_kjt(7, seed=3)
    perm = kjt.permute([3, 1, 0, 2])
    torch.testing.assert_close(ours(perm).values(), ref(kjt).values(), rtol=1e-6, atol=1e-6)


def test_state_dict_round_trip_with_torchrec():
    torch.manual_seed(5)
    ref = TorchrecEBC(tables=table_configs())
    ours = EmbeddingBagCollection(table_configs(), seed=123)
    sd = ours.state_dict()
    assert sorted(sd) == sorted(ref.state_dict())  # embedding_bags.<table>.weight
    ref.load_state_dict(sd)  # ours -> torchrec
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(v, sd[k], rtol=0, atol=0)
    torch.manual_seed(6)
    other = TorchrecEBC(tables=table_configs())
    ours.load_state_dict(other.state_dict())  # torchrec -> ours, into the kernel's buffers
    kjt = make_kjt(16, seed=4)
    torch.testing.assert_close(ours(kjt).values(), other(kjt).values(), rtol=1e-6, atol=1e-6)
    with pytest.raises(RuntimeError, match="size mismatch"):
        ours.load_state_dict({**other.state_dict(), "embedding_bags.t0.weight": torch.zeros(3, 8)})


def _train(ref, ours, make_opt, steps: int):
    opt = make_opt(ref.parameters())
    for step in range(steps):
        kjt = make_kjt(32, seed=100 + step, hot_row=True)
        target = torch.randn(32, 36, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        ((ref(kjt).values() - target) ** 2).sum().backward()
        opt.step()
        ((ours(kjt).values() - target) ** 2).sum().backward()
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[k], v, rtol=1e-5, atol=1e-6, msg=k)


def test_training_sgd_matches_torch_sgd_on_torchrec():
    ref, ours = _pair(OptimizerSpec("sgd", lr=0.05))
    _train(ref, ours, lambda p: torch.optim.SGD(p, lr=0.05), steps=3)


def test_training_rowwise_adagrad_matches_torchrec_rowwise_adagrad():
    ref, ours = _pair(OptimizerSpec("rowwise_adagrad", lr=0.1, eps=1e-8))
    _train(ref, ours, lambda p: RowWiseAdagrad(p, lr=0.1, eps=1e-8), steps=3)
    st = ours.fused_optimizer.state_dict()["state"]
    assert set(st) == {f"embedding_bags.t{i}.weight" for i in range(3)}
    assert st["embedding_bags.t1.weight"]["t1.momentum"].shape == (50,)


def test_one_adam_step_matches_torch_adam_on_torchrec():
    # lazy Adam == torch Adam for one step (untouched rows have zero moments, so do not move)
    ref, ours = _pair(OptimizerSpec("adam", lr=0.01, eps=1e-8))
    _train(ref, ours, lambda p: torch.optim.Adam(p, lr=0.01, eps=1e-8), steps=1)


def test_fused_optimizer_state_round_trip_and_lr():
    a = EmbeddingBagCollection(table_configs(), optimizer=OptimizerSpec("rowwise_adagrad", lr=0.1))
    kjt = make_kjt(8, seed=9)
    a(kjt).values().sum().backward()
    b = EmbeddingBagCollection(table_configs(), optimizer=OptimizerSpec("rowwise_adagrad", lr=0.1))
    b.load_state_dict(a.state_dict())
    b.fused_optimizer.load_state_dict(a.fused_optimizer.state_dict())
    for name, st in a.table_states().items():
        assert st["momentum"].abs().sum() > 0
        torch.testing.assert_close(b.table_states()[name]["momentum"], st["momentum"])
    b.fused_optimizer.param_groups[0]["lr"] = 0.0
    b.fused_optimizer.step()  # the update ran in backward; step() only syncs the lr
    before = b.state_dict()["embedding_bags.t0.weight"].clone()
    b(kjt).values().sum().backward()
    torch.testing.assert_close(b.state_dict()["embedding_bags.t0.weight"], before)


def test_adam_resume_needs_and_honours_set_optimizer_step():
    spec = OptimizerSpec("adam", lr=0.01)
    a = EmbeddingBagCollection(table_configs(), optimizer=spec)
    for step in range(3):
        a(make_kjt(8, seed=step)).values().sum().backward()
    resumed = []
    for set_step in (True, False):
        b = EmbeddingBagCollection(table_configs(), optimizer=spec)
        b.load_state_dict(a.state_dict())
        b.fused_optimizer.load_state_dict(a.fused_optimizer.state_dict())
        if set_step:
            b.fused_optimizer.set_optimizer_step(3)
        b(make_kjt(8, seed=3)).values().sum().backward()
        resumed.append(b.state_dict()["embedding_bags.t1.weight"])
    a(make_kjt(8, seed=3)).values().sum().backward()
    torch.testing.assert_close(resumed[0], a.state_dict()["embedding_bags.t1.weight"])
    assert not torch.allclose(resumed[1], resumed[0])  # step 1 bias correction differs


def test_bad_tables_and_inputs_are_named():
    with pytest.raises(ValueError, match="appears twice"):
        EmbeddingBagCollection([table_configs()[0], table_configs()[0]])
    with pytest.raises(ValueError, match="device=meta"):
        EmbeddingBagCollection(table_configs(), device="meta")
    ours = EmbeddingBagCollection(table_configs())
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["f0"], values=torch.tensor([1]), lengths=torch.tensor([1])
    )
    with pytest.raises(ValueError, match=r"lacks features \['f1', 'f2', 'f3'\]"):
        ours(kjt)
    bad = EmbeddingBagConfig(name="x", embedding_dim=4, num_embeddings=5, feature_names=["f0"])
    ebc = EmbeddingBagCollection([bad])
    with pytest.raises(Exception, match="f0|feature 0"):
        ebc(KeyedJaggedTensor.from_lengths_sync(
            keys=["f0"], values=torch.tensor([7]), lengths=torch.tensor([1])))  # fmt: skip
