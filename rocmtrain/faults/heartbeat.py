"""Heartbeats: what each rank is doing, and the channels that carry it past a hung communicator.

The training thread only touches :class:`Progress` (one tuple assignment per phase, well under a
microsecond); the watchdog's monitor thread publishes it once per poll through a key-value channel
that does not use the process group:

- :class:`StoreKV` — a *separate* client connection to the rendezvous TCPStore (the one at
  ``MASTER_ADDR:MASTER_PORT`` that ``init_process_group`` used). The store server runs in a
  background thread of rank 0 (or of the torchrun agent), so it answers while the training threads
  are blocked inside a collective.
- :class:`FileKV` — one small file per key under a directory (shared filesystem across nodes).

Both expose the same five calls (``set``, ``get``, ``multi_get``, ``set_once``, ``close``); keys are
``/``-separated. ``set_once`` is the atomic "first writer wins" used to declare a hang exactly once.

Example::

    progress = Progress()
    progress.beat("forward", step=7)           # training thread
    kv = StoreKV.from_default_group(prefix="rocmtrain/watchdog/<attempt>/")
    kv.set("hb/0", Heartbeat.from_progress(progress, rank=0, timeout_s=300).to_json())
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch.distributed as dist

#: phases after which a rank is legitimately silent (not hung)
TERMINAL_PHASES = ("finished", "preempted", "failed")


class Progress:
    """In-process progress of one rank, written by the training thread, read by the monitor.

    ``state`` is replaced as one tuple ``(seq, step, beat_in_step, phase, collective, wall_time)`` so
    the monitor never sees a half-updated record. ``seq`` counts every beat; ``beat_in_step``
    restarts at each completed step, so ``(step, beat_in_step)`` orders ranks running the same loop.
    """

    __slots__ = ("state", "steps_done", "step_times", "_last_step_end")

    def __init__(self, *, history: int = 200) -> None:
        self.state: tuple[int, int, int, str, str, float] = (0, 0, 0, "init", "", time.time())
        self.steps_done = 0
        self.step_times: deque[float] = deque(maxlen=history)
        self._last_step_end: float | None = None

    def beat(self, phase: str, step: int | None = None, collective: str = "") -> None:
        """Record that this rank reached ``phase`` (of ``step``; default: the current step)."""
        seq, cur, in_step, _, _, _ = self.state
        self.state = (
            seq + 1,
            cur if step is None else step,
            in_step + 1,
            phase,
            collective,
            time.time(),
        )

    def step_done(self, step: int | None = None) -> None:
        """Record the end of a training step (its duration feeds the learned timeout)."""
        now = time.monotonic()
        if self._last_step_end is not None:
            self.step_times.append(now - self._last_step_end)
        self._last_step_end = now
        self.steps_done += 1
        seq, cur, _, _, _, _ = self.state
        nxt = cur + 1 if step is None else step
        self.state = (seq + 1, nxt, 0, "step_done", "", time.time())

    def learned_timeout(
        self, *, factor: float, floor_s: float, ceiling_s: float, min_steps: int
    ) -> float | None:
        """``factor`` x slowest recent step, clamped to ``[floor_s, ceiling_s]``; None until
        ``min_steps`` step times are known."""
        if len(self.step_times) < min_steps:
            return None
        return min(ceiling_s, max(floor_s, factor * max(self.step_times)))


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


HOST = socket.gethostname()
PID_NS = _pid_namespace()


@dataclass
class Heartbeat:
    """One rank's published record (JSON on the channel)."""

    rank: int
    step: int
    beat_in_step: int
    phase: str
    collective: str
    seq: int
    wall_time: float
    """``time.time()`` of the last beat on that rank (for the report; staleness is measured with the
    observer's own monotonic clock, so clock skew between nodes does not matter)."""
    timeout_s: float
    """The hang timeout this rank asks for right now (first step, checkpoint, learned, ...)."""
    pid: int
    host: str
    pid_ns: str

    @classmethod
    def from_progress(cls, progress: Progress, *, rank: int, timeout_s: float) -> Heartbeat:
        seq, step, in_step, phase, collective, wall = progress.state
        return cls(
            rank, step, in_step, phase, collective, seq, wall, timeout_s, os.getpid(), HOST, PID_NS
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Heartbeat:
        return cls(**json.loads(text))

    @property
    def terminal(self) -> bool:
        return self.phase.split(":", 1)[0] in TERMINAL_PHASES


def pid_alive(pid: int) -> bool:
    """True unless ``pid`` is gone or a zombie (``os.kill(pid, 0)`` alone calls a zombie alive)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class StoreKV:
    """Key-value channel on a dedicated TCPStore client connection (never blocks on a missing key)."""

    def __init__(self, store: dist.Store, *, prefix: str) -> None:
        self._store = dist.PrefixStore(prefix, store)

    @classmethod
    def from_default_group(cls, *, prefix: str, timeout_s: float = 10.0) -> StoreKV:
        """Open a new connection to the store behind the default process group.

        Raises RuntimeError when that store is not a TCPStore (e.g. ``init_method=file://``): use
        ``watchdog.heartbeat_channel=files`` then.
        """
        store = dist.distributed_c10d._get_default_store()
        while isinstance(store, dist.PrefixStore):
            store = store.underlying_store
        if not isinstance(store, dist.TCPStore):
            raise RuntimeError(
                f"the default process group uses a {type(store).__name__}, not a TCPStore; "
                "set watchdog.heartbeat_channel=files"
            )
        timeout = timedelta(seconds=timeout_s)
        if hasattr(store, "clone"):  # torch >= 2.5: a new socket to the same server
            clone = store.clone()
            clone.set_timeout(timeout)
        else:
            clone = dist.TCPStore(
                store.host, store.port, is_master=False, timeout=timeout, wait_for_workers=False
            )
        return cls(clone, prefix=prefix)  # the PG's own connection is never shared

    def set(self, key: str, value: str) -> None:
        self._store.set(key, value)

    def get(self, key: str) -> str | None:
        if not self._store.check([key]):
            return None
        return self._store.get(key).decode()

    def multi_get(self, keys: list[str]) -> list[str | None]:
        if keys and self._store.check(keys):
            return [v.decode() for v in self._store.multi_get(keys)]
        return [self.get(k) for k in keys]

    def set_once(self, key: str, value: str) -> str:
        """Set ``key`` unless it exists; return the value that won."""
        return self._store.compare_set(key, "", value).decode()

    def close(self) -> None:
        self._store = None  # type: ignore[assignment]


class FileKV:
    """Key-value channel on files: ``<root>/<key>`` written via temp file + rename."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def _tmp(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        # pid + thread id: the monitor thread and the training thread may write the same key
        return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")

    def set(self, key: str, value: str) -> None:
        path = self._path(key)
        tmp = self._tmp(path)
        tmp.write_text(value)
        os.replace(tmp, path)

    def get(self, key: str) -> str | None:
        try:
            return self._path(key).read_text()
        except FileNotFoundError:
            return None

    def multi_get(self, keys: list[str]) -> list[str | None]:
        return [self.get(k) for k in keys]

    def set_once(self, key: str, value: str) -> str:
        path = self._path(key)
        tmp = self._tmp(path)
        tmp.write_text(value)
        try:
            os.link(tmp, path)  # atomic, fails if the key exists; the content is complete
            return value
        except FileExistsError:
            return path.read_text()
        finally:
            tmp.unlink(missing_ok=True)

    def close(self) -> None:
        pass


class WatchdogCallback(pl.Callback):
    """Lightning hooks → heartbeats (one phase per hook); starts the watchdog in ``setup('fit')``.

    ``start_watchdog(rank, world_size)`` returns a started :class:`rocmtrain.faults.watchdog.Watchdog`
    (``fault_callbacks`` passes it; kept as a callable so this module does not import the watchdog).
    """

    def __init__(self, start_watchdog: Callable[[int, int], Any]) -> None:
        self._start = start_watchdog
        self.watchdog: Any = None

    def _beat(self, phase: str, step: int | None = None) -> None:
        if self.watchdog is not None:
            self.watchdog.beat(phase, step)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self.watchdog is None:
            self.watchdog = self._start(trainer.global_rank, trainer.world_size)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._beat("epoch_start", trainer.global_step)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._beat("train_batch", trainer.global_step)

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any
    ) -> None:
        self._beat("backward")

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._beat("after_backward")

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        self._beat("optimizer_step")

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.watchdog is not None:
            self.watchdog.step_done(trainer.global_step)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._beat("validation_start")

    def on_validation_batch_start(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._beat("validation")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._beat("validation_end")

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._beat("checkpoint")

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if self.watchdog is not None:
            self.watchdog.handle_exception(exception)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.watchdog is not None and stage == "fit":
            self.watchdog.finish()
            self.watchdog = None
