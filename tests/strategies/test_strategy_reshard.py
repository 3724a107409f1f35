"""Resume on another world size or sharding plan, with real gloo ranks.

A 2-rank table-wise run trains 3 steps of an epoch of Criteo ``.npy`` rows (dense feature 0 of
row ``i`` is ``i``: the sample id) and checkpoints. That checkpoint is resumed on 1 rank, on 3
ranks (table-wise) and on 2 ranks row-wise (with rocmtrain's torch kernel: the FBGEMM kernel's
fused optimizer state loads into it); as data-parallel it stops with one line. Right after loading, the tables and the fused
optimizer state, gathered from every rank's shards, equal the saved ones bit for bit; training
then finishes the epoch, and every sample id of the epoch is trained on exactly once across the
change.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from dist_ranks import run_ranks

pytestmark = pytest.mark.slow

ROWS = 170  # not a multiple of any world size x batch: the last round is split unevenly
BATCH = 16
STEPS = 3  # trained by the 2 ranks before the checkpoint
TABLES = [300, 200, 100, 50]


def _write_rows(folder: Path) -> None:
    rng = np.random.default_rng(0)
    dense = rng.random((ROWS, 13), dtype=np.float32)
    dense[:, 0] = np.arange(ROWS)  # the sample id, exact in float32
    sparse = np.zeros((ROWS, 26), dtype=np.int64)
    for f, rows in enumerate(TABLES):
        sparse[:, f] = rng.integers(0, rows, ROWS)
    labels = rng.integers(0, 2, (ROWS, 1)).astype(np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "day_0_dense.npy", dense)
    np.save(folder / "day_0_sparse.npy", sparse)
    np.save(folder / "day_0_labels.npy", labels)


def _cfg(run_dir: Path, data: Path, sharding: str, world: int):
    from tiny_config import TINY_ROWS, tiny_run_config

    from rocmtrain.config.data import DataConfig

    assert list(TINY_ROWS) == TABLES  # _write_rows draws the ids for these tables
    cfg = tiny_run_config(run_dir, sharding_type=sharding, max_epochs=1, devices=world)
    cfg.model = dataclasses.replace(cfg.model, embedding_optimizer="rowwise_adagrad")
    cfg.data = DataConfig(
        kind="criteo_npy", path=str(data), batch_size=BATCH, val_fraction=0.0, drop_last=False
    )
    cfg.checkpoint.every_n_train_steps = STEPS
    # FBGEMM (the default) writes; on CPU row-wise shards need rocmtrain's torch kernel, so that
    # resume also moves the fused optimizer state from one kernel to the other (as from a CUDA
    # machine's FBGEMM to a ROCm machine's triton kernel, which shares the torch kernel's state)
    cfg.kernel = "torch" if sharding == "row_wise" else "fbgemm"
    return cfg


def _pieces(value) -> list[tuple[list[int], torch.Tensor]]:
    """This rank's parts of a tensor with their offsets in the whole (a plain tensor: all of it)."""
    if hasattr(value, "local_shards"):
        return [
            (list(s.metadata.shard_offsets), s.tensor.detach().clone())
            for s in value.local_shards()
        ]
    if isinstance(value, torch.Tensor):
        return [([0] * value.dim(), value.detach().clone())]
    return []


def _state(trainer) -> dict[str, list]:
    """Every tensor of the model, the fused and the dense optimizer, as this rank's pieces."""
    module = trainer.lightning_module
    out = {f"model.{k}": _pieces(v) for k, v in module.state_dict().items()}
    fused = trainer.strategy.dmp.fused_optimizer.state_dict()["state"]
    for param, states in fused.items():
        for name, value in states.items():
            out[f"optim.{param}.{name}"] = _pieces(value)
    # the dense optimizer (replicated; keyed by parameter index, the same under every plan)
    for index, states in trainer.optimizers[0].state_dict()["state"].items():
        for name, value in states.items():
            out[f"dense_optim.{index}.{name}"] = _pieces(torch.as_tensor(value))
    return out


def _fit(cfg, *, ckpt_path=None, max_steps=-1):
    import pytorch_lightning as pl

    from rocmtrain.data import build_datamodule
    from rocmtrain.models.module import DLRMModule
    from rocmtrain.train import build_trainer

    seen: list[int] = []
    loaded: dict = {}
    rng: dict = {}

    class Record(pl.Callback):
        def on_train_start(self, trainer, module):
            loaded.update(_state(trainer))  # after the checkpoint is loaded, before any step
            rng["torch"] = torch.get_rng_state()

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen.extend(batch.dense_features[:, 0].long().tolist())

    pl.seed_everything(cfg.seed, verbose=False)
    dm = build_datamodule(
        cfg.data,
        num_embeddings_per_feature=cfg.model.table_rows(),
        multi_hot_sizes=None,
        num_dense=13,
        seed=cfg.seed,
    )
    module = DLRMModule(cfg.model, verbose=False)
    trainer = build_trainer(cfg, Path(cfg.run_dir), max_steps=max_steps)
    trainer.callbacks.append(Record())
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return dict(seen=seen, loaded=loaded, final=_state(trainer), rng=rng)


def _save_worker(rank: int, root: str) -> dict:
    root = Path(root)
    return _fit(_cfg(root / "saved", root / "data", "table_wise", 2), max_steps=STEPS)


def _resume_worker(rank: int, root: str, name: str, sharding: str, world: int) -> dict:
    root = Path(root)
    ckpt = root / "saved" / "checkpoints" / f"step-{STEPS:09d}"
    return _fit(_cfg(root / name, root / "data", sharding, world), ckpt_path=str(ckpt))


def _gather(results: list[dict], key: str) -> dict[str, torch.Tensor]:
    """Whole tensors put together from every rank's pieces (replicated ones: rank 0's)."""
    whole: dict[str, torch.Tensor] = {}
    for name in sorted({n for r in results for n in r[key]}):  # a rank names only its shards
        pieces = [p for r in results for p in r[key].get(name, [])]
        if not pieces:
            continue
        shape = [max(o[d] + t.shape[d] for o, t in pieces) for d in range(pieces[0][1].dim())]
        full = torch.full(shape, float("nan"), dtype=pieces[0][1].dtype)
        for offsets, t in pieces:
            full[tuple(slice(o, o + n) for o, n in zip(offsets, t.shape, strict=True))] = t
        whole[_table_key(name)] = full
    return whole


def _table_key(name: str) -> str:
    """A name independent of the plan (the fused optimizer names its state by table)."""
    return name.replace("model.model.", "model.")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("reshard")
    _write_rows(root / "data")
    results = run_ranks(_save_worker, 2, str(root))
    return root, results


def _check_resume(saved, world: int, name: str, sharding: str) -> list[dict]:
    root, before = saved
    after = run_ranks(_resume_worker, world, str(root), name, sharding, world)
    want = _gather(before, "final")
    got = _gather(after, "loaded")
    assert sorted(got) == sorted(want)
    assert any(k.startswith("optim.") for k in want) and any(
        k.startswith("dense_optim.") for k in want
    )
    for k, v in want.items():
        assert torch.equal(v, got[k]), k
    ids = sorted(i for r in before for i in r["seen"]) + sorted(i for r in after for i in r["seen"])
    assert len(before[0]["seen"]) == STEPS * BATCH
    assert sorted(ids) == list(range(ROWS)), "a sample skipped or trained twice"
    return after


def test_two_rank_table_wise_resumes_on_one_rank(saved):
    _check_resume(saved, 1, "one", "table_wise")


def test_two_rank_table_wise_resumes_on_three_ranks(saved):
    from rocmtrain.checkpoint_reshard import derived_rng

    after = _check_resume(saved, 3, "three", "table_wise")
    # the RNG rule: saved ranks get their own state back, rank 2 one derived from rank 0's
    folder = saved[0] / "saved" / "checkpoints" / f"step-{STEPS:09d}"
    own = [torch.load(folder / f"rank_{r}.pt", weights_only=False)["rng"] for r in (0, 1)]
    assert torch.equal(after[0]["rng"]["torch"], own[0]["torch"])
    assert torch.equal(after[1]["rng"]["torch"], own[1]["torch"])
    assert torch.equal(after[2]["rng"]["torch"], derived_rng(own[0], 2)["torch"])


def test_two_rank_table_wise_resumes_row_wise(saved):
    _check_resume(saved, 2, "row", "row_wise")


def test_sharded_table_resumed_data_parallel_says_what_to_do(saved):
    """A data-parallel table's optimizer state lives in the dense optimizer, a sharded one's in
    the fused embedding optimizer: no state to carry over, so one line says what to pin."""
    root, _ = saved
    with pytest.raises(Exception) as err:
        run_ranks(_resume_worker, 1, str(root), "dp", "data_parallel", 1)
    line = [x for x in str(err.value).splitlines() if "ResumeError: " in x][-1]
    assert "t_cat_0" in line and "data_parallel here" in line
    assert "strategy.per_table_sharding" in line
