"""The strategy's old mixin names still import, warn, and resolve to the one strategy class."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("rocmtrain.strategies.sharding", "ShardingPlanMixin"),
        ("rocmtrain.strategies.checkpointing", "ShardedCheckpointMixin"),
        ("rocmtrain.strategies.lifecycle", "RankLifecycleMixin"),
    ],
)
def test_old_mixin_names_warn_and_give_the_strategy(module, name):
    from rocmtrain import TorchRecStrategy

    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{name} is deprecated"):
        assert getattr(mod, name) is TorchRecStrategy
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        mod.NoSuchName  # noqa: B018
