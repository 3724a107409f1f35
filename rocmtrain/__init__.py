"""rocmtrain: train TorchRec recommender models on AMD Instinct (and NVIDIA) GPUs with Lightning.

Importing the package registers rocmtrain's strategies in Lightning's ``StrategyRegistry`` so an
existing script can say ``Trainer(strategy="torchrec")``. The public API::

    from rocmtrain import TorchRecStrategy, RcclConfig, WatchdogConfig, PrecisionConfig
    from rocmtrain import EmbeddingBagCollection, get_sharders, RunConfig, train
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

from rocmtrain.console import quiet_dependencies  # noqa: E402  (before TorchRec/FBGEMM load)

quiet_dependencies()

#: public name -> module that defines it (imported on first use: the diagnostics subcommands
#: must work without torchrec)
_PUBLIC = {
    "TorchRecStrategy": "rocmtrain.strategies",
    "RcclConfig": "rocmtrain.config.rccl",
    "WatchdogConfig": "rocmtrain.config.watchdog",
    "PrecisionConfig": "rocmtrain.config.precision",
    "RunConfig": "rocmtrain.config.schema",
    "ConfigError": "rocmtrain.config",
    "EmbeddingBagCollection": "rocmtrain.embedding",
    "get_sharders": "rocmtrain.embedding",
    "train": "rocmtrain.train",
}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'rocmtrain' has no attribute {name!r}")


from rocmtrain.log_setup import install_fallback  # noqa: E402

install_fallback()

#: why the strategies could not be registered (None when they were): shown by the doctor and
#: raised again by anything that needs them, so a broken install is never silently ignored.
STRATEGY_IMPORT_ERROR: BaseException | None = None


def _register_strategies() -> None:
    global STRATEGY_IMPORT_ERROR
    try:
        from rocmtrain.strategies import register_strategies

        register_strategies()
    except Exception as exc:  # torchrec/fbgemm/Lightning missing or broken: subcommands still work
        STRATEGY_IMPORT_ERROR = exc
        import warnings

        warnings.warn(
            f"rocmtrain: training strategies unavailable ({type(exc).__name__}: {exc}); "
            "the diagnostics subcommands still work. Install torchrec + fbgemm-gpu matching your "
            "torch (README: Install) to train.",
            RuntimeWarning,
            stacklevel=2,
        )


_register_strategies()
