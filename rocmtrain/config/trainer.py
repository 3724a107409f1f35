"""Trainer schema: the subset of ``pytorch_lightning.Trainer`` arguments a recipe sets.

python -m rocmtrain trainer.max_epochs=3 trainer.devices=2 trainer.accelerator=cpu
"""

from __future__ import annotations

from dataclasses import dataclass

from rocmtrain.config import ConfigError, check_choice

ACCELERATORS = ("cpu", "gpu", "auto")


@dataclass
class TrainerConfig:
    """Where and how long to train; passed to ``pl.Trainer``."""

    accelerator: str = "cpu"
    """``cpu`` (gloo), ``gpu`` (CUDA or ROCm: nccl/RCCL) or ``auto`` (gpu when one is visible)."""
    devices: int = 2
    """Processes (ranks) per node: CPU processes, or GPUs (GCDs on MI250) per node."""
    num_nodes: int = 1
    """Nodes; world size = ``devices * num_nodes``."""
    max_epochs: int = 1
    """Epochs to train."""
    max_steps: int = -1
    """Stop after this many optimizer steps (-1 = no limit)."""
    limit_train_batches: int | None = None
    """Train batches per epoch per rank (``null`` = the whole epoch)."""
    limit_val_batches: int | None = None
    """Validation batches per rank (``null`` = all)."""
    log_every_n_steps: int = 10
    """Logging interval (steps) of train metrics."""
    progress_bar: bool = True
    """Show a progress bar (rank 0 only)."""
    progress_bar_refresh_steps: int = 10
    """Refresh the progress bar every N steps (a high value keeps logs short)."""
    deterministic: bool = False
    """``torch.use_deterministic_algorithms`` via Lightning (slower on GPU)."""
    num_sanity_val_steps: int = 0
    """Validation batches run before training as a smoke check (0 = none)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` for an unusable value (field, value and fix named)."""
        check_choice("trainer.accelerator", self.accelerator, ACCELERATORS)
        for name in ("devices", "num_nodes", "max_epochs", "log_every_n_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"trainer.{name}", getattr(self, name), "use a positive integer")
        for name in ("limit_train_batches", "limit_val_batches"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"trainer.{name}", value, "use a batch count >= 0 or null")
