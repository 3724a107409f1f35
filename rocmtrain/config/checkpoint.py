"""Checkpoint schema: atomic sharded checkpoints (``rocmtrain.checkpoint``) and auto-resume.

python -m rocmtrain checkpoint.every_n_train_steps=100 checkpoint.keep_last=3
"""

from __future__ import annotations

from dataclasses import dataclass

from rocmtrain.config import ConfigError


@dataclass
class CheckpointConfig:
    """When to write checkpoints, how many to keep, and where to resume from."""

    enabled: bool = True
    """Write checkpoints at all."""
    dir: str = "${run_dir}/checkpoints"
    """Root folder of the checkpoints (one sub-folder per checkpoint)."""
    every_n_train_steps: int | None = None
    """Also write one every N optimizer steps (``null`` = only at epoch ends)."""
    every_n_epochs: int = 1
    """Write one at the end of every N-th epoch (0 = never at epoch ends)."""
    keep_last: int = 2
    """Complete checkpoints to keep; older ones are deleted after a new one is complete."""
    resume: str = "auto"
    """``auto``: resume from the newest complete checkpoint under ``dir`` if any; ``never``;
    or a path to one checkpoint folder."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` for an unusable value (field, value and fix named)."""
        if self.keep_last < 1:
            raise ConfigError("checkpoint.keep_last", self.keep_last, "keep at least 1")
        if self.every_n_train_steps is not None and self.every_n_train_steps < 1:
            raise ConfigError(
                "checkpoint.every_n_train_steps", self.every_n_train_steps, "use >= 1 or null"
            )
        if self.every_n_epochs < 0:
            raise ConfigError("checkpoint.every_n_epochs", self.every_n_epochs, "use >= 0")
