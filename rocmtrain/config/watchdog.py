"""Watchdog + faults schema (Hydra group ``watchdog``; presets in ``configs/watchdog/``).

Consumed by :class:`rocmtrain.faults.guard.FaultGuard` (the strategy's) and
:func:`rocmtrain.faults.watchdog.fault_callbacks` (other strategies). The process-group timeouts and the
flight-recorder settings are *not* here: they live in :class:`rocmtrain.config.rccl.RcclConfig`
(``init_timeout_seconds``, ``train_timeout_seconds``, ``flight_recorder_*``), which the watchdog
reads. ``python -m rocmtrain watchdog=strict watchdog.hang_timeout_seconds=120 ...``.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from rocmtrain import exit_codes
from rocmtrain.config import ConfigError, check_choice

HEARTBEAT_CHANNELS = ("tcpstore", "files")


@dataclass
class WatchdogConfig:
    """Hang detection (heartbeats, hang timeout, report, requeue exit) and preemption handling."""

    enabled: bool = True
    """Run the per-rank hang watchdog (heartbeats + monitor thread). The error hints and the
    preemption handler are separate switches below."""
    hang_timeout_seconds: float = 300.0
    """Seconds a rank may go without progress (a heartbeat: step/phase change) in steady state before
    a hang is declared. With ``learn_timeout_from_step_times`` this is the ceiling."""
    first_step_timeout_seconds: float | None = None
    """Timeout until the first training step has completed (init, planner, compilation, first
    all-to-all). None: ``rccl.init_timeout_seconds``."""
    checkpoint_timeout_seconds: float = 1800.0
    """Timeout while any rank is inside a checkpoint save (large sharded writes are slow)."""
    learn_timeout_from_step_times: bool = True
    """Tighten the steady-state timeout to ``learn_safety_factor`` x the slowest of the recent step
    times, never below ``learn_floor_seconds`` nor above ``hang_timeout_seconds``."""
    learn_safety_factor: float = 10.0
    """Multiplier on the slowest recent step time when learning the timeout."""
    learn_floor_seconds: float = 60.0
    """Lower bound of a learned timeout (covers epoch boundaries, validation start, GC pauses)."""
    learn_min_steps: int = 20
    """Steps observed before a learned timeout replaces ``hang_timeout_seconds``."""
    heartbeat_channel: str = "tcpstore"
    """How heartbeats travel, independent of the (possibly hung) communicator: ``tcpstore`` = a
    separate client connection to the rendezvous TCPStore (MASTER_ADDR:MASTER_PORT); ``files`` =
    one JSON file per rank under ``report_dir`` (needs a filesystem shared by all nodes)."""
    poll_interval_seconds: float = 1.0
    """How often each rank's monitor thread publishes its heartbeat and checks its peers."""
    monitor_every_rank: bool = False
    """False: the first and the last rank read every heartbeat (two observers, so a hang is found
    even if one of them is starved; store traffic O(N)). True: every rank does (O(N^2) traffic;
    fine up to a few dozen ranks). Every rank always publishes and obeys a declared hang."""
    dump_stacks: bool = True
    """On a hang, every rank dumps all-thread Python stacks (faulthandler); ranks that do not answer
    get SIGUSR2 (faulthandler prints their stacks to their stderr)."""
    collect_flight_recorder: bool = True
    """On a hang, every rank writes its PyTorch flight-recorder buffer (nccl and, in torch >= 2.8,
    gloo) next to the report. Needs ``rccl.flight_recorder_entries`` > 0."""
    collect_timeout_seconds: float = 10.0
    """How long the rank that declares the hang waits for the others' stack/flight-recorder dumps."""
    report_dir: str = ""
    """Where heartbeats (files channel), dumps and hang reports go. Empty: ``<run_dir>/watchdog``."""
    exit_code: int = exit_codes.REQUEUE
    """Exit code after a hang or a preemption checkpoint (75 = EX_TEMPFAIL, requeue)."""

    # -- faults --
    error_hints: bool = True
    """Rewrite known RCCL/NCCL/HIP errors (watchdog timeouts, ncclCommInitRank, invalid device
    function, out of memory) into actionable hints when training raises."""
    preemption: bool = True
    """Handle ``preemption_signals``: checkpoint at the next step boundary, then exit ``exit_code``."""
    preemption_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])
    """Signals that mean "save and requeue" (Slurm sends SIGTERM on preemption/scancel, and the
    ``--signal=USR1@120`` warning before the time limit)."""
    preemption_check_every_n_steps: int = 10
    """Ranks agree (one tiny all-reduce) every N steps on whether any rank was signalled. On a
    multi-GPU run each check is also one host sync, which stops the host from queueing the next
    step ahead of the GPU: every 10 steps by default (a signal then takes up to 10 steps, seconds,
    well inside ``#SBATCH --signal=USR1@120`` and the 25 s grace); the CPU recipe checks every step
    (no device to sync with)."""
    two_phase_timeouts: bool = True
    """After step 1: barrier, then switch every process group to ``rccl.train_timeout_seconds``."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the first bad field, its value and the fix."""
        for name in ("hang_timeout_seconds", "poll_interval_seconds", "checkpoint_timeout_seconds"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"watchdog.{name}", getattr(self, name), "use a positive number")
        if self.first_step_timeout_seconds is not None and self.first_step_timeout_seconds <= 0:
            raise ConfigError(
                "watchdog.first_step_timeout_seconds",
                self.first_step_timeout_seconds,
                "use a positive number, or null for rccl.init_timeout_seconds",
            )
        if self.poll_interval_seconds * 2 > self.hang_timeout_seconds:
            raise ConfigError(
                "watchdog.poll_interval_seconds",
                self.poll_interval_seconds,
                f"poll at least twice per hang timeout ({self.hang_timeout_seconds} s)",
            )
        if self.learn_safety_factor < 2:
            raise ConfigError(
                "watchdog.learn_safety_factor", self.learn_safety_factor, "use >= 2 (10 is typical)"
            )
        if self.learn_floor_seconds < 2 * self.poll_interval_seconds:
            raise ConfigError(
                "watchdog.learn_floor_seconds",
                self.learn_floor_seconds,
                f"use >= 2 x poll_interval_seconds ({2 * self.poll_interval_seconds} s)",
            )
        if self.learn_min_steps < 1:
            raise ConfigError("watchdog.learn_min_steps", self.learn_min_steps, "use >= 1")
        check_choice("watchdog.heartbeat_channel", self.heartbeat_channel, HEARTBEAT_CHANNELS)
        if self.collect_timeout_seconds < 0:
            raise ConfigError(
                "watchdog.collect_timeout_seconds", self.collect_timeout_seconds, "use >= 0"
            )
        if not 0 <= self.exit_code <= 255:
            raise ConfigError("watchdog.exit_code", self.exit_code, "use 0-255 (75 = requeue)")
        for name in self.preemption_signals:
            if not isinstance(getattr(signal, str(name), None), signal.Signals) or name in (
                "SIGKILL",
                "SIGSTOP",
            ):
                raise ConfigError(
                    "watchdog.preemption_signals",
                    name,
                    "use catchable signal names such as SIGTERM, SIGUSR1, SIGUSR2",
                )
        if self.preemption_check_every_n_steps < 1:
            raise ConfigError(
                "watchdog.preemption_check_every_n_steps",
                self.preemption_check_every_n_steps,
                "use >= 1",
            )
