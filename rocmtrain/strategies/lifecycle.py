"""A rank's life around training: what comes before its process group, and how it ends.

RCCL/NCCL read their environment once, when the first communicator is made, and a rank that
waits for peers that never come hangs without saying why; so the rendezvous checks, the device
binding and the collective environment come before ``init_process_group``
(:func:`prepare_rank`, then :func:`start_process_group`). The strategy's ``setup_environment``
and ``teardown`` call these functions (:func:`release_in_place` keeps the shards where they
are); its run-time protection is :class:`rocmtrain.faults.guard.FaultGuard`, and the process
group is destroyed when the interpreter exits (:mod:`rocmtrain.comms.shutdown`).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from lightning_fabric.plugins.environments import LightningEnvironment

from rocmtrain.strategies.deprecated import mixin_getattr


def prepare_rank(
    cluster_environment: Any,
    *,
    global_rank: int,
    local_rank: int,
    device_type: str,
    first_group: bool,
    port_wait_s: float,
) -> None:
    """Before the process group: die with Lightning's launcher, check the rendezvous address
    (``first_group``: a second fit in this process reuses its group) and bind the device."""
    from rocmtrain.comms.rendezvous import PORT_RELEASE_WAIT_SECONDS, check_master
    from rocmtrain.launch.binding import bind_local_rank

    end_with_launcher(cluster_environment)
    if first_group:
        check_master(
            cluster_environment.main_address,
            cluster_environment.main_port,
            is_store_host=global_rank == 0 and "TORCHELASTIC_RUN_ID" not in os.environ,
            port_wait_s=min(PORT_RELEASE_WAIT_SECONDS, port_wait_s),
        )
    bind_local_rank(local_rank, accelerator="cpu" if device_type == "cpu" else "gpu")


def start_process_group(
    cluster_environment: Any, *, world_size: int, timeout_s: float, start: Callable[[], None]
) -> None:
    """Run Lightning's process-group start (``start``) so that a rendezvous that fails says who
    joined and what to check, and have the group closed before the interpreter exits."""
    from rocmtrain.comms.rendezvous import explain_rendezvous
    from rocmtrain.comms.shutdown import close_at_exit

    env = cluster_environment
    with explain_rendezvous(
        env.main_address, env.main_port, world_size=world_size, timeout_s=timeout_s
    ):
        start()
    close_at_exit()  # Lightning never destroys the group; interpreter teardown can abort


def end_with_launcher(cluster_environment: Any) -> None:
    """Local ranks that Lightning's script launcher started die with it (no orphans)."""
    from rocmtrain.launch.orphans import die_with_parent, started_by_lightning

    if isinstance(cluster_environment, LightningEnvironment) and started_by_lightning():
        die_with_parent()


def end_launched_ranks(launcher: Any) -> None:
    """After an exception in this process: the ranks it launched cannot go on without it and
    would wait in the next collective, so end them."""
    from pytorch_lightning.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

    if isinstance(launcher, _SubprocessScriptLauncher):
        stop_child_observer()
        launcher.kill(signal.SIGKILL)


def release_in_place(strategy: Any) -> None:
    """Lightning's strategy teardown, except that the module stays where it is.

    Lightning's strategies move the module (and the optimizer state) to the CPU here. For a
    sharded recommender that is a copy of every table shard into host memory, slow for large
    tables and a host OOM for tables larger than the host's RAM. The shards stay on their
    devices instead (``del`` the module to free them); the rest of the teardown is Lightning's.
    """
    module = strategy.lightning_module
    if strategy.model is not module and module is not None:
        strategy.model = module  # unwrap DistributedModelParallel
    if strategy._layer_sync is not None and strategy.model is not None:
        strategy.model = strategy._layer_sync.revert(strategy.model)
    assert strategy.cluster_environment is not None
    strategy.cluster_environment.teardown()
    strategy.precision_plugin.teardown()
    assert strategy.accelerator is not None
    strategy.accelerator.teardown()
    strategy.checkpoint_io.teardown()


def stop_child_observer() -> None:
    """Lightning's launcher watches its children from a thread, and when one has exited with an
    error it SIGKILLs this process too (exit 137, read as an OOM kill). The watchdog names a
    failed or dead peer and ends this rank with the right code, and this process ends its
    children itself on its own exception: the watcher must not turn either into a kill of the
    rank that is reporting the error."""
    import threading

    for thread in threading.enumerate():
        if thread.name == "child-process-observer" and hasattr(thread, "_child_processes"):
            thread._child_processes = []  # its next pass sees no child and ends  # type: ignore[attr-defined]


__getattr__ = mixin_getattr(__name__, "RankLifecycleMixin")
