"""Gradient health: per-group grad norms, NaN/Inf detection with the culprit, optional skip-step.

    from rocmtrain.callbacks.grad_health import GradHealthCallback
    trainer = pl.Trainer(callbacks=[GradHealthCallback(log_every_n_steps=50, on_nonfinite="skip_step")])

Runs in ``on_before_optimizer_step`` (after backward and, under ``16-mixed``, after the GradScaler has
unscaled the gradients), every optimizer step:

- every step, on the device and with no host sync: the per-parameter fp32 grad norms in one fused
  ``torch._foreach_norm`` call, whether they are all finite, and a device-side count of the
  non-finite steps since the last check (plus the first such step).
- every ``check_every_n_steps`` (``global_step % N == 0``; default 1 = every step): the check. It
  costs ONE device->host sync (one copy of the count, the first step and this step's per-parameter
  flags). A NaN/Inf gradient in this step: the group norms of that step (NaN where the group has
  one), and a warning naming the first offending parameter (model order), its group and the step;
  the event is kept in ``callback.events``. ``on_nonfinite``: ``log`` (step anyway), ``skip_step``
  (drop all grads, so ``optimizer.step`` leaves every parameter and optimizer state untouched),
  ``raise`` (stop with a FloatingPointError).
  Under ``16-mixed`` a non-finite gradient is a normal loss-scale overflow: the GradScaler already
  skips that step and lowers the scale, so it is logged as ``grad_health/overflow`` only.
- with N > 1, a non-finite step between two checks is counted and reported at the next check (and
  at the end of training), but it is NOT skipped: it was already stepped, so ``skip_step`` and
  ``raise`` act only on check steps. The report is a warning with the number of such steps and the
  first one, and one ``NonFiniteEvent`` (``action="logged_late"``, ``parameter="unknown (unchecked
  step)"``: only a check step names the parameter); under ``raise`` the check then raises. GPU
  throughput recipes set N to their log interval; N = 1 checks (and can skip) every step.
- every ``log_every_n_steps``: ``grad_norm/<group>`` and ``grad_norm/total`` through ``self.log``
  (so every Lightning logger gets them); groups are embeddings / dense_arch / interaction / over_arch
  (from parameter names, :func:`rocmtrain.precision.policy.group_of`) and ``other``.
- every step: ``grad_health/nonfinite`` (0/1) and ``grad_health/nonfinite_params`` (count), and
  with N > 1 ``grad_health/nonfinite_steps_since_check`` (the running count, this step included),
  logged as device tensors: Lightning reads them only at its own log interval, so no sync here.
  After a check that found a NaN/Inf they are the confirmed values; otherwise they come from the
  fp32 norms, so a finite gradient whose norm overflows fp32 (elements ~1e19) counts there (and in
  a late report).

Parameters without ``.grad`` (TorchRec fused embedding tables update inside backward) are not seen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytorch_lightning as pl
import torch
from torch.optim import Optimizer
from typing_extensions import override

from rocmtrain.callbacks.progress import loggers_write
from rocmtrain.config.precision import NONFINITE_ACTIONS
from rocmtrain.precision.policy import GROUPS, group_of

log = logging.getLogger("rocmtrain.precision")


UNCHECKED = "unknown (unchecked step)"
"""``NonFiniteEvent.parameter`` of a late report: only a check step can name the parameter."""


def grad_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """fp32 L2 norm of each tensor, as one vector, from one fused ``torch._foreach_norm`` call.

    ``dtype=torch.float32`` accumulates bf16/fp16 grads in fp32 (without it the norms come back in
    the grads' dtype: ~3 significant digits in bf16, overflow above 65504 in fp16); the values are
    those of ``torch.linalg.vector_norm(g, dtype=torch.float32)``."""
    return torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32))


@dataclass(frozen=True)
class NonFiniteEvent:
    """One step with a NaN/Inf gradient, or (``action="logged_late"``) unchecked steps that had one."""

    step: int
    """``trainer.global_step`` of the optimizer step that saw it (0-based); for a late report the
    first unchecked non-finite step since the previous check."""
    parameter: str
    """First parameter (in ``named_parameters`` order) whose gradient is not finite; ``UNCHECKED``
    for a late report."""
    group: str
    kind: str
    """``nan`` or ``inf`` (``unknown`` for a late report)."""
    num_bad_parameters: int
    """0 for a late report (not known)."""
    action: str
    """What was done: ``logged``, ``skipped``, ``raised``, ``scaler_skipped``; for a late report
    ``logged_late`` (those steps were stepped), ``raised_late`` or ``scaler_skipped``."""
    num_steps: int = 1
    """Non-finite steps this event stands for (> 1 only for a late report)."""


class GradHealthCallback(pl.Callback):
    """Grad norms per parameter group, NaN/Inf detection naming the parameter and step, skip-step.

    ``check_every_n_steps``: see the module docstring (one host sync per check; unchecked non-finite
    steps are reported late, not skipped)."""

    def __init__(
        self,
        *,
        log_every_n_steps: int = 50,
        on_nonfinite: str = "skip_step",
        check_every_n_steps: int = 1,
    ) -> None:
        if on_nonfinite not in NONFINITE_ACTIONS:
            raise ValueError(
                f"on_nonfinite={on_nonfinite!r} is not valid; allowed: {', '.join(NONFINITE_ACTIONS)}"
            )
        if log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps={log_every_n_steps} must be >= 1")
        if check_every_n_steps < 1:
            raise ValueError(
                f"check_every_n_steps={check_every_n_steps} must be >= 1 (1 = check every step)"
            )
        self._every = log_every_n_steps
        self._action = on_nonfinite
        self._check_every = check_every_n_steps
        # on the grads' device, int64: [non-finite steps since the last check, first of them]
        self._window: torch.Tensor | None = None
        self.events: list[NonFiniteEvent] = []
        self._params: list[tuple[str, torch.nn.Parameter]] | None = None  # (name, param), cached
        self.skipped_steps: list[int] = []

    @classmethod
    def from_config(cls, cfg: object) -> GradHealthCallback:
        """From a :class:`rocmtrain.config.precision.GradHealthConfig`."""
        return cls(
            log_every_n_steps=cfg.log_every_n_steps,  # type: ignore[attr-defined]
            on_nonfinite=cfg.on_nonfinite,  # type: ignore[attr-defined]
            check_every_n_steps=cfg.check_every_n_steps,  # type: ignore[attr-defined]
        )

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._window = None
        self._params = None

    @override
    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Optimizer
    ) -> None:
        if self._params is None:  # walking the module tree every step costs ~1 ms of host time
            self._params = list(pl_module.named_parameters())
        named = [(n, p) for n, p in self._params if p.grad is not None]
        if not named:
            return
        step = trainer.global_step
        norms = grad_norms([p.grad.detach() for _, p in named])
        finite = torch.isfinite(norms)
        n_bad = (~finite).sum()
        self._accumulate(n_bad > 0, step)
        # device tensors: logging them does not sync (Lightning reads them at its log interval)
        flag, count = (n_bad > 0).float(), n_bad.float()
        # only on the steps Lightning writes: each self.log costs host time (rocmtrain.callbacks.progress)
        writes = loggers_write(trainer)
        if self._check_every > 1 and writes:
            since = self._window.float()[0]  # type: ignore[union-attr]
            self._log(pl_module, "grad_health/nonfinite_steps_since_check", since)
        flags, late_error = [], None
        if step % self._check_every == 0:
            flags, late_error = self._read_window(trainer, f"the check at step {step}", finite)
        ok = all(flags)
        if step % self._every == 0 or not ok:
            self._log_norms(pl_module, named, norms)
        if not ok:
            bad = self._handle_nonfinite(trainer, pl_module, optimizer, named, flags, step)
            flag, count = float(bad > 0), float(bad)
        if late_error:
            raise FloatingPointError(late_error)
        # on every step the loggers write (0 when healthy), not only after a bad one
        if writes:
            scaler = getattr(trainer.precision_plugin, "scaler", None)
            name = "grad_health/overflow" if scaler else "grad_health/nonfinite"
            self._log(pl_module, name, flag)
            self._log(pl_module, "grad_health/nonfinite_params", count)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Report non-finite steps after the last check (only with ``check_every_n_steps`` > 1)."""
        if self._window is not None and self._check_every > 1:
            _, late_error = self._read_window(trainer, "the end of training")
            if late_error:
                raise FloatingPointError(late_error)

    def _accumulate(self, step_bad: torch.Tensor, step: int) -> None:
        """Count a non-finite step into the window, on the device (no sync)."""
        if self._window is None or self._window.device != step_bad.device:
            self._window = torch.zeros(2, dtype=torch.int64, device=step_bad.device)
        w = self._window
        w[1] = torch.where(step_bad & (w[0] == 0), step, w[1])
        w[0] += step_bad

    def _read_window(
        self, trainer: pl.Trainer, when: str, finite: torch.Tensor | None = None
    ) -> tuple[list[int], str | None]:
        """The check's one device->host copy: the window and this step's per-parameter finite
        flags. Reports the window's earlier (unchecked) non-finite steps and resets it; returns the
        flags and, under ``raise``, the error for those steps."""
        parts = [self._window] if finite is None else [self._window, finite.long()]
        n_steps, first, *flags = torch.cat(parts).cpu().tolist()  # type: ignore[list-item]
        self._window.zero_()  # type: ignore[union-attr]
        late = n_steps - (not all(flags))  # this step itself is handled by the caller
        return flags, self._report_late(trainer, late, first, when) if late else None

    def _report_late(self, trainer: pl.Trainer, n: int, first: int, when: str) -> str | None:
        """Record and log ``n`` unchecked non-finite steps; returns the error under ``raise``."""
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            action = "scaler_skipped"
        else:
            action = "raised_late" if self._action == "raise" else "logged_late"
        self.events.append(NonFiniteEvent(first, UNCHECKED, "unknown", "unknown", 0, action, n))
        where = (
            f"{n} step(s) with a NaN/Inf gradient norm since the previous check, the first at "
            f"step {first} (found by {when}; check_every_n_steps={self._check_every})"
        )
        if action == "scaler_skipped":
            log.info("grad health: %s: fp16 loss-scale overflow, GradScaler skipped them", where)
            return None
        log.warning(
            "grad health: %s; those steps were stepped, not skipped: only check steps can skip "
            "(precision.grad_health.check_every_n_steps=1 checks every step)",
            where,
        )
        if action == "logged_late":
            return None
        return (
            f"NaN/Inf gradient: {where}. Set precision.grad_health.check_every_n_steps=1 to stop at "
            "that step and name the parameter"
        )

    @staticmethod
    def _log(pl_module: pl.LightningModule, name: str, value: float | torch.Tensor) -> None:
        pl_module.log(name, value, on_step=True, on_epoch=False, batch_size=1)

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
        finite: list[int],
        step: int,
    ) -> int:
        """Record, log and act on a non-finite gradient; returns the number of bad parameters."""
        bad = [i for i, ok in enumerate(finite) if not ok]
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


__all__ = ["GROUPS", "UNCHECKED", "GradHealthCallback", "NonFiniteEvent", "grad_norms"]
