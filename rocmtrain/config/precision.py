"""Precision schema (owner: precision). Stub; the precision work fleshes it out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrecisionConfig:
    """Numerics of a run: Lightning precision mode plus accumulator/BLAS/atomics policy."""

    mode: str = "32"
    """Lightning precision: ``"32"``, ``"bf16-mixed"`` or ``"16-mixed"``."""
