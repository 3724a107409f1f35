"""The strategy's old mixin names, still importable from their modules with a DeprecationWarning.

``TorchRecStrategy`` was one class over mixins (``ShardingPlanMixin``, ``ShardedCheckpointMixin``,
``RankLifecycleMixin``); their methods are now its own, so each old name resolves to it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable


def mixin_getattr(module: str, name: str) -> Callable[[str], object]:
    """A module ``__getattr__`` that resolves ``name`` to ``TorchRecStrategy`` with a warning."""

    def __getattr__(attr: str) -> object:
        if attr != name:
            raise AttributeError(f"module {module!r} has no attribute {attr!r}")
        from rocmtrain.strategies.torchrec import TorchRecStrategy

        warnings.warn(
            f"{module}.{name} is deprecated: TorchRecStrategy is one class now; subclass or "
            "use rocmtrain.TorchRecStrategy instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return TorchRecStrategy

    return __getattr__
