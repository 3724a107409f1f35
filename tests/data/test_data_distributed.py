"""Two real gloo ranks (torch.multiprocessing spawn): each reads its own shard, the shards are
disjoint and complete, and NormalizedEntropy reduces across ranks to the global value."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def _worker(rank: int, tmp: str, tsv: str) -> None:
    from rocmtrain.config.data import DataConfig
    from rocmtrain.data import build_datamodule
    from rocmtrain.metrics import NormalizedEntropy

    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=WORLD)
    out: dict[str, object] = {}
    # rank and world size come from torch.distributed (not passed in)
    syn = build_datamodule(
        DataConfig(batch_size=16, num_train_batches=4, num_val_batches=1),
        num_embeddings_per_feature=[50] * 3,
        multi_hot_sizes=[2, 1, 1],
        num_dense=13,
        seed=5,
    )
    syn.setup("fit")
    out["syn_rank"] = (syn.rank, syn.world_size)
    out["syn_dense"] = torch.cat([b.dense_features for b in syn.train_dataloader()])
    tsv_dm = build_datamodule(
        DataConfig(kind="criteo_tsv", path=tsv, batch_size=8, val_fraction=0.0, drop_last=False),
        num_embeddings_per_feature=[1000] * 26,
        multi_hot_sizes=None,
        num_dense=13,
        seed=5,
    )
    tsv_dm.setup("fit")
    batches = list(tsv_dm.train_dataloader())
    out["tsv_batches"] = len(batches)
    out["tsv_dense"] = torch.cat([b.dense_features for b in batches])
    # NE: each rank updates with its own logits/labels; compute() syncs over gloo
    gen = torch.Generator().manual_seed(100 + rank)
    logits = torch.randn(64, generator=gen)
    labels = (torch.rand(64, generator=gen) < 0.4).float()
    ne = NormalizedEntropy()
    ne.update(logits, labels)
    out["ne"] = ne.compute().item()
    out["ne_inputs"] = (logits, labels)
    torch.save(out, Path(tmp) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow  # two spawned interpreters importing torchrec: ~15 s on an idle 2-core box
def test_two_gloo_ranks_get_disjoint_complete_shards_and_a_global_ne(tmp_path, data_dir):
    tsv = data_dir / "sample_train.txt"
    mp.spawn(_worker, args=(str(tmp_path), str(tsv)), nprocs=WORLD, join=True)
    res = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    assert [r["syn_rank"] for r in res] == [(0, 2), (1, 2)]

    # synthetic: 4 batches x 16 rows each, no row shared between ranks
    rows = [set(map(tuple, r["syn_dense"].tolist())) for r in res]
    assert all(len(r) == 64 for r in rows) and not rows[0] & rows[1]

    # TSV: 100 real rows over 2 ranks x batch 8 -> 7 batches per rank, every row exactly once
    assert res[0]["tsv_batches"] == res[1]["tsv_batches"] == 7
    both = torch.cat([r["tsv_dense"] for r in res])
    assert both.shape[0] == 100
    from rocmtrain.config.data import DataConfig
    from rocmtrain.data import build_datamodule

    single = build_datamodule(
        DataConfig(
            kind="criteo_tsv", path=str(tsv), batch_size=8, val_fraction=0.0, drop_last=False
        ),
        num_embeddings_per_feature=[1000] * 26,
        multi_hot_sizes=None,
        num_dense=13,
        seed=5,
        rank=0,
        world_size=1,
    )
    single.setup()
    every_row = torch.cat([b.dense_features for b in single.train_dataloader()])
    assert every_row.shape[0] == 100
    # the two shards together are exactly the file's rows (as a multiset): disjoint + complete
    assert sorted(map(tuple, both.tolist())) == sorted(map(tuple, every_row.tolist()))
    # ... and each rank holds different rows (the file's rows are all distinct)
    assert len(set(map(tuple, every_row.tolist()))) == 100

    # NE: both ranks report the same, global value (independent fp64 formula over 128 samples)
    logits = torch.cat([r["ne_inputs"][0] for r in res]).double().tolist()
    labels = torch.cat([r["ne_inputs"][1] for r in res]).double().tolist()
    ce = -sum(
        y * math.log(1 / (1 + math.exp(-x))) + (1 - y) * math.log(1 - 1 / (1 + math.exp(-x)))
        for x, y in zip(logits, labels, strict=True)
    )
    c = sum(labels) / len(labels)
    want = ce / len(labels) / -(c * math.log(c) + (1 - c) * math.log(1 - c))
    assert abs(res[0]["ne"] - want) < 1e-9 and abs(res[1]["ne"] - want) < 1e-9
