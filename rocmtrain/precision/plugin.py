"""Lightning precision plugins with rocmtrain's accumulator, BLAS, TunableOp and submodule policy.

        from rocmtrain.config.precision import PrecisionConfig
    from rocmtrain.precision.plugin import build_precision_plugin

    plugin = build_precision_plugin(PrecisionConfig(mode="bf16-mixed"), run_dir="runs/x")
    trainer = pl.Trainer(plugins=[plugin])           # no precision= argument next to it

Modes: ``32`` (:class:`RocmtrainPrecision`), ``bf16-mixed`` / ``16-mixed``
(:class:`RocmtrainMixedPrecision`: ``torch.autocast`` + a ``torch.amp.GradScaler`` for fp16). In the
mixed modes the submodule policy keeps chosen groups (default: embeddings, interaction) out of
autocast. When the strategy sets the plugin up (``convert_module``/``connect``) the global numerics
are applied and reported (:class:`~rocmtrain.precision.numerics.NumericsSession`); ``teardown``
restores every flag and env var it changed and removes the policy hooks.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from pytorch_lightning.plugins.precision import MixedPrecision, Precision
from torch import nn
from typing_extensions import override

from rocmtrain import platform
from rocmtrain.config.precision import PrecisionConfig
from rocmtrain.precision.numerics import NumericsSession
from rocmtrain.precision.policy import apply_submodule_policy, remove_submodule_policy

log = logging.getLogger("rocmtrain.precision")


class _NumericsMixin:
    """Shared by both plugins: apply numerics at setup, restore at teardown."""

    _cfg: PrecisionConfig
    _session: NumericsSession
    _hooked: list[nn.Module]

    def _init_numerics(self, cfg: PrecisionConfig, run_dir: str | Path | None) -> None:
        self._cfg = cfg
        self._session = NumericsSession(cfg, run_dir=run_dir)
        self._hooked = []

    @property
    def numerics(self) -> NumericsSession:
        """The applied global settings and their report lines."""
        return self._session

    def _policy(self) -> dict[str, str]:
        return {}

    def _activate(self, module: nn.Module | None) -> None:
        self._session.apply()
        policy = self._policy()
        # once: convert_module sees the LightningModule, connect the strategy-wrapped model (DMP/DDP)
        # around the same submodules; hooking both would nest two islands per submodule.
        if module is None or not policy or self._hooked:
            return
        islands = apply_submodule_policy(module, policy)
        self._hooked.append(module)
        for group in ("embeddings", "dense_arch", "interaction", "over_arch"):
            names = islands.get(group)
            if names:
                log.info("precision: %s in fp32 (autocast off): %s", group, ", ".join(names))
            elif policy.get(group) == "fp32":
                log.info("precision: policy %s=fp32 but no module named like it was found", group)
            else:
                log.info("precision: %s follows %s autocast", group, self._cfg.mode)

    def _deactivate(self) -> None:
        for module in self._hooked:
            remove_submodule_policy(module)
        self._hooked = []
        self._session.restore()

    # Lightning hooks shared by both plugins; super() is Precision or MixedPrecision.
    @override
    def convert_module(self, module: nn.Module) -> nn.Module:
        self._activate(module)
        return super().convert_module(module)

    @override
    def connect(self, model: nn.Module, optimizers: list, lr_schedulers: list) -> tuple:
        self._activate(model)
        return super().connect(model, optimizers, lr_schedulers)

    @override
    def teardown(self) -> None:
        self._deactivate()
        super().teardown()


class RocmtrainPrecision(_NumericsMixin, Precision):
    """Full fp32 training (``precision.mode=32``) with the global numerics policy applied."""

    precision = "32-true"

    def __init__(self, cfg: PrecisionConfig, *, run_dir: str | Path | None = None) -> None:
        super().__init__()
        self._init_numerics(cfg, run_dir)


class RocmtrainMixedPrecision(_NumericsMixin, MixedPrecision):
    """``bf16-mixed`` / ``16-mixed`` autocast with a per-submodule fp32 policy and fp16 loss scaling."""

    def __init__(
        self,
        cfg: PrecisionConfig,
        *,
        run_dir: str | Path | None = None,
        device: str | None = None,
    ) -> None:
        device = device or ("cuda" if platform.has_gpu() else "cpu")
        scaler = None
        if cfg.mode == "16-mixed":
            ls = cfg.loss_scaling
            scaler = torch.amp.GradScaler(
                device,
                init_scale=ls.init_scale,
                growth_factor=ls.growth_factor,
                backoff_factor=ls.backoff_factor,
                growth_interval=ls.growth_interval,
            )
        super().__init__(precision=cfg.mode, device=device, scaler=scaler)  # type: ignore[arg-type]
        self._init_numerics(cfg, run_dir)

    def _policy(self) -> dict[str, str]:
        p = self._cfg.policy
        return {
            "embeddings": p.embeddings,
            "dense_arch": p.dense_arch,
            "interaction": p.interaction,
            "over_arch": p.over_arch,
        }


def build_precision_plugin(
    cfg: PrecisionConfig, *, run_dir: str | Path | None = None, device: str | None = None
) -> Precision:
    """The Lightning plugin for ``cfg.mode``; pass it as ``Trainer(plugins=[...])``.

    ``run_dir`` is where TunableOp results live (``<run_dir>/tunableop``); ``device`` is the autocast
    device for mixed modes (default: ``cuda`` when a GPU is visible, else ``cpu``).
    """
    if not isinstance(cfg, PrecisionConfig):
        raise TypeError(
            f"build_precision_plugin needs a PrecisionConfig, got {type(cfg).__name__}; build one with "
            "PrecisionConfig(mode=...) or OmegaConf.to_object(cfg.precision)"
        )
    if cfg.mode == "32":
        return RocmtrainPrecision(cfg, run_dir=run_dir)
    return RocmtrainMixedPrecision(cfg, run_dir=run_dir, device=device)
