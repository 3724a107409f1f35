"""``strategy.balance``: the per-rank cost model of a sharding plan, the balanced plan, the dry
run's report, and (real gloo ranks) a balanced plan that trains."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from dist_ranks import run_ranks

#: very different sizes and ids per sample: the 40-hot table alone outweighs all the others
ROWS = [4000, 3000, 600, 200, 80, 40]
HOT = [40, 1, 4, 2, 1, 1]


def _ebc():
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    tables = [(100, 8), (60, 8), (10, 8), (5, 8)]
    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t{i}", embedding_dim=d, num_embeddings=r, feature_names=[f"f{i}"]
            )
            for i, (r, d) in enumerate(tables)
        ],
        device=torch.device("meta"),
    )


def test_cost_model_matches_a_hand_computed_plan():
    from torchrec.distributed import sharding_plan as sp
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.types import ShardingPlan

    from rocmtrain.strategies.balance import plan_cost, table_specs

    ebc = _ebc()
    module_plan = sp.construct_module_sharding_plan(
        ebc,
        {
            "t0": sp.table_wise(rank=0),
            "t1": sp.row_wise(),
            "t2": sp.column_wise(ranks=[0, 1]),
            "t3": sp.data_parallel(),
        },
        sharder=EmbeddingBagCollectionSharder(),
        local_size=2,
        world_size=2,
        device_type="cuda",
    )
    cost = plan_cost(
        ShardingPlan({"": module_plan}),
        table_specs(ebc),
        {"t0": 10, "t1": 2, "t2": 1, "t3": 3},
        world_size=2,
    )
    # fp32 = 4 bytes. t0 table-wise on rank 0: 10 ids x 8 x 4 = 320 B/sample, 100x8x4 = 3200 B.
    # t1 row-wise 30 + 30 rows: 2 ids x 30/60 x 8 x 4 = 32 B on each, 30x8x4 = 960 B each.
    # t2 column-wise 4 + 4 columns: 1 id x 4 x 4 = 16 B on each, 10x4x4 = 160 B each.
    # t3 data parallel: 3 x 8 x 4 / 2 ranks = 48 B on each, the whole 5x8x4 = 160 B on each.
    assert [r.lookup_bytes for r in cost.ranks] == [320 + 32 + 16 + 48, 32 + 16 + 48]
    assert [r.memory_bytes for r in cost.ranks] == [3200 + 960 + 160 + 160, 960 + 160 + 160]
    assert cost.imbalance == pytest.approx(416 / 256)
    assert cost.memory_imbalance == pytest.approx(4480 / 2880)
    assert not cost.within(0.10)
    assert cost.lines()[-1] == "imbalance (max/mean): lookup 1.625, memory 1.556"


def _model_cfg(num_features: int = len(ROWS)):
    from rocmtrain.config.model import ModelConfig

    return dataclasses.replace(
        ModelConfig(),
        num_embeddings_per_feature=ROWS[:num_features],
        multi_hot_sizes=HOT[:num_features],
        dense_arch_layer_sizes=[16, 16],
        over_arch_layer_sizes=[16, 1],
    )


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_balanced_plan_is_within_ten_percent(world, device):
    """Planner's plan vs balanced plan on a fake topology (no process group): table-wise
    tables stay whole, the heavy ones are split (row-wise on cuda, column-wise on CPU, where
    TorchRec's FBGEMM sharder has no row-wise)."""
    import torch

    from rocmtrain.models.dlrm import build_dlrm, pooling_factors
    from rocmtrain.strategies import TorchRecStrategy
    from rocmtrain.strategies.balance import is_balanced
    from rocmtrain.strategies.planning import describe_plan

    cfg = _model_cfg()
    model = build_dlrm(cfg, dense_device=torch.device("meta"))
    strategy = TorchRecStrategy(balance="auto", pooling_factors=pooling_factors(cfg))
    plan = strategy.plan_for(
        model, world_size=world, local_world_size=world, compute_device=device, batch_size=64
    )
    report = strategy.balance_report
    assert report is not None
    if is_balanced(report.planner):  # nothing to do: kept, and said so
        assert report.balanced is None and "kept" in report.note
        return
    assert report.balanced is not None, report
    assert is_balanced(report.balanced), report.lines()
    assert report.balanced.within(0.10)
    rows = {r.table: r for r in describe_plan(plan)}
    split = "row_wise" if device == "cuda" else "column_wise"
    assert rows["t_cat_0"].sharding_type == split  # the 40-hot table
    assert rows["t_cat_0"].ranks == tuple(range(world))
    assert rows["t_cat_5"].sharding_type == "table_wise"  # a small one stays whole
    # report mode: same planner plan, nothing replaced
    reporter = TorchRecStrategy(balance="report", pooling_factors=pooling_factors(cfg))
    reporter.plan_for(
        model, world_size=world, local_world_size=world, compute_device=device, batch_size=64
    )
    assert reporter.balance_report is not None and reporter.balance_report.balanced is None
    assert reporter.balance_report.planner == report.planner
    off = TorchRecStrategy(balance="off", pooling_factors=pooling_factors(cfg))
    off.plan_for(model, world_size=world, local_world_size=world, compute_device=device)
    assert off.balance_report is None


def test_pinned_tables_are_kept():
    import torch

    from rocmtrain.models.dlrm import build_dlrm, pooling_factors
    from rocmtrain.strategies import TorchRecStrategy
    from rocmtrain.strategies.planning import describe_plan

    cfg = _model_cfg()
    model = build_dlrm(cfg, dense_device=torch.device("meta"))
    strategy = TorchRecStrategy(
        balance="auto",
        pooling_factors=pooling_factors(cfg),
        per_table_sharding={"t_cat_1": "data_parallel", "t_cat_0": "row_wise"},
    )
    plan = strategy.plan_for(model, world_size=2, local_world_size=2, compute_device="cuda")
    rows = {r.table: r for r in describe_plan(plan)}
    assert rows["t_cat_1"].sharding_type == "data_parallel"
    assert rows["t_cat_0"].sharding_type == "row_wise"


def test_balance_is_validated():
    from rocmtrain.config import ConfigError
    from rocmtrain.config.strategy import StrategyConfig
    from rocmtrain.strategies import TorchRecStrategy

    with pytest.raises(ConfigError, match="balance"):
        TorchRecStrategy(balance="on")
    with pytest.raises(ConfigError, match="strategy.balance"):
        StrategyConfig(balance="greedy").validate()
    assert StrategyConfig().balance == "report"


@pytest.mark.parametrize("devices", [2, 4])
def test_dry_run_prints_the_imbalance_before_and_after(devices, capsys):
    """The MLPerf recipe on fake cuda devices: the planner's plan is lopsided in memory (the big
    tables table-wise), the balanced one within 10 % in lookup bytes and memory."""
    import re

    from hydra import compose, initialize_config_dir

    from rocmtrain.config.schema import configs_dir, register_configs, to_run_config
    from rocmtrain.dry_run import print_plan

    register_configs()
    overrides = [
        "recipe=dlrm_dcnv2_h200",
        f"trainer.devices={devices}",
        "strategy.balance=auto",
        "run_dir=r",
    ]
    with initialize_config_dir(config_dir=str(configs_dir()), version_base="1.3"):
        cfg = to_run_config(compose("rocmtrain", overrides=overrides))
    print_plan(cfg, overrides)
    out = capsys.readouterr().out
    assert "planner's plan (strategy.balance=auto):" in out and "balanced plan (used):" in out
    found = re.findall(r"imbalance \(max/mean\): lookup ([\d.]+), memory ([\d.]+)", out)
    assert len(found) == 2, out
    (before_l, before_m), (after_l, after_m) = ((float(a), float(b)) for a, b in found)
    assert max(before_l, before_m) > 1.10
    assert after_l <= 1.10 and after_m <= 1.10
    assert len(re.findall(r"rank \d: lookup", out)) == 2 * devices
    assert "row_wise" in out


# -- real ranks --------------------------------------------------------------------------------
def _train_balanced(rank: int, root: str, world: int):
    import pytorch_lightning as pl
    import torch
    from tiny_config import tiny_run_config

    from rocmtrain.data import build_datamodule
    from rocmtrain.models.module import DLRMModule
    from rocmtrain.strategies.balance import is_balanced, plan_cost, table_specs
    from rocmtrain.train import build_trainer

    cfg = tiny_run_config(
        Path(root) / "run",
        train_batches=4,
        sharding_type=None,  # the balancer picks per table
        devices=world,
        max_epochs=1,
        num_sanity_val_steps=0,
    )
    cfg.model = _model_cfg()
    cfg.checkpoint.enabled = False
    cfg.strategy.balance = "auto"
    pl.seed_everything(cfg.seed, verbose=False)
    m = cfg.model
    dm = build_datamodule(
        cfg.data,
        num_embeddings_per_feature=m.table_rows(),
        multi_hot_sizes=m.multi_hot_sizes,
        num_dense=13,
        seed=cfg.seed,
    )
    module = DLRMModule(m, verbose=False)
    trainer = build_trainer(cfg, Path(cfg.run_dir))
    trainer.fit(module, datamodule=dm)
    strategy = trainer.strategy
    plan = strategy.sharding_plan
    from rocmtrain.models.dlrm import build_dlrm, pooling_factors

    unsharded = build_dlrm(m, dense_device=torch.device("meta"))  # the tables' shapes
    cost = plan_cost(plan, table_specs(unsharded), pooling_factors(m), world)
    report = strategy.balance_report
    return dict(
        losses=list(module.step_losses),
        lookup=[r.lookup_bytes for r in cost.ranks],
        planner_balanced=is_balanced(report.planner),
        balanced=report.balanced is not None,
        plan={t: (ps.sharding_type, ps.ranks) for mp in plan.plan.values() for t, ps in mp.items()},
        finite=bool(torch.isfinite(torch.tensor(module.step_losses)).all()),
    )


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_balanced_plan_trains_on_gloo_ranks(world, tmp_path):
    results = run_ranks(_train_balanced, world, str(tmp_path), world)
    for rank, r in enumerate(results):
        assert r["balanced"] and not r["planner_balanced"], r
        mean = sum(r["lookup"]) / world
        assert all(abs(v - mean) <= 0.10 * mean for v in r["lookup"]), (rank, r["lookup"])
        assert r["plan"] == results[0]["plan"]  # every rank derived the same plan
        assert r["plan"]["t_cat_0"][0] == "column_wise"  # CPU + FBGEMM: no row-wise
        assert len(r["losses"]) == 4 and r["finite"], r["losses"]
