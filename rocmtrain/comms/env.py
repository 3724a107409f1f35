"""The one place that writes process environment variables.

Every change goes through :func:`apply_env`, which validates names against the env-var registry
(:mod:`rocmtrain.comms.registry`) and logs ``NAME: old -> new``. Nothing else in rocmtrain assigns to
``os.environ``.

    from rocmtrain.comms.env import apply_env
    apply_env({"NCCL_DEBUG": "WARN", "NCCL_PROTO": None}, source="rccl preset")   # None = unset

Rules: a value already in the environment wins (logged as kept) unless ``force=True``; a fabricated or
dead name (``RCCL_PROTO``, ``NCCL_LL_THRESHOLD``...) raises ``ValueError`` naming the real knob and is
never set; a legacy name is set but logged with a warning naming its replacement.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping

from rocmtrain.comms import registry

log = logging.getLogger(__name__)


def _show(value: str | None) -> str:
    return "<unset>" if value is None else repr(value)


def validate_names(names: list[str] | tuple[str, ...], *, source: str) -> None:
    """Raise ValueError for names rocmtrain must never set; warn for legacy names."""
    bad = [n for n in names if registry.is_forbidden(n)]
    if bad:
        lines = [registry.describe(registry.ENV_VARS[n]) for n in bad]
        raise ValueError(
            f"{source} asks to set invented/dead environment variable(s) {', '.join(bad)}; "
            "nothing reads them. Remove them and use the real knob:\n  " + "\n  ".join(lines)
        )
    for name in names:
        finding = registry.check_name(name, where=source)
        if finding is not None:
            log.warning("%s", finding.message)


def apply_env(
    changes: Mapping[str, str | None],
    *,
    force: bool = False,
    source: str = "rocmtrain",
    environ: MutableMapping[str, str] | None = None,
) -> dict[str, tuple[str | None, str | None]]:
    """Set (or with ``None`` unset) env vars; a value already set wins unless ``force``.

    ``environ`` defaults to ``os.environ`` (tests may pass a dict). Returns ``{name: (old, new)}`` for
    every variable actually changed; each change is logged ``NAME: old -> new (source)``.
    """
    env = os.environ if environ is None else environ
    validate_names(tuple(changes), source=source)
    changed: dict[str, tuple[str | None, str | None]] = {}
    for name, value in changes.items():
        new = None if value is None else str(value)
        old = env.get(name)
        if old == new:
            continue
        if old is not None and not force:
            log.info(
                "%s: %s kept (the environment wins over %s's %s; set force to override)",
                name,
                _show(old),
                source,
                _show(new),
            )
            continue
        if new is None:
            del env[name]
        else:
            env[name] = new
        changed[name] = (old, new)
        log.info("%s: %s -> %s (%s)", name, _show(old), _show(new), source)
    return changed
