"""RCCL/NCCL + process-group schema (owner: rccl). Stub; the RCCL work fleshes it out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RcclConfig:
    """Collective-library knobs applied before the process group exists, and PG timeouts."""

    init_timeout_seconds: float = 1800.0
    """Process-group timeout for initialisation and the first step."""
    train_timeout_seconds: float = 600.0
    """Process-group timeout after the first step (steady state)."""
