"""The one place that writes process environment variables (owner: rccl). Stub.

Every change goes through :func:`apply_env`, which validates names against the env-var registry and
logs ``NAME: old -> new``. Nothing else in rocmtrain assigns to ``os.environ``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

log = logging.getLogger(__name__)


def apply_env(
    changes: Mapping[str, str | None], *, force: bool = False, source: str = "rocmtrain"
) -> dict[str, tuple[str | None, str | None]]:
    """Set (or with ``None`` unset) env vars; a value already set wins unless ``force``.

    Returns ``{name: (old, new)}`` for every variable actually changed.
    """
    changed: dict[str, tuple[str | None, str | None]] = {}
    for name, value in changes.items():
        old = os.environ.get(name)
        if old is not None and not force:
            if old != value:
                log.info("%s: %s kept (user value wins over %s's %r)", name, old, source, value)
            continue
        if value is None:
            if old is not None:
                del os.environ[name]
                changed[name] = (old, None)
        elif old != value:
            os.environ[name] = str(value)
            changed[name] = (old, str(value))
        if name in changed:
            log.info("%s: %s -> %s (%s)", name, old, value, source)
    return changed
