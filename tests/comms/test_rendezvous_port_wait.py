"""A requeued job restarts on its old ``MASTER_PORT``; a process of the previous attempt may hold
it for a few more seconds. Rank 0 waits for it (bounded) instead of failing at once; a port that
stays busy still ends in the one-line error. Real sockets."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from rocmtrain.comms.rendezvous import RendezvousError, check_port_free


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen()
    return sock


def test_a_port_freed_while_rank_0_waits_is_used(caplog: pytest.LogCaptureFixture) -> None:
    held = _listener()
    port = held.getsockname()[1]
    threading.Timer(1.0, held.close).start()
    started = time.monotonic()
    check_port_free(port, wait_s=20, poll_s=0.05)
    assert 0.9 < time.monotonic() - started < 10
    said = [r.getMessage() for r in caplog.records if "waiting up to 20 s" in r.getMessage()]
    assert len(said) == 1, caplog.text  # said once, not once per poll


def test_a_port_that_stays_busy_fails_after_the_wait_naming_it() -> None:
    with _listener() as held:
        port = held.getsockname()[1]
        started = time.monotonic()
        busy = rf"MASTER_PORT={port} is already in use on this host \(and was for the 0.5 s"
        with pytest.raises(RendezvousError, match=busy):
            check_port_free(port, wait_s=0.5, poll_s=0.05)
        assert time.monotonic() - started >= 0.5
        with pytest.raises(RendezvousError, match="Unset MASTER_PORT"):
            check_port_free(port)  # no wait: at once, as before
