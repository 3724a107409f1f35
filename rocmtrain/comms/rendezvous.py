"""Rendezvous checks around ``init_process_group``: fail in seconds, naming host, port and fix.

Without them a ``MASTER_ADDR`` that does not resolve retries silently until the process-group
timeout, and a busy ``MASTER_PORT`` surfaces as a bare ``EADDRINUSE`` from the TCPStore.

    check_master("node001", 29500, is_store_host=True)   # before init_process_group
    with explain_rendezvous("node001", 29500, world_size=8, timeout_s=300):
        dist.init_process_group(...)
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import socket
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)


class RendezvousError(RuntimeError):
    """The ranks cannot meet; the message names the address, what went wrong and the fix."""


def resolve(host: str, port: int) -> None:
    """Raise :class:`RendezvousError` when ``host`` does not resolve."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise RendezvousError(
            f"MASTER_ADDR={host!r} does not resolve ({exc.strerror}). Set MASTER_ADDR to the host "
            "name or IP address of the node that runs rank 0 (under Slurm rocmtrain takes the first "
            "host of the job's node list; check `scontrol show hostnames $SLURM_JOB_NODELIST`)."
        ) from None


#: how long the store host waits for a busy ``MASTER_PORT`` to be released (never longer than
#: ``rccl.init_timeout_seconds``): a requeued job restarts on its old port, which a process of the
#: previous attempt (still exiting, or a leftover rank being killed) may hold for a few seconds
PORT_RELEASE_WAIT_SECONDS = 30.0


def port_in_use(port: int) -> bool:
    """Whether listening on ``port`` on this host fails with EADDRINUSE (IPv6 and IPv4)."""
    for family, addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this host: the IPv4 check decides
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((addr, port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    continue
                return True
        return False
    return False


def check_port_free(port: int, *, wait_s: float = 0.0, poll_s: float = 0.25) -> None:
    """Raise :class:`RendezvousError` when this host cannot listen on ``port`` (rank 0 hosts the
    TCPStore there), after waiting up to ``wait_s`` for it to be released (said once, at once)."""
    deadline = time.monotonic() + wait_s
    told = False
    while port_in_use(port):
        if time.monotonic() >= deadline:
            waited = f" (and was for the {wait_s:g} s rank 0 waited)" if wait_s else ""
            raise RendezvousError(
                f"MASTER_PORT={port} is already in use on this host{waited}, so rank 0 cannot host "
                "the rendezvous there (another job, or a previous run still alive: `ss -ltnp "
                f"'sport = :{port}'`). Unset MASTER_PORT (a free port is picked) or choose a "
                "free one."
            )
        if not told:
            log.warning(
                "MASTER_PORT=%d is in use on this host; waiting up to %g s for it to be released "
                "(a requeued job keeps its port; a previous attempt's process may still hold it)",
                port,
                wait_s,
            )
            told = True
        time.sleep(poll_s)


def check_master(host: str, port: int, *, is_store_host: bool, port_wait_s: float = 0.0) -> None:
    """Everything that can be checked before ``init_process_group``: the address resolves, and on
    the rank that hosts the store, the port is free (or freed within ``port_wait_s``)."""
    resolve(host, port)
    if is_store_host:
        check_port_free(port, wait_s=port_wait_s)


_JOINED = re.compile(r"(\d+)\s*/\s*(\d+)\s+clients joined", re.IGNORECASE)
_TIMEOUT = re.compile(r"time(?:d)?\s*out|timeout", re.IGNORECASE)


@contextlib.contextmanager
def explain_rendezvous(
    host: str, port: int, *, world_size: int, timeout_s: float
) -> Iterator[None]:
    """Turn the store's timeout while waiting for peers into :class:`RendezvousError` saying how
    many ranks arrived (the store host knows) and what to check."""
    try:
        yield
    except Exception as exc:  # torch raises DistStoreError / RuntimeError with text only
        text = str(exc)
        if not _TIMEOUT.search(text):
            raise
        m = _JOINED.search(text)
        arrived = f"{m.group(1)} of {m.group(2)} ranks arrived" if m else "not every rank arrived"
        raise RendezvousError(
            f"rendezvous at {host}:{port} timed out after {timeout_s:g} s: {arrived} "
            f"(world size {world_size}). Check that every rank was started (trainer.devices x "
            "trainer.num_nodes ranks: on several nodes, the same command on each node with "
            "MASTER_ADDR, MASTER_PORT and NODE_RANK, or cluster=slurm), that MASTER_ADDR is "
            "reachable from every node, or raise rccl.init_timeout_seconds."
        ) from exc
