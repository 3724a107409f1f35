"""rocmtrain: train TorchRec recommender models on AMD Instinct (and NVIDIA) GPUs with Lightning.

Importing the package registers rocmtrain's strategies in Lightning's ``StrategyRegistry`` so an
existing script can say ``Trainer(strategy="torchrec")``.
"""

from __future__ import annotations

__version__ = "0.1.0"


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
