"""Preemption: SIGTERM/SIGUSR1 → every rank checkpoints at the same step → requeue exit.

:class:`PreemptionCallback` — Slurm sends SIGTERM when it preempts or cancels a job, and
``#SBATCH --signal=USR1@120`` sends SIGUSR1 two minutes before the time limit. The handler only sets
a flag. At the next step boundary (``on_train_batch_end``) the ranks agree with one tiny all-reduce
(MAX of the flags: every rank stops at the *same* step even when only one was signalled), save a
checkpoint and leave with ``SystemExit(watchdog.exit_code)`` (75): the batch script requeues on 75 and
the next attempt resumes from that checkpoint.

Why it replaces Lightning's own handlers: Lightning (2.6) installs its SIGTERM handler in
``Trainer._run`` after ``on_fit_start``; that handler runs a ``dist.broadcast`` *inside the signal
handler* (a collective issued at an arbitrary point of one rank — mismatched when only some ranks
got the signal) and kills launcher children; with ``SLURMEnvironment(auto_requeue=True)`` its SIGUSR1
handler also writes an "hpc" checkpoint elsewhere and runs ``scontrol requeue`` itself, racing our
exit-code requeue. So this callback installs its handlers in ``on_train_start`` (after Lightning's),
and a signal that arrived before that (held by :func:`arm_early` since the CLI started) counts as
received then. Ctrl-C is held the same way: a terminal's SIGINT reaches every rank, and a rank that
met it still starting while its peers were already training would otherwise die alone and leave
them in a collective with a missing peer; held, every rank stops at the same step. And
``train(cfg)`` should build the Trainer with ``plugins=[SLURMEnvironment(auto_requeue=False)]``
under Slurm so Lightning never arms its requeue path. The previous handlers come back at teardown.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist

from rocmtrain import exit_codes
from rocmtrain.config.watchdog import WatchdogConfig

log = logging.getLogger(__name__)


# -- signals that arrive before training starts -----------------------------------------------------
#: what :func:`arm_early` caught: the first signal number (or None), the signals it holds and the
#: handlers they had before (given back by :func:`disarm_early` and the callback's teardown)
_EARLY: dict[str, Any] = {"signal": None, "armed": (), "previous": {}}
EARLY_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")


#: a signal held during start-up still ends the run this soon if training has not taken it over
EARLY_GRACE_SECONDS = 25.0


def _early_handler(signum: int, frame: FrameType | None) -> None:
    _on_early_signal(signum)


_EARLY_LOCK = threading.Lock()


def _on_early_signal(signum: int) -> None:
    with _EARLY_LOCK:  # the handler and the waiter thread can both see the same signal
        if _EARLY["signal"] is not None:
            return
        _EARLY["signal"] = signum
    if signum == signal.SIGINT:
        then = "stop with a checkpoint after the first step"
        now = "; Ctrl-C again stops now"
    else:
        then, now = "checkpoint and requeue exit after the first step", ""
    os.write(
        2,
        f"rocmtrain: got {signal.Signals(signum).name} before training started; {then} (or exit "
        f"within {EARLY_GRACE_SECONDS:.0f} s if training does not start){now}\n".encode(),
    )
    threading.Thread(target=_grace_exit, args=(signum,), daemon=True).start()


def _second_interrupt() -> None:
    """A second Ctrl-C while the first is held: the user wants out now, checkpoint or not."""
    os.write(2, b"rocmtrain: second SIGINT before training started: exiting now\n")
    os._exit(exit_codes.SIGNAL_BASE + signal.SIGINT)


def _grace_exit(signum: int) -> None:
    """A start-up that never reaches training (peers that never arrive) must not swallow the
    signal: end the process the way the signal would have (128 + N) once the grace is over."""
    deadline = time.monotonic() + EARLY_GRACE_SECONDS
    while time.monotonic() < deadline:
        if _EARLY["signal"] != signum:  # training took it over, or it was given back
            return
        time.sleep(0.2)
    os.write(
        2,
        f"rocmtrain: {signal.Signals(signum).name} held for {EARLY_GRACE_SECONDS:.0f} s and "
        "training has not started: exiting without a checkpoint\n".encode(),
    )
    os._exit(exit_codes.SIGNAL_BASE + signum)


class _SignalWaiter(threading.Thread):
    """Sees the held signals on its own thread. A Python signal handler runs only when the main
    thread returns to the interpreter, which a rendezvous blocked inside C++ (a TCPStore waiting
    for peers that never come) does not; but CPython's C-level handler writes every signal number
    to the wakeup fd at once, from whichever thread the kernel picked, and this thread reads it."""

    def __init__(self, signals: tuple[int, ...]) -> None:
        super().__init__(name="rocmtrain-early-signals", daemon=True)
        self.signals = signals
        self.stopped = threading.Event()
        self.interrupts = 0
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self.previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)

    def run(self) -> None:
        import select

        while not self.stopped.is_set():
            ready, _, _ = select.select([self._read], [], [], 0.2)
            if not ready:
                continue
            for signum in os.read(self._read, 64):
                if signum not in self.signals:
                    continue
                # this thread sees every delivery once (the handler may see a burst as one), so
                # it is the one that counts Ctrl-Cs
                self.interrupts += signum == signal.SIGINT
                if self.interrupts > 1 and _EARLY["signal"] == signal.SIGINT:
                    _second_interrupt()
                _on_early_signal(signum)

    def stop(self) -> None:
        signal.set_wakeup_fd(self.previous_fd)
        self.stopped.set()
        self.join(timeout=1.0)
        os.close(self._read)
        os.close(self._write)


def arm_early(names: tuple[str, ...] = EARLY_SIGNALS) -> None:
    """Hold preemption signals from process start until :class:`PreemptionCallback` takes over.

    Without this, a SIGUSR1/SIGTERM that arrives while a rank is still importing, sharding or
    generating data kills it with the default action (no checkpoint, no requeue exit); with it the
    run checkpoints after its first step, or, if training has not started within
    :data:`EARLY_GRACE_SECONDS`, exits ``128 + N``. Called first thing by the CLI;
    :func:`disarm_early` gives back the ones the run's config does not handle.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    armed = []
    for name in names:
        sig = getattr(signal, name)
        current = signal.getsignal(sig)
        if current in (signal.SIG_DFL, None, signal.default_int_handler):
            _EARLY["previous"][sig] = signal.SIG_DFL if current is None else current
        elif current is not _early_handler:
            continue  # someone else's handler: theirs to keep
        signal.signal(sig, _early_handler)
        armed.append(sig)
    _EARLY["armed"] = tuple(armed)
    if armed and _EARLY.get("waiter") is None:
        _EARLY["waiter"] = _SignalWaiter(tuple(armed))
        _EARLY["waiter"].start()


def release_early() -> None:
    """Stop watching for the held signals off the main thread (the installed handlers take them
    from here on)."""
    if threading.current_thread() is not threading.main_thread():
        return
    waiter = _EARLY.pop("waiter", None)
    if waiter is not None:
        waiter.stop()


def disarm_early(keep: list[str] | tuple[str, ...]) -> None:
    """Previous handlers back for the armed signals not in ``keep`` (the run's
    ``watchdog.preemption_signals`` and SIGINT, empty when the watchdog is off); one of them already
    caught is re-delivered, so it acts as if it had never been held (SIGINT: a
    ``KeyboardInterrupt``)."""
    if threading.current_thread() is not threading.main_thread():
        return
    kept = {getattr(signal, name) for name in keep}
    if not kept:
        release_early()
    caught = None
    for sig in _EARLY["armed"]:
        if sig in kept or signal.getsignal(sig) is not _early_handler:
            continue
        signal.signal(sig, early_previous(sig))
        if _EARLY["signal"] == sig:
            _EARLY["signal"], caught = None, sig
    _EARLY["armed"] = tuple(s for s in _EARLY["armed"] if s in kept)
    if caught is not None:  # last: SIGINT raises KeyboardInterrupt right here
        release_early()
        os.kill(os.getpid(), caught)


def early_previous(sig: int) -> Any:
    """The handler ``sig`` had before :func:`arm_early` replaced it (the default action if none):
    Python's ``default_int_handler`` for SIGINT, so Ctrl-C is a ``KeyboardInterrupt`` again."""
    return _EARLY["previous"].get(sig, signal.SIG_DFL)


def take_early_signal(signals: list[int]) -> int | None:
    """The signal :func:`arm_early` caught before training started, if it is one of ``signals``;
    taking it clears it (the taker acts on it, so :func:`disarm_early` must not re-deliver it)."""
    signum = _EARLY["signal"]
    if signum not in signals:
        return None
    _EARLY["signal"] = None
    return signum


def save_preemption_checkpoint(trainer: pl.Trainer, run_dir: Path) -> Path:
    """Collective: save through the foundation's atomic checkpoint layer; returns the path.

    ``rocmtrain.checkpoint.save`` (temp folder + rename + completion marker, keep-last-N, found by
    ``find_resume`` on the next attempt) into the ``AtomicCheckpoint`` callback's root, or
    ``<run_dir>/checkpoints`` when the trainer has no such callback.
    """
    from rocmtrain import checkpoint as ckpt

    cb = next((c for c in trainer.callbacks if isinstance(c, ckpt.AtomicCheckpoint)), None)
    root = cb.root if cb is not None else run_dir / "checkpoints"
    done = Path(root) / ckpt.checkpoint_name(trainer.global_step)
    if ckpt.is_complete(done):  # this very step was saved already (every N steps, epoch end)
        return done
    return Path(ckpt.save(trainer, None if cb is not None else root))


_INTERRUPT, _PREEMPT = 1, 2

#: exit code of a run stopped by Ctrl-C after its checkpoint (the shell's 128 + SIGINT)
INTERRUPTED = exit_codes.INTERRUPTED


def handled_signals(cfg: WatchdogConfig) -> list[str]:
    """The signals :class:`PreemptionCallback` handles: ``cfg.preemption_signals`` and Ctrl-C."""
    return [*dict.fromkeys([*cfg.preemption_signals, "SIGINT"])]


class Preemption:
    """SIGTERM/SIGUSR1 → agree on a step → checkpoint → ``SystemExit(exit_code)``.

    Ctrl-C (SIGINT, sent to every rank of a terminal's process group) takes the same path and
    exits 130 after "interrupted at step N"; a second Ctrl-C interrupts at once. Driven by
    :meth:`install` when training starts, :meth:`at_step_boundary` after each completed step
    (every rank, the same steps) and :meth:`restore` at teardown.
    """

    def __init__(self, cfg: WatchdogConfig, run_dir: Path) -> None:
        self._signals = [getattr(signal, name) for name in handled_signals(cfg)]
        self._every = cfg.preemption_check_every_n_steps
        self._exit_code = cfg.exit_code
        self._run_dir = Path(run_dir)
        self._previous: dict[int, Any] = {}
        self.received: int | None = None
        """The first signal this process received (set by the handler)."""
        self.checkpoint_path: Path | None = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:  # the next Ctrl-C is a plain KeyboardInterrupt again
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if self.received is None or self.received == signal.SIGINT:
            self.received = signum
            # no logging in a signal handler (it may interrupt a logging call); a raw write is safe
            os.write(
                2,
                f"rocmtrain: got {signal.Signals(signum).name}; checkpoint at the next step\n".encode(),
            )

    def install(self) -> None:
        """Take the signals over (after Lightning installed its own handlers)."""
        if threading.current_thread() is not threading.main_thread():
            log.warning("preemption: not on the main thread; signal handlers not installed")
            return
        for sig in self._signals:
            previous = signal.getsignal(sig)
            self._previous[sig] = early_previous(sig) if previous is _early_handler else previous
            signal.signal(sig, self._handler)
        release_early()  # from here the handlers above receive the signals
        if self.received is None:  # a signal held since start-up: checkpoint after the first step
            self.received = take_early_signal(self._signals)
            if self.received == signal.SIGINT:  # that was the first Ctrl-C: the next one is now
                signal.signal(signal.SIGINT, signal.default_int_handler)

    def at_step_boundary(self, trainer: pl.Trainer, *, log_step_metrics: bool = False) -> None:
        """Collective every ``preemption_check_every_n_steps``: when any rank was signalled, all
        save one checkpoint at this step and leave with the requeue (or interrupt) code.

        ``log_step_metrics``: called from ``on_train_batch_end``, before Lightning has logged
        this step's metrics (they are written before the checkpoint, so the run's metrics end
        with the step the checkpoint contains); after the step's hooks they are logged already."""
        if trainer.global_step % self._every:
            return
        verdict = self._agree(trainer)
        if not verdict:
            return
        if log_step_metrics:
            from rocmtrain.callbacks.progress import write_step_metrics_now

            write_step_metrics_now(trainer)
        self.checkpoint_path = save_preemption_checkpoint(trainer, self._run_dir)
        code = self._exit_code if verdict == _PREEMPT else INTERRUPTED
        if verdict == _PREEMPT:
            name = signal.Signals(self.received).name if self.received else "a peer's signal"
            log.warning(
                "preemption (%s): checkpoint at step %d in %s; exiting %d for requeue",
                name,
                trainer.global_step,
                self.checkpoint_path,
                code,
            )
        elif trainer.is_global_zero:
            print(
                f"rocmtrain: interrupted at step {trainer.global_step}; checkpoint: "
                f"{self.checkpoint_path} (the next run with this run_dir resumes from it)",
                file=sys.stderr,
                flush=True,
            )
        raise SystemExit(code)

    def _agree(self, trainer: pl.Trainer) -> int:
        """0 = go on, :data:`_INTERRUPT` = every signalled rank got Ctrl-C only, :data:`_PREEMPT`
        = some rank must requeue; the same answer on every rank (MAX all-reduce)."""
        mine = (
            0
            if self.received is None
            else (_INTERRUPT if self.received == signal.SIGINT else _PREEMPT)
        )
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            t = torch.tensor([mine], dtype=torch.int32, device=trainer.strategy.root_device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return int(t.item())
        return mine

    def restore(self) -> None:
        """Give the signals back to the handlers found at :meth:`install`."""
        if threading.current_thread() is threading.main_thread():
            for sig, handler in self._previous.items():
                # only where ours is still installed: Lightning's signal connector tears down
                # first and puts back what it found before fit; "restoring" the handler we found
                # (Lightning's, bound to this trainer) would keep it installed after fit, and
                # with it the trainer and the whole model alive for the rest of the process
                if signal.getsignal(sig) == self._handler:
                    signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}


class PreemptionCallback(pl.Callback):
    """:class:`Preemption` as a Lightning callback, for a plain Lightning strategy (DDP ...);
    ``TorchRecStrategy`` drives the same object from its own hooks instead."""

    def __init__(self, cfg: WatchdogConfig, run_dir: Path) -> None:
        self.preemption = Preemption(cfg, run_dir)

    @property
    def received(self) -> int | None:
        return self.preemption.received

    @property
    def checkpoint_path(self) -> Path | None:
        return self.preemption.checkpoint_path

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.preemption.install()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.preemption.at_step_boundary(trainer, log_step_metrics=True)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.preemption.restore()
