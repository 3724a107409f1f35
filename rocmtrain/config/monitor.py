"""Device monitoring / profiling schema (owner: diagnostics). Stub; diagnostics fleshes it out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MonitorConfig:
    """Per-device utilisation/memory/power monitoring and step-time statistics."""

    enabled: bool = True
    """Attach the device-monitor callback."""
