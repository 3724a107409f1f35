"""Per-rank hang watchdog: heartbeats off the communicator, a monitor thread, a report, a requeue exit.

How it works (every rank runs the same code; gloo, nccl and RCCL alike):

1. The training thread records progress with :meth:`Watchdog.beat` (phase changes) and
   :meth:`Watchdog.step_done` — an in-memory tuple write, no I/O.
2. A daemon monitor thread wakes every ``poll_interval_seconds``, publishes this rank's heartbeat
   (step, phase, last collective label, requested timeout) on a channel that does not use the
   process group (:mod:`rocmtrain.faults.heartbeat`: a separate TCPStore connection, or files). The
   observers (first and last rank; every rank with ``monitor_every_rank``) read every heartbeat and
   measure, with their own monotonic clock, how long each rank has not moved. The timeout is phase-aware: ``first_step_timeout_seconds`` until step 1 is done,
   ``checkpoint_timeout_seconds`` while any rank checkpoints, otherwise ``hang_timeout_seconds`` or
   the learned ``safety factor x slowest recent step`` (never below the floor).
3. A rank idle past the timeout, a same-host peer whose process is gone, or a peer that reported an
   exception → the first monitor to notice *declares* the hang (atomic ``set_once``). Every rank's
   monitor sees the declaration, dumps its all-thread Python stacks and its flight recorder into the
   attempt directory and acknowledges; silent same-host ranks get SIGUSR2 (faulthandler prints their
   stacks to stderr). The declaring rank writes ``hang_report.json``/``.txt`` naming the stuck
   rank(s), their step and phase (:mod:`rocmtrain.faults.hang_report`), then every process aborts an
   NCCL group (bounded wait; a hung gloo group is not destroyed — that can block) and leaves with
   ``os._exit(watchdog.exit_code)`` (75 = requeue; 1 when a peer failed with an exception).

Without Lightning::

    wd = Watchdog(cfg, run_dir=run_dir, rccl_cfg=rccl_cfg).start()   # after init_process_group
    with wd.guard():
        for step in range(n):
            wd.beat("forward", step=step); loss = model(batch)
            wd.beat("backward"); loss.backward()
            wd.step_done()

With ``TorchRecStrategy``: nothing to add, the strategy drives a
:class:`rocmtrain.faults.guard.FaultGuard`. With another Lightning strategy: :func:`fault_callbacks`
(heartbeats in the hooks, two-phase timeouts, preemption, error hints). Design notes and the report format: ``rocmtrain/faults/HANGS.md``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch.distributed as dist

from rocmtrain.config.rccl import RcclConfig
from rocmtrain.config.watchdog import WatchdogConfig
from rocmtrain.faults import causes
from rocmtrain.faults import hang_report as hr
from rocmtrain.faults.causes import COMM_ERROR, PEER_FAILED, STORE_LOST
from rocmtrain.faults.heartbeat import (
    HOST,
    PID_NS,
    FileKV,
    Heartbeat,
    Progress,
    StoreKV,
    WatchdogCallback,
    pid_alive,
)
from rocmtrain.faults.hints import hint_for_exception

log = logging.getLogger(__name__)


class Watchdog:
    """One rank's watchdog. Create after ``init_process_group``; :meth:`start` is collective."""

    def __init__(
        self,
        cfg: WatchdogConfig,
        *,
        run_dir: str | os.PathLike[str],
        rccl_cfg: RcclConfig | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.cfg, self.rccl = cfg, rccl_cfg or RcclConfig()
        self.run_dir = Path(run_dir)
        self.root = Path(cfg.report_dir) if cfg.report_dir else self.run_dir / "watchdog"
        inited = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if inited else 0)
        self.world_size = (
            world_size if world_size is not None else (dist.get_world_size() if inited else 1)
        )
        self.backend = str(dist.get_backend()) if inited else "none"
        self.first_step_timeout = cfg.first_step_timeout_seconds or self.rccl.init_timeout_seconds
        self.progress = Progress()
        self.beat = self.progress.beat  # hot path: bound method, no extra frame
        self.step_done = self.progress.step_done
        self.attempt, self.attempt_dir = "", self.root
        self.kv: StoreKV | FileKV | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handling = threading.Lock()
        self._seen: dict[int, tuple[int, float]] = {}
        self._beats: dict[int, Heartbeat] = {}
        self._started = time.monotonic()
        self._kv_error_since: float | None = None
        self._dead_since: dict[int, float] = {}

    # -- life cycle ---------------------------------------------------------------------------
    def start(self) -> Watchdog:
        """Agree on an attempt id (one broadcast), open the channel, start the monitor thread."""
        if self.world_size > 1 and not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                f"Watchdog.start() with world_size={self.world_size} needs the default process "
                "group (init_process_group) first: the ranks agree on an attempt id through it"
            )
        self.attempt = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        if self.world_size > 1:
            box = [self.attempt]
            dist.broadcast_object_list(box, src=0)
            self.attempt = box[0]
        self.attempt_dir = self.root / self.attempt
        self.kv = self._open_channel()
        if self.cfg.dump_stacks and hasattr(signal, "SIGUSR2"):
            with contextlib.suppress(Exception):
                faulthandler.register(signal.SIGUSR2, file=sys.__stderr__, all_threads=True)
        self._started = time.monotonic()
        self._publish()
        self._thread = threading.Thread(target=self._run, name="rocmtrain-watchdog", daemon=True)
        self._thread.start()
        log.info(
            "watchdog: rank %d/%d on %s, attempt %s, channel %s, first-step timeout %.0f s, steady %.0f s",
            self.rank,
            self.world_size,
            self.backend,
            self.attempt,
            type(self.kv).__name__,
            self.first_step_timeout,
            self.cfg.hang_timeout_seconds,
        )
        return self

    def finish(self, phase: str = "finished") -> None:
        """Publish a terminal phase (peers stop waiting for this rank) and stop the monitor."""
        self.beat(phase)
        with contextlib.suppress(Exception):
            if self.kv is not None:
                self._publish()
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.cfg.poll_interval_seconds + 1)
        with contextlib.suppress(Exception):
            faulthandler.unregister(signal.SIGUSR2)

    @contextlib.contextmanager
    def guard(self) -> Iterator[Watchdog]:
        """Route an exception of the training loop through :meth:`handle_exception`."""
        try:
            yield self
        except BaseException as e:
            self.handle_exception(e)
            raise
        else:
            self.finish()

    def current_timeout(self) -> float:
        """The timeout this rank asks for now (phase-aware, see the module docstring)."""
        phase = self.progress.state[3]
        if phase.startswith("checkpoint"):
            return self.cfg.checkpoint_timeout_seconds
        if self.progress.steps_done == 0:
            return self.first_step_timeout
        if self.cfg.learn_timeout_from_step_times:
            learned = self.progress.learned_timeout(
                factor=self.cfg.learn_safety_factor,
                floor_s=self.cfg.learn_floor_seconds,
                ceiling_s=self.cfg.hang_timeout_seconds,
                min_steps=self.cfg.learn_min_steps,
            )
            if learned is not None:
                return learned
        return self.cfg.hang_timeout_seconds

    # -- exceptions from the training thread ----------------------------------------------------
    def handle_exception(self, exc: BaseException) -> None:
        """Communication failure → find the culprit and exit the whole job with the requeue code;
        any other exception → tell the peers this rank failed (they exit 1) and return."""
        if self.kv is None or self._stop.is_set():
            return
        if isinstance(exc, SystemExit):
            self.finish("preempted" if exc.code == self.cfg.exit_code else "finished")
            return
        hint = hint_for_exception(exc)
        if not ((hint is not None and hint.comm) or isinstance(exc, dist.DistError)):
            first = (str(exc).strip().splitlines() or [""])[0]
            self.finish(f"failed:{type(exc).__name__}: {first}"[:200])
            if self.world_size > 1:
                # let the observers read "failed" before this process (on rank 0: the store) goes
                time.sleep(min(2 * self.cfg.poll_interval_seconds, 5.0))
            return
        self._dead_peers(self._beats)  # right now, before peers start exiting because of it
        log.error("watchdog: rank %d: communication failure (%s); checking peers", self.rank, exc)
        deadline = time.monotonic() + max(2 * self.cfg.poll_interval_seconds, 2.0)
        while True:
            try:
                declared = self.kv.get("hang")
                if declared:
                    self._respond(json.loads(declared))
                beats, stale_s, timeout = self._observe(self._publish())
                dead = self._dead_peers(beats)
            except Exception:  # noqa: BLE001 - the store went away with its host
                self._local_exit(STORE_LOST.name, f"rank {self.rank}: {exc}")
            failed = any(b.phase.startswith("failed") for b in beats.values())
            if dead or failed or time.monotonic() > deadline:
                decision = None  # classify: the dead or failed peer is the cause
                if not (dead or failed):
                    decision = {
                        "cause": COMM_ERROR.name,
                        "stuck_ranks": [],
                        "summary": f"rank {self.rank} got a communication error while all peers "
                        f"were alive: {exc}",
                    }
                self._declare(beats, stale_s, timeout, dead, set(), decision=decision)
            time.sleep(0.1)

    # -- monitor thread -----------------------------------------------------------------------
    def _open_channel(self) -> StoreKV | FileKV:
        if self.cfg.heartbeat_channel == "tcpstore" and dist.is_initialized():
            try:
                return StoreKV.from_default_group(
                    prefix=f"rocmtrain/watchdog/{self.attempt}/",
                    timeout_s=max(5.0, 4 * self.cfg.poll_interval_seconds),
                )
            except Exception as e:  # noqa: BLE001 - no usable store: say so, use files
                log.warning("watchdog: %s; using files under %s", e, self.attempt_dir)
        return FileKV(self.attempt_dir / "kv")

    def _publish(self) -> Heartbeat:
        hb = Heartbeat.from_progress(
            self.progress, rank=self.rank, timeout_s=self.current_timeout()
        )
        self.kv.set(f"hb/{self.rank}", hb.to_json())  # type: ignore[union-attr]
        return hb

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.poll_interval_seconds):
            try:
                self._tick()
                self._kv_error_since = None
            except Exception as e:  # noqa: BLE001 - the channel failed; decide below
                now = time.monotonic()
                if self._kv_error_since is None:
                    self._kv_error_since = now
                    self._dead_peers(self._beats)
                    log.warning("watchdog: rank %d: heartbeat channel error: %s", self.rank, e)
                grace = min(self.current_timeout(), max(30.0, 3 * self.cfg.poll_interval_seconds))
                if now - self._kv_error_since > grace:
                    self._local_exit(
                        STORE_LOST.name, f"heartbeat channel failing for {grace:.0f} s: {e}"
                    )

    def _tick(self) -> None:
        hb = self._publish()
        declared = self.kv.get("hang")  # type: ignore[union-attr]
        if declared:
            self._respond(json.loads(declared))
        if not (self.cfg.monitor_every_rank or self.rank in (0, self.world_size - 1)):
            if len(self._beats) < self.world_size:  # learn the peers' pids once (dead-peer checks)
                self._observe(hb)
            return
        beats, stale_s, timeout = self._observe(hb)
        dead = self._dead_peers(beats)
        stale = {
            r for r, s in stale_s.items() if s > timeout and not (r in beats and beats[r].terminal)
        }
        failed = any(b.phase.startswith("failed") for b in beats.values())
        if dead or stale or failed:
            self._declare(beats, stale_s, timeout, dead, stale)

    def _observe(self, hb: Heartbeat) -> tuple[dict[int, Heartbeat], dict[int, float], float]:
        raw = self.kv.multi_get([f"hb/{r}" for r in range(self.world_size)])  # type: ignore[union-attr]
        beats = {r: Heartbeat.from_json(v) for r, v in enumerate(raw) if v}
        beats[self.rank] = hb
        now = time.monotonic()
        for r, b in beats.items():
            if self._seen.get(r, (None,))[0] != b.seq:
                self._seen[r] = (b.seq, now)
        stale_s = {
            r: now - self._seen.get(r, (0, self._started))[1] for r in range(self.world_size)
        }
        timeout = max(
            [b.timeout_s for b in beats.values() if not b.terminal] + [self.current_timeout()]
        )
        self._beats = beats
        return beats, stale_s, timeout

    def _dead_peers(self, beats: dict[int, Heartbeat]) -> set[int]:
        """Same-host peers whose process is gone. When several are, only the first ones seen gone:
        peers that exit *because of* the first death (they detected it too) are not culprits."""
        now = time.monotonic()
        for r, b in beats.items():
            if (
                r != self.rank
                and r not in self._dead_since
                and not b.terminal
                and b.host == HOST
                and b.pid_ns == PID_NS
                and not pid_alive(b.pid)
                and not (self.attempt_dir / f"exited_rank{r}").exists()  # left by its watchdog
            ):
                self._dead_since[r] = now
        if not self._dead_since:
            return set()
        first = min(self._dead_since.values())
        return {r for r, t in self._dead_since.items() if t == first}

    # -- the hang protocol --------------------------------------------------------------------
    def _declare(
        self,
        beats: dict[int, Heartbeat],
        stale_s: dict[int, float],
        timeout: float,
        dead: set[int],
        stale: set[int],
        *,
        decision: dict[str, Any] | None = None,
    ) -> None:
        decision = decision or hr.classify(
            beats, world_size=self.world_size, dead=dead, stale=stale
        )
        mine = json.dumps({"declared_by": self.rank, "decision": decision, "timeout_s": timeout})
        winner = json.loads(self.kv.set_once("hang", mine))  # type: ignore[union-attr]
        if winner["declared_by"] != self.rank:
            self._respond(winner)
        if not self._handling.acquire(blocking=False):
            time.sleep(1e9)  # the other thread of this process is already handling it
        code = self._code_for(decision["cause"])
        try:
            log.error("watchdog: rank %d declares a hang: %s", self.rank, decision["summary"])
            dumps = {self.rank: self._dump_local()}
            with contextlib.suppress(Exception):
                self.kv.set(f"ack/{self.rank}", json.dumps(dumps[self.rank]))  # type: ignore[union-attr]
            expected = [r for r in range(self.world_size) if r != self.rank and r not in dead]
            expected = [r for r in expected if not (r in beats and beats[r].terminal)]
            notes = hr.collect_dumps(
                self.kv,
                expected,
                beats,
                dumps,
                timeout_s=self.cfg.collect_timeout_seconds,
                signal_silent=self.cfg.dump_stacks,
            )
            notes.update({r: "process gone" for r in dead})
            decision = hr.refine_with_answers(decision, answered=set(dumps))
            decision = hr.refine_with_flight_recorder(decision, dumps)
            fr_files = hr.find_fr_dump_files(self.rccl.flight_recorder_dump_prefix)
            path = self._report(decision, beats, stale_s, dumps, notes, timeout, fr_files)
            with contextlib.suppress(Exception):
                self.kv.set("done", str(path))  # type: ignore[union-attr]
        finally:
            self._exit(code)

    def _respond(self, declared: dict[str, Any]) -> None:
        """Another rank declared the hang: dump, acknowledge, wait for the report, exit."""
        if not self._handling.acquire(blocking=False):
            time.sleep(1e9)
        cause = declared["decision"]["cause"]
        try:
            info = self._dump_local()
            with contextlib.suppress(Exception):
                self.kv.set(f"ack/{self.rank}", json.dumps(info))  # type: ignore[union-attr]
            deadline = time.monotonic() + self.cfg.collect_timeout_seconds + 10
            # rank 0 hosts the store: stay until the declaring rank has written the report
            while time.monotonic() < deadline:
                try:
                    if self.kv.get("done"):  # type: ignore[union-attr]
                        break
                except Exception:  # noqa: BLE001
                    break
                time.sleep(0.1)
            log.error(
                "watchdog: rank %d exits: hang declared by rank %s (%s)",
                self.rank,
                declared["declared_by"],
                cause,
            )
        finally:
            self._exit(self._code_for(cause))

    def _local_exit(self, cause: str, why: str) -> None:
        """No channel left: write this rank's own report from what it last saw, then exit."""
        if not self._handling.acquire(blocking=False):
            time.sleep(1e9)
        code = self._code_for(cause)
        try:
            beats = self._beats or {
                self.rank: Heartbeat.from_progress(self.progress, rank=self.rank, timeout_s=0)
            }
            dead = self._dead_peers(beats)
            decision = hr.classify(beats, world_size=self.world_size, dead=dead, stale=set())
            if not dead:
                decision = {"cause": cause, "stuck_ranks": [], "summary": why}
            code = self._code_for(decision["cause"])
            now = time.monotonic()
            stale_s = {r: now - t for r, (_, t) in self._seen.items()}
            dumps = {self.rank: self._dump_local()}
            timeout = self.current_timeout()
            self._report(
                decision, beats, stale_s, dumps, {}, timeout, [], f"hang_report_rank{self.rank}"
            )
        finally:
            self._exit(code)

    def _report(
        self,
        decision: dict[str, Any],
        beats: dict[int, Heartbeat],
        stale_s: dict[int, float],
        dumps: dict[int, dict[str, Any]],
        notes: dict[int, str],
        timeout: float,
        fr_files: list[str],
        name: str = "hang_report",
    ) -> Path:
        report = hr.build_report(
            decision=decision,
            beats=beats,
            stale_s=stale_s,
            dumps=dumps,
            notes=notes,
            world_size=self.world_size,
            declared_by=self.rank,
            timeout_s=timeout,
            attempt=self.attempt,
            backend=self.backend,
            fr_files=fr_files,
        )
        path = hr.write_report(
            report, attempt_dir=self.attempt_dir, run_dir=self.run_dir, name=name
        )
        print(hr.render_text(report) + f"hang report: {path}", file=sys.__stderr__, flush=True)
        if decision["cause"] == PEER_FAILED.name:  # the one line a user needs: who failed, and why
            for r in decision["stuck_ranks"]:
                why = beats[r].phase.removeprefix("failed:") if r in beats else "an exception"
                log_path = self.run_dir / "logs" / f"error_rank{r}.txt"
                print(
                    f"rocmtrain: error: rank {r} failed: {why} (traceback: {log_path})",
                    file=sys.__stderr__,
                    flush=True,
                )
        return path

    def _dump_local(self) -> dict[str, Any]:
        info: dict[str, Any] = {}
        try:
            if self.cfg.dump_stacks:
                info["stacks_file"] = hr.dump_stacks(
                    self.attempt_dir / f"stacks_rank_{self.rank}.txt"
                )
            if self.cfg.collect_flight_recorder:
                info.update(
                    hr.dump_flight_recorder(
                        self.attempt_dir / f"fr_rank_{self.rank}", backend=self.backend
                    )
                )
        except Exception as e:  # noqa: BLE001 - evidence is best effort, the exit is not
            info["dump_error"] = repr(e)
        return info

    def _code_for(self, cause: str) -> int:
        return causes.cause(cause).exit_code(self.cfg.exit_code)

    def _exit(self, code: int) -> None:
        with contextlib.suppress(Exception):  # peers must not take this exit for the culprit
            self.attempt_dir.mkdir(parents=True, exist_ok=True)
            (self.attempt_dir / f"exited_rank{self.rank}").write_text(str(code))
        for h in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                h.flush()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        if (
            self.backend == "nccl"
        ):  # abort the communicators, bounded: a wedged GPU must not stop us
            hr.run_with_timeout(lambda: dist.distributed_c10d._abort_process_group(), 5.0)
        os._exit(code)


def fault_callbacks(
    watchdog_cfg: Any, rccl_cfg: Any, run_dir: str | os.PathLike[str]
) -> list[pl.Callback]:
    """The fault guard as Lightning callbacks, for a strategy other than ``TorchRecStrategy``
    (which drives its own guard), in the order they must run.

    ``ErrorHintCallback`` (hints first, before anything may exit), ``WatchdogCallback``
    (heartbeats + hang report), ``TwoPhaseTimeoutCallback`` (after step 1: barrier + short PG
    timeout), ``PreemptionCallback`` (SIGTERM/SIGUSR1 → checkpoint → exit 75). Accepts the typed
    configs or their OmegaConf ``DictConfig`` form.
    """
    from rocmtrain.config.convert import as_config
    from rocmtrain.faults.hints import ErrorHintCallback
    from rocmtrain.faults.preemption import PreemptionCallback
    from rocmtrain.faults.timeouts import TwoPhaseTimeoutCallback

    cfg = as_config(watchdog_cfg, WatchdogConfig, field="watchdog", group="watchdog")
    rccl = as_config(rccl_cfg, RcclConfig, field="rccl", group="rccl")
    run_dir = Path(run_dir)
    callbacks: list[pl.Callback] = []
    if cfg.error_hints:
        callbacks.append(ErrorHintCallback(run_dir))
    if cfg.enabled:

        def start(rank: int, world_size: int) -> Watchdog:
            return Watchdog(
                cfg, run_dir=run_dir, rccl_cfg=rccl, rank=rank, world_size=world_size
            ).start()

        callbacks.append(WatchdogCallback(start))
    if cfg.two_phase_timeouts:
        callbacks.append(TwoPhaseTimeoutCallback(rccl))
    if cfg.preemption:
        callbacks.append(PreemptionCallback(cfg, run_dir))
    return callbacks


def build_callbacks(
    watchdog_cfg: Any, rccl_cfg: Any, run_dir: str | os.PathLike[str]
) -> list[pl.Callback]:
    """Deprecated name of :func:`fault_callbacks` (``rocmtrain.callbacks.build_callbacks`` builds
    the run's training callbacks)."""
    import warnings

    warnings.warn(
        "rocmtrain.faults.watchdog.build_callbacks is now fault_callbacks",
        DeprecationWarning,
        stacklevel=2,
    )
    return fault_callbacks(watchdog_cfg, rccl_cfg, run_dir)
