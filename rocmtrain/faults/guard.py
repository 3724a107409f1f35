"""Run-time protection of one training run, as one object its strategy drives.

A :class:`FaultGuard` owns what keeps a multi-rank fit from hanging silently or dying without a
word: the error hints, the hang watchdog (heartbeats, hang report, requeue exit), the two-phase
process-group timeouts and the preemption handler. ``TorchRecStrategy`` calls it from its own
hooks, so the user's ``trainer.callbacks`` stay as the user gave them::

    setup_environment  -> guard.attach()                 (before any model work)
    setup (fit)        -> guard.start(rank, world_size)  (watchdog thread)
    on_train_start     -> guard.on_train_start()         (signal handlers)
    each phase         -> guard.beat("backward") ...     (heartbeats)
    a step completed   -> guard.step_boundary(trainer)   (step done, timeouts, preemption)
    on_exception       -> guard.on_exception(exc, rank)  (hint, traceback, watchdog)
    teardown           -> guard.finish()

A step is complete when the next batch is fetched (Lightning has then run every hook of the
step, validation included, and the data position counts exactly the batches trained on), or,
for a module that drives its own pipeline, when its ``training_step`` returns; the guard acts
once per completed optimizer step, whichever comes first. The same pieces serve plain
Lightning strategies as callbacks (:func:`rocmtrain.faults.watchdog.fault_callbacks`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocmtrain.config.rccl import RcclConfig
from rocmtrain.config.watchdog import WatchdogConfig

if TYPE_CHECKING:
    import pytorch_lightning as pl

    from rocmtrain.faults.hints import Hint
    from rocmtrain.faults.preemption import Preemption
    from rocmtrain.faults.watchdog import Watchdog

log = logging.getLogger(__name__)


class FaultGuard:
    """Error hints, hang watchdog, two-phase timeouts and preemption of one fit.

    Args:
        watchdog: which protections are on (``enabled``, ``error_hints``, ``preemption``,
            ``two_phase_timeouts``) and their settings.
        rccl: the process-group timeouts (``init_timeout_seconds``, ``train_timeout_seconds``)
            and the flight-recorder settings the hang report reads.
        run_dir: where hints, tracebacks, hang reports and preemption checkpoints go.
    """

    def __init__(self, watchdog: WatchdogConfig, rccl: RcclConfig, run_dir: Path) -> None:
        self.cfg, self.rccl, self.run_dir = watchdog, rccl, Path(run_dir)
        self.watchdog: Watchdog | None = None
        self.preemption: Preemption | None = None
        self.hint: Hint | None = None
        """The hint of the last exception (None: none, or not a known error)."""
        self.steady = False
        """Whether the process groups run with the steady-state timeout (after step 1)."""
        self._last_step: int | None = None

    # -- life cycle ---------------------------------------------------------------------------
    def start(self, rank: int, world_size: int) -> None:
        """Start the watchdog (collective: the ranks agree on an attempt id)."""
        from rocmtrain.faults.preemption import Preemption
        from rocmtrain.faults.watchdog import Watchdog

        self._last_step, self.steady = None, False
        if self.cfg.preemption:
            self.preemption = Preemption(self.cfg, self.run_dir)
        if self.cfg.enabled and self.watchdog is None:
            self.watchdog = Watchdog(
                self.cfg, run_dir=self.run_dir, rccl_cfg=self.rccl, rank=rank, world_size=world_size
            ).start()

    def on_train_start(self, global_step: int) -> None:
        """Training begins: take the preemption signals over (after Lightning's handlers)."""
        self._last_step = global_step
        if self.preemption is not None:
            self.preemption.install()

    def finish(self) -> None:
        """The fit is over: the watchdog says so to its peers, the signals go back."""
        if self.preemption is not None:
            self.preemption.restore()
            self.preemption = None
        if self.watchdog is not None:
            self.watchdog.finish()
            self.watchdog = None

    # -- progress -----------------------------------------------------------------------------
    def beat(self, phase: str, step: int | None = None) -> None:
        """A heartbeat naming what this rank does now (a hang report shows the last one)."""
        if self.watchdog is not None:
            self.watchdog.beat(phase, step)

    def step_boundary(self, trainer: pl.Trainer) -> None:
        """Once per completed optimizer step (every rank at the same steps): the watchdog learns
        the step time, step 1 switches to the short timeout, a pending signal checkpoints."""
        step = trainer.global_step
        if self._last_step is None or step == self._last_step:
            return  # before training, or no optimizer step since the last boundary
        self._last_step = step
        if self.watchdog is not None:
            self.watchdog.step_done(step)
        if self.cfg.two_phase_timeouts and not self.steady:
            from rocmtrain.faults.timeouts import enter_steady_state

            enter_steady_state(self.rccl)
            self.steady = True
        if self.preemption is not None:
            self.preemption.at_step_boundary(trainer)

    def watch(self, loader: Iterable[Any], trainer: pl.Trainer) -> Iterable[Any]:
        """``loader`` whose every fetch first closes the step before it (:meth:`step_boundary`)."""
        return _GuardedLoader(loader, self, trainer)

    # -- failures -----------------------------------------------------------------------------
    def on_exception(self, exception: BaseException, rank: int) -> None:
        """Hint and traceback first (the peers print their paths), then the watchdog: a
        communication failure finds its culprit and ends the job; anything else is reported to
        the peers as this rank's failure."""
        from rocmtrain.faults.hints import explain, write_traceback

        if self.cfg.error_hints:
            self.hint = explain(exception, run_dir=self.run_dir, rank=rank)
            if not isinstance(exception, (SystemExit, KeyboardInterrupt)):
                write_traceback(exception, self.run_dir, rank)
        if self.watchdog is not None:
            self.watchdog.handle_exception(exception)


class _GuardedLoader:
    """The training loader, with the guard's step boundary before each fetch. Everything else
    (``len``, ``sampler``, ``dataset``, ``state_dict`` ...) is the wrapped loader's."""

    def __init__(self, loader: Iterable[Any], guard: FaultGuard, trainer: pl.Trainer) -> None:
        self.loader, self._guard, self._trainer = loader, guard, trainer

    def __iter__(self) -> Iterator[Any]:
        self._guard.step_boundary(self._trainer)  # the last step of the epoch before
        for batch in self.loader:
            yield batch
            self._guard.step_boundary(self._trainer)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)
