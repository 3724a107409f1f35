"""Gradient health: per-group grad norms, NaN/Inf detection with the culprit, optional skip-step.

    from rocmtrain.precision.grad_health import GradHealthCallback
    trainer = pl.Trainer(callbacks=[GradHealthCallback(log_every_n_steps=50, on_nonfinite="skip_step")])

Runs in ``on_before_optimizer_step`` (after backward and, under ``16-mixed``, after the GradScaler has
unscaled the gradients), every optimizer step:

- every ``log_every_n_steps``: ``grad_norm/<group>`` and ``grad_norm/total`` through ``self.log``
  (so every Lightning logger gets them); groups are embeddings / dense_arch / interaction / over_arch
  (from parameter names, :func:`rocmtrain.precision.policy.group_of`) and ``other``.
- every step: ``grad_health/nonfinite`` (0/1) and ``grad_health/nonfinite_params`` (count).
- a NaN/Inf gradient: the group norms of that step (NaN where the group has one), and a warning naming the first offending
  parameter (model order), its group and the step; the event is kept in ``callback.events``.
  ``on_nonfinite``: ``log`` (step anyway), ``skip_step`` (drop all grads, so ``optimizer.step``
  leaves every parameter and optimizer state untouched), ``raise`` (stop with a FloatingPointError).
  Under ``16-mixed`` a non-finite gradient is a normal loss-scale overflow: the GradScaler already
  skips that step and lowers the scale, so it is logged as ``grad_health/overflow`` only.

Parameters without ``.grad`` (TorchRec fused embedding tables update inside backward) are not seen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytorch_lightning as pl
import torch
from torch.optim import Optimizer
from typing_extensions import override

from rocmtrain.config.precision import NONFINITE_ACTIONS
from rocmtrain.precision.policy import GROUPS, group_of

log = logging.getLogger("rocmtrain.precision")


@dataclass(frozen=True)
class NonFiniteEvent:
    """One step with a NaN/Inf gradient."""

    step: int
    """``trainer.global_step`` of the optimizer step that saw it (0-based)."""
    parameter: str
    """First parameter (in ``named_parameters`` order) whose gradient is not finite."""
    group: str
    kind: str
    """``nan`` or ``inf``."""
    num_bad_parameters: int
    action: str
    """What was done: ``logged``, ``skipped``, ``raised``, ``scaler_skipped``."""


class GradHealthCallback(pl.Callback):
    """Grad norms per parameter group, NaN/Inf detection naming the parameter and step, skip-step."""

    def __init__(self, *, log_every_n_steps: int = 50, on_nonfinite: str = "skip_step") -> None:
        if on_nonfinite not in NONFINITE_ACTIONS:
            raise ValueError(
                f"on_nonfinite={on_nonfinite!r} is not valid; allowed: {', '.join(NONFINITE_ACTIONS)}"
            )
        if log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps={log_every_n_steps} must be >= 1")
        self._every = log_every_n_steps
        self._action = on_nonfinite
        self.events: list[NonFiniteEvent] = []
        self.skipped_steps: list[int] = []

    @classmethod
    def from_config(cls, cfg: object) -> GradHealthCallback:
        """From a :class:`rocmtrain.config.precision.GradHealthConfig`."""
        return cls(log_every_n_steps=cfg.log_every_n_steps, on_nonfinite=cfg.on_nonfinite)  # type: ignore[attr-defined]

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Optimizer
    ) -> None:
        named = [(n, p) for n, p in pl_module.named_parameters() if p.grad is not None]
        if not named:
            return
        step = trainer.global_step
        norms = torch.stack(
            [torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float32) for _, p in named]
        )
        finite = torch.isfinite(norms).cpu()
        ok = bool(finite.all())
        if step % self._every == 0 or not ok:
            self._log_norms(pl_module, named, norms)
        bad = (
            0 if ok else self._handle_nonfinite(trainer, pl_module, optimizer, named, finite, step)
        )
        # logged every step (0 when healthy): Lightning loggers repeat a key's last value otherwise
        metric = (
            "grad_health/overflow"
            if getattr(trainer.precision_plugin, "scaler", None)
            else "grad_health/nonfinite"
        )
        pl_module.log(metric, float(bad > 0), on_step=True, on_epoch=False, batch_size=1)
        pl_module.log(
            "grad_health/nonfinite_params", float(bad), on_step=True, on_epoch=False, batch_size=1
        )

    def _log_norms(self, pl_module: pl.LightningModule, named: list, norms: torch.Tensor) -> None:
        sq: dict[str, torch.Tensor] = {}
        for (name, _), n in zip(named, norms, strict=True):
            g = group_of(name)
            sq[g] = sq.get(g, torch.zeros((), device=n.device)) + n.double() ** 2
        metrics = {f"grad_norm/{g}": v.sqrt().float() for g, v in sq.items()}
        metrics["grad_norm/total"] = torch.stack(list(sq.values())).sum().sqrt().float()
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    def _handle_nonfinite(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        optimizer: Optimizer,
        named: list,
        finite: torch.Tensor,
        step: int,
    ) -> int:
        """Record, log and act on a non-finite gradient; returns the number of bad parameters."""
        bad = [i for i, ok in enumerate(finite.tolist()) if not ok]
        # the norm can overflow for a huge finite grad: confirm on the tensor itself
        bad = [i for i in bad if not bool(torch.isfinite(named[i][1].grad).all())]
        if not bad:
            return 0
        name, param = named[bad[0]]
        kind = "nan" if bool(torch.isnan(param.grad).any()) else "inf"
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            action = "scaler_skipped"
        else:
            action = {"log": "logged", "skip_step": "skipped", "raise": "raised"}[self._action]
        event = NonFiniteEvent(step, name, group_of(name), kind, len(bad), action)
        self.events.append(event)
        where = f"{kind.upper()} gradient at step {step} in parameter {name!r} (group {event.group}); {len(bad)} parameter(s) affected"
        if action == "scaler_skipped":
            log.info("grad health: %s: fp16 loss-scale overflow, GradScaler skips this step", where)
            return len(bad)
        if action == "raised":
            raise FloatingPointError(
                f"{where}. Set precision.grad_health.on_nonfinite=skip_step to skip such steps, "
                "or look at that parameter's inputs (fp16 overflow, log/sqrt of <= 0, a bad batch)"
            )
        if action == "skipped":
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None  # optimizers skip parameters without a gradient
            self.skipped_steps.append(step)
            log.warning("grad health: %s; optimizer step skipped", where)
        else:
            log.warning("grad health: %s; stepping anyway (on_nonfinite=log)", where)
        return len(bad)


__all__ = ["GROUPS", "GradHealthCallback", "NonFiniteEvent"]
