"""Values of the collective library's own environment that RCCL/NCCL do not reject: a wrong one
is read silently and the run fails later (or says nothing), so the doctor checks them.

``NCCL_SOCKET_IFNAME`` names interfaces by prefix (``eth``), exactly (``=eth0``) or excludes them
(``^docker``); a list that matches no interface of this node leaves the bootstrap without a
socket. ``NCCL_DEBUG`` takes VERSION, WARN, INFO or TRACE (any case); anything else is ignored.
"""

from __future__ import annotations

import socket

from rocmtrain.diagnostics.checks.base import Check, GpuFacts, Inputs

DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")


def _interfaces() -> list[str]:
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:
        return []


def socket_ifname_problem(value: str, interfaces: list[str]) -> str | None:
    """Why ``NCCL_SOCKET_IFNAME=value`` selects no interface of ``interfaces``; None if it does."""
    text = value.strip()
    exclude = text.startswith("^")
    text = text.lstrip("^")
    exact = text.startswith("=")
    names = [n.strip() for n in text.lstrip("=").split(",") if n.strip()]
    if not names:
        return "is empty"

    def hit(name: str, iface: str) -> bool:
        return iface == name if exact else iface.startswith(name)

    chosen = [i for i in interfaces if any(hit(n, i) for n in names) != exclude]
    if chosen:
        return None
    return f"matches no network interface of this node (it has: {', '.join(interfaces)})"


def check_collective_env(facts: GpuFacts, inputs: Inputs) -> list[Check]:
    env = inputs.environ
    out: list[Check] = []
    if "NCCL_SOCKET_IFNAME" in env:
        value = env["NCCL_SOCKET_IFNAME"]
        interfaces = _interfaces()
        problem = socket_ifname_problem(value, interfaces) if interfaces else None
        out.append(
            Check(
                "env.NCCL_SOCKET_IFNAME",
                "error" if problem else "ok",
                f"NCCL_SOCKET_IFNAME={value!r} " + (problem or "selects an interface"),
                "name an interface of `ip -br link` (prefix eth, exact =eth0, exclude ^docker), "
                "or unset it"
                if problem
                else "",
            )
        )
    if "NCCL_DEBUG" in env:
        value = env["NCCL_DEBUG"]
        good = value.strip().upper() in DEBUG_LEVELS
        out.append(
            Check(
                "env.NCCL_DEBUG",
                "ok" if good else "warn",
                f"NCCL_DEBUG={value!r}" + ("" if good else " is not a level RCCL/NCCL knows"),
                "" if good else f"use one of {', '.join(DEBUG_LEVELS)} (INFO to debug), or unset",
            )
        )
    return out


CHECKS = (check_collective_env,)
