"""Typed configuration of a run: one dataclass schema per concern, composed by Hydra.

``schema.RunConfig`` is the root; ``schema.register_configs()`` stores it (and the recipes) in
Hydra's ConfigStore. Values are validated where they enter: type and key errors at compose time
(OmegaConf), value errors by ``validate_run_config`` which raises :class:`ConfigError` naming the
field, the bad value and the fix.
"""

from __future__ import annotations

_WHOLE = object()


class ConfigError(ValueError):
    """A config value is unusable; the message names the field, the value and what to do.

    ``ConfigError(field, value, fix)``, or ``ConfigError(message)`` for a message that already
    names all three (one error type for every config module)."""

    def __init__(self, field: str, value: object = _WHOLE, fix: str = "") -> None:
        if value is _WHOLE:
            self.field, self.value, self.fix = None, None, None
            super().__init__(field)
            return
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"{field}={value!r} is invalid: {fix}")


def check_choice(field: str, value: object, allowed: tuple[str, ...]) -> None:
    """Raise :class:`ConfigError` unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(field, value, f"choose one of {', '.join(allowed)}")
