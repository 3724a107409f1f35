"""A rank's life around training: its environment before the process group, its fault
handling while it trains, and the way back at the end.

RCCL/NCCL read their environment once, when the first communicator is made, and a rank that
waits for peers that never come hangs without saying why; so the checks and the collective
environment come before ``init_process_group``, and :mod:`rocmtrain.faults` (error hints, hang
watchdog, two-phase timeouts, preemption) joins the trainer right after it. The collectives the
strategy itself calls beat the watchdog's heartbeat with their name, so a hang report says which
one a rank waits in. At the end the environment is restored as it was, and the process group
is destroyed when the interpreter exits (:mod:`rocmtrain.comms.shutdown`).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from lightning_fabric.plugins.environments import LightningEnvironment
from pytorch_lightning.strategies import ParallelStrategy
from typing_extensions import override

from rocmtrain.config import ConfigError

if TYPE_CHECKING:
    import pytorch_lightning as pl

    from rocmtrain.config.rccl import RcclConfig
    from rocmtrain.config.watchdog import WatchdogConfig


class RankLifecycleMixin(ParallelStrategy):
    """Environment, fault handling and teardown of :class:`~rocmtrain.strategies.TorchRecStrategy`.

    A ``ParallelStrategy`` subclass so that the hooks it overrides are checked against
    Lightning's; mixed in before ``DDPStrategy``, whose hooks its ``super()`` calls reach. The
    strategy sets the attributes declared below in its ``__init__``.
    """

    _rccl_cfg: RcclConfig
    _watchdog_cfg: WatchdogConfig
    _run_dir: Path | None
    _env_changes: dict[str, tuple[str | None, str | None]]

    if TYPE_CHECKING:

        @property
        def num_nodes(self) -> int: ...

        @property
        def num_processes(self) -> int: ...

    @override
    def setup_environment(self) -> None:
        # Order matters: check the rendezvous, bind the device and set the collective env BEFORE
        # the process group (RCCL/NCCL read their env once, when the first communicator is made).
        from rocmtrain.comms.rendezvous import (
            PORT_RELEASE_WAIT_SECONDS,
            check_master,
            explain_rendezvous,
        )
        from rocmtrain.comms.shutdown import close_at_exit

        self._end_with_launcher()
        env = self.cluster_environment
        assert env is not None
        host, port = env.main_address, env.main_port
        if not dist.is_initialized():  # a second fit in this process reuses its process group
            check_master(
                host,
                port,
                is_store_host=self._hosts_store(),
                port_wait_s=min(PORT_RELEASE_WAIT_SECONDS, self._rccl_cfg.init_timeout_seconds),
            )
        self._bind_local_rank()
        self._apply_rccl_env()
        with explain_rendezvous(
            host,
            port,
            world_size=self.num_nodes * self.num_processes,
            timeout_s=self._rccl_cfg.init_timeout_seconds,
        ):
            super().setup_environment()
        close_at_exit()  # Lightning never destroys the group; interpreter teardown can abort
        self._attach_fault_handling()

    def _hosts_store(self) -> bool:
        """Whether this rank creates the rendezvous TCPStore (a torchrun agent already did)."""
        return self.global_rank == 0 and "TORCHELASTIC_RUN_ID" not in os.environ

    def _end_with_launcher(self) -> None:
        """Local ranks that Lightning's script launcher started die with it (no orphans)."""
        from rocmtrain.launch.orphans import die_with_parent, started_by_lightning

        if isinstance(self.cluster_environment, LightningEnvironment) and started_by_lightning():
            die_with_parent()

    def _bind_local_rank(self) -> None:
        from rocmtrain.launch.binding import bind_local_rank

        bind_local_rank(
            self.local_rank, accelerator="cpu" if self.root_device.type == "cpu" else "gpu"
        )

    def _apply_rccl_env(self) -> None:
        from rocmtrain.comms.rccl import apply_rccl_config

        try:
            self._env_changes = apply_rccl_config(self._rccl_cfg, run_dir=self.run_dir)
        except ValueError as exc:
            raise ConfigError("rccl", "(environment)", str(exc)) from exc

    @property
    def run_dir(self) -> Path:
        """Where this run's reports go: ``run_dir``, else the trainer's ``default_root_dir``."""
        if self._run_dir is not None:
            return self._run_dir
        trainer = self._trainer()
        return Path(trainer.default_root_dir) if trainer is not None else Path.cwd()

    def _trainer(self) -> pl.Trainer | None:
        module = self.lightning_module
        return getattr(module, "_trainer", None) if module is not None else None

    def _attach_fault_handling(self) -> None:
        """Error hints, watchdog, two-phase timeouts and preemption join the trainer's callbacks,
        first, so they see every later hook (the user's list stays as it was given)."""
        from rocmtrain.faults.watchdog import build_callbacks

        trainer = self._trainer()
        if trainer is None:
            raise RuntimeError("TorchRecStrategy: no trainer attached to the LightningModule")
        ours = build_callbacks(self._watchdog_cfg, self._rccl_cfg, self.run_dir)
        kinds = tuple(type(c) for c in ours)
        trainer.callbacks[:] = ours + [c for c in trainer.callbacks if not isinstance(c, kinds)]
        if self._watchdog_cfg.enabled:
            # the watchdog names a failed or dead peer and ends this rank with the right code;
            # Lightning's child watcher would SIGKILL it first whenever a peer exits non-zero
            # (also a peer that left on its watchdog's word while this rank reports its error)
            _stop_child_observer()

    # -- collectives: heartbeats name a rank that waits in one ----------------------------------
    def _beat(self, phase: str) -> None:
        from rocmtrain.faults.heartbeat import WatchdogCallback

        trainer = self._trainer()
        for cb in trainer.callbacks if trainer is not None else ():
            if isinstance(cb, WatchdogCallback) and cb.watchdog is not None:
                cb.watchdog.beat(phase)

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        self._beat("barrier")
        super().barrier(*args, **kwargs)

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        self._beat("broadcast")
        return super().broadcast(obj, src)

    @override
    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)
        # The error hints and the watchdog (callbacks) have had their turn; the ranks this process
        # launched cannot go on without it and would wait in the next collective: end them.
        from pytorch_lightning.strategies.launchers.subprocess_script import (
            _SubprocessScriptLauncher,
        )

        if isinstance(exception, Exception) and isinstance(
            self.launcher, _SubprocessScriptLauncher
        ):
            _stop_child_observer()
            self.launcher.kill(signal.SIGKILL)

    @override
    def teardown(self) -> None:
        """Restore the environment and release the plugins; the module stays where it is.

        Lightning's strategies move the module (and the optimizer state) to the CPU here. For a
        sharded recommender that is a copy of every table shard into host memory: measured
        19 s for the 27 GiB of DLRM-DCNv2 on one H200, and a host OOM for tables larger than
        the host's RAM. The shards stay on their devices instead (``del`` the module to free
        them); the rest of Lightning's teardown runs as usual.
        """
        self._restore_env()
        module = self.lightning_module
        if self.model is not module and module is not None:
            self.model = module  # unwrap DistributedModelParallel
        if self._layer_sync is not None and self.model is not None:
            self.model = self._layer_sync.revert(self.model)
        assert self.cluster_environment is not None
        self.cluster_environment.teardown()
        self.precision_plugin.teardown()
        assert self.accelerator is not None
        self.accelerator.teardown()
        self.checkpoint_io.teardown()

    def _restore_env(self) -> None:
        from rocmtrain.comms.env import apply_env

        if self._env_changes:
            old = {name: before for name, (before, _) in self._env_changes.items()}
            apply_env(old, force=True, source="teardown")
            self._env_changes = {}


def _stop_child_observer() -> None:
    """Lightning's launcher watches its children from a thread, and when one has exited with an
    error it SIGKILLs this process too (exit 137, read as an OOM kill). Here this process ends
    the children itself, for its own exception: the watcher must not turn that into a kill of
    the rank that is reporting the error."""
    import threading

    for thread in threading.enumerate():
        if thread.name == "child-process-observer" and hasattr(thread, "_child_processes"):
            thread._child_processes = []  # its next pass sees no child and ends  # type: ignore[attr-defined]
