"""Each config validates itself once, when it is built: a bad value never reaches a rank."""

from __future__ import annotations

import pytest

from rocmtrain import TorchRecStrategy
from rocmtrain.config import ConfigError
from rocmtrain.config.rccl import RcclConfig
from rocmtrain.config.strategy import KERNELS, StrategyConfig
from rocmtrain.config.watchdog import WatchdogConfig


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rccl": {"protocol": "LL64"}}, "rccl.protocol"),
        ({"watchdog": {"hang_timeout_seconds": -1}}, "watchdog.hang_timeout_seconds"),
        ({"sharding_type": "tablewise"}, "sharding_type"),
        ({"per_table_sharding": {"t_cat_0": "auto"}}, "per_table_sharding.t_cat_0"),
        ({"kernel": "cutlass"}, "kernel"),
    ],
)
def test_strategy_arguments_fail_at_construction_naming_the_field(kwargs, field) -> None:
    with pytest.raises(ConfigError) as exc:
        TorchRecStrategy(**kwargs)
    assert exc.value.field == field


def test_dataclasses_validate_in_post_init() -> None:
    with pytest.raises(ConfigError, match="rccl.debug"):
        RcclConfig(debug="LOUD")
    with pytest.raises(ConfigError, match="watchdog.exit_code"):
        WatchdogConfig(exit_code=300)


def test_the_strategy_keeps_the_typed_configs_it_was_given() -> None:
    rccl, wd = RcclConfig(protocol="LL128"), WatchdogConfig(hang_timeout_seconds=60)
    strategy = TorchRecStrategy(rccl=rccl, watchdog=wd)
    assert strategy.rccl_config is rccl and strategy.watchdog_config is wd


def test_options_that_did_nothing_are_gone() -> None:
    assert not hasattr(StrategyConfig(), "name")
    assert KERNELS == ("fbgemm", "triton", "torch")
