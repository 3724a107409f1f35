"""Watchdog schema (owner: watchdog). Stub; the watchdog work fleshes it out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WatchdogConfig:
    """Hang detection: heartbeats, hang timeout, report, requeue exit code."""

    enabled: bool = True
    """Run the per-rank watchdog."""
    hang_timeout_seconds: float = 300.0
    """Seconds without progress on any rank before a hang is declared."""
