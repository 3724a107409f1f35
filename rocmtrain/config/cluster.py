"""Cluster schema (owner: launch/Slurm). Stub; the Slurm work fleshes it out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ClusterConfig:
    """Where ranks run: ``local`` (spawned here) or ``slurm`` (submitted as a batch job)."""

    kind: str = "local"
    """``local`` or ``slurm``."""
