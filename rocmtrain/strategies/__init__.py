"""Lightning strategies of rocmtrain; ``register_strategies()`` runs on ``import rocmtrain``.

import rocmtrain                      # registers "torchrec", "torchrec_table_wise", ...
pl.Trainer(strategy="torchrec", accelerator="cpu", devices=2)
"""

from __future__ import annotations

from rocmtrain.strategies.torchrec import REGISTERED, TorchRecStrategy

__all__ = ["REGISTERED", "TorchRecStrategy", "register_strategies"]


def register_strategies() -> None:
    """Add rocmtrain's strategies to Lightning's ``StrategyRegistry`` (idempotent)."""
    from pytorch_lightning.strategies import StrategyRegistry

    TorchRecStrategy.register_strategies(StrategyRegistry)
