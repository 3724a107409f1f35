"""``TorchRecStrategy`` arguments: typed configs, mappings or preset names, converted in one place;
unknown arguments and bad values fail at construction, naming what to change."""

from __future__ import annotations

import dataclasses

import pytest

from rocmtrain import platform
from rocmtrain.config import ConfigError
from rocmtrain.config.rccl import RcclConfig
from rocmtrain.config.watchdog import WatchdogConfig
from rocmtrain.strategies import TorchRecStrategy


def test_rccl_and_watchdog_take_configs_mappings_presets_and_none():
    s = TorchRecStrategy(rccl={"protocol": "LL,Simple"}, watchdog={"hang_timeout_seconds": 15})
    assert s.rccl_config.protocol == "LL,Simple"
    assert s.watchdog_config.hang_timeout_seconds == 15 and s.watchdog_config.enabled
    preset = TorchRecStrategy(rccl="mi300x_8gpu")
    assert isinstance(preset.rccl_config, RcclConfig) and preset.rccl_config != RcclConfig()
    assert TorchRecStrategy(watchdog=None).watchdog_config.enabled is False
    assert TorchRecStrategy(rccl=RcclConfig(debug="WARN")).rccl_config.debug == "WARN"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"rccl": {"protokol": "LL"}}, "protokol"),
        ({"rccl": "mi999"}, "choose a preset of configs/rccl/"),
        ({"watchdog": {"hang_timeout_seconds": -1}}, "watchdog.hang_timeout_seconds"),
        ({"sharding_type": "diagonal"}, "sharding_type='diagonal'"),
        ({"kernel": "cutlass"}, "kernel='cutlass'"),
        ({"pipeline": "fast"}, "pipeline='fast'"),
    ],
)
def test_bad_values_name_the_field(kwargs, needle):
    with pytest.raises(ConfigError) as err:
        TorchRecStrategy(**kwargs)
    assert needle in str(err.value), str(err.value)


def test_unknown_keyword_is_rejected_not_swallowed():
    with pytest.raises(TypeError, match="bucket_cap"):
        TorchRecStrategy(bucket_cap=25)  # type: ignore[call-arg]


def test_ddp_kwargs_reach_the_dense_ddp_of_dmp():
    s = TorchRecStrategy(ddp_kwargs={"bucket_cap_mb": 50, "gradient_as_bucket_view": True})
    from rocmtrain.strategies.sharding import data_parallel_wrapper

    wrapper = data_parallel_wrapper(s._args.ddp_kwargs)
    assert wrapper._bucket_cap_mb == 50
    assert wrapper._ddp_kwargs == {"gradient_as_bucket_view": True}


def test_the_strategy_by_name_has_the_cli_defaults():
    """``Trainer(strategy="torchrec")`` and ``python -m rocmtrain`` protect a run the same way."""
    from test_cli import compose

    by_name = TorchRecStrategy()
    gpu = compose("dlrm_dcnv2_h200")
    assert by_name.watchdog_config == gpu.watchdog == WatchdogConfig()
    cpu = compose("dlrm_cpu")
    assert by_name.rccl_config == cpu.rccl == RcclConfig()
    # the CPU recipe agrees on preemption every step (no device to sync with), otherwise the same
    assert cpu.watchdog.preemption_check_every_n_steps == 1
    assert by_name.watchdog_config.preemption_check_every_n_steps == 10
    every = {"preemption_check_every_n_steps": 10}
    assert dataclasses.replace(cpu.watchdog, **every) == by_name.watchdog_config


def test_one_gpu_decision(monkeypatch):
    monkeypatch.setattr(platform, "has_gpu", lambda: True)  # no GPU here: the rule itself
    assert platform.is_gpu_run("auto") and platform.is_gpu_run("gpu")
    assert not platform.is_gpu_run("cpu") and platform.is_gpu_run("cpu", "nccl")
    monkeypatch.setattr(platform, "has_gpu", lambda: False)
    assert not platform.is_gpu_run("auto")
    assert TorchRecStrategy(pipeline="auto").uses_pipeline("gpu")
    assert not TorchRecStrategy(pipeline="auto").uses_pipeline("auto")


@pytest.mark.parametrize("preset", ["default", "strict", "off", "files"])
def test_every_watchdog_preset_name_is_accepted(preset):
    """The presets that build on ``default`` through a defaults list load outside Hydra too, with
    the values Hydra composes for ``watchdog=<preset>``."""
    from test_cli import compose

    assert (
        TorchRecStrategy(watchdog=preset).watchdog_config
        == compose("dlrm_mi300", f"watchdog={preset}").watchdog
    )


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"hbm_cap_gb": "lots"}, "hbm_cap_gb='lots'"),
        ({"hbm_cap_gb": -1}, "hbm_cap_gb=-1"),
        ({"ddr_cap_gb": float("nan")}, "ddr_cap_gb=nan"),
        ({"start_method": "fork"}, "start_method='fork'"),
        ({"per_table_sharding": ["t_cat_0"]}, "per_table_sharding=['t_cat_0']"),
        ({"planner_batch_size": "32"}, "planner_batch_size='32'"),
        ({"ddp_kwargs": "static_graph"}, "ddp_kwargs='static_graph'"),
        ({"run_dir": 123}, "run_dir=123"),
        ({"run_dir": ""}, "run_dir=''"),
        ({"semi_sync_start_batch": "0"}, "semi_sync_start_batch='0'"),
        ({"pooling_factors": {"t_cat_0": "many"}}, "pooling_factors.t_cat_0='many'"),
    ],
)
def test_bad_python_arguments_are_one_config_error(kwargs, needle):
    """A wrong type or value through the Python API is one ConfigError at construction naming
    the argument and the fix, not a TypeError (or a failure at fit) from deep inside."""
    with pytest.raises(ConfigError) as err:
        TorchRecStrategy(**kwargs)
    assert needle in str(err.value) and "is invalid:" in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_registered_spawn_strategies_still_construct():
    assert TorchRecStrategy(start_method="spawn")._start_method == "spawn"


def _small_tables(fused: bool):
    import torch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=8, num_embeddings=64, feature_names=[f"f{i}"]
        )
        for i in range(4)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    if fused:
        apply_optimizer_in_backward(torch.optim.Adagrad, ebc.parameters(), {"lr": 0.5})
    return torch.nn.Sequential(ebc)


def _plan_types(model) -> dict[str, str]:
    plan = TorchRecStrategy(balance="off").plan_for(
        model,
        world_size=2,
        local_world_size=2,
        compute_device="cuda",  # a fake topology
    )
    return {t: ps.sharding_type for m in plan.plan.values() for t, ps in m.items()}


def test_planner_keeps_tables_with_an_embedding_optimizer_sharded():
    """Left to itself the planner makes small tables data-parallel, where DDP trains them with
    the dense optimizer and the one given by apply_optimizer_in_backward silently does nothing;
    with the strategy's constraint they stay sharded (tables without one are left to it)."""
    assert "data_parallel" not in _plan_types(_small_tables(fused=True)).values()
    assert set(_plan_types(_small_tables(fused=False)).values()) == {"data_parallel"}


def test_asked_for_data_parallel_with_an_embedding_optimizer_warns(caplog):
    import logging

    from rocmtrain.strategies.planning import sharding_constraints

    with caplog.at_level(logging.WARNING, logger="rocmtrain.strategies.planning"):
        sharding_constraints(_small_tables(fused=True), "data_parallel")
    assert "table t0 is data_parallel (as asked)" in caplog.text
    assert "apply_optimizer_in_backward" in caplog.text


def test_every_keyword_is_an_argument_field_or_lightnings():
    """``__init__`` hands its ``locals()`` to ``StrategyArguments.of``: a keyword that is neither
    one of its fields nor a ``DDPStrategy`` argument would be dropped without a word."""
    import inspect

    from rocmtrain.config.strategy import StrategyArguments

    own = {f.name for f in dataclasses.fields(StrategyArguments)}
    keywords = set(inspect.signature(TorchRecStrategy.__init__).parameters) - {"self"}
    lightning = {"accelerator", "parallel_devices", "cluster_environment", "checkpoint_io"}
    lightning |= {"precision_plugin", "process_group_backend", "start_method"}
    assert keywords == own | lightning
