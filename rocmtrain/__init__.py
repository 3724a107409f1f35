"""rocmtrain: train TorchRec recommender models on AMD Instinct (and NVIDIA) GPUs with Lightning.

Importing the package registers rocmtrain's strategies in Lightning's ``StrategyRegistry`` so an
existing script can say ``Trainer(strategy="torchrec")``.
"""

from __future__ import annotations

__version__ = "0.1.0"


def _register_strategies() -> None:
    try:
        from rocmtrain.strategies import register_strategies
    except ImportError:  # strategies not importable yet (partial install): subcommands still work
        return
    register_strategies()


_register_strategies()
