"""The run directory before training starts: writable, held by one run, the previous attempt's
metrics kept.

:func:`write_error` is the one write probe (the CLI checks the composed ``run_dir`` with it before
Hydra creates the folder; :func:`prepare_run_dir` again in every rank). :func:`prepare_run_dir`
also takes the run's lock (:mod:`rocmtrain.run_lock`) and renames an earlier attempt's
``logs/metrics.csv``, which Lightning's CSV logger would delete.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from rocmtrain.ranks import is_launching_rank

if TYPE_CHECKING:
    from rocmtrain.config.schema import RunConfig

log = logging.getLogger(__name__)

#: the fix when another run holds the run dir (``{}``: who holds it)
IN_USE = (
    "another run ({}) is using this folder; wait for it to end, or give this run its own "
    "run_dir (leave run_dir out for runs/<recipe>/<date_time>)"
)


def write_error(path: Path) -> OSError | None:
    """Create ``path`` and write a file in it; the error when that fails, else None. A real
    write, since ``os.access`` says yes to root on a read-only file system."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        return exc
    return None


def prepare_run_dir(cfg: RunConfig) -> Path:
    """Create ``run_dir`` (checked writable before anything starts) and keep the metrics of an
    earlier attempt: Lightning's CSV logger deletes ``logs/metrics.csv`` when it starts."""
    from rocmtrain.config import ConfigError

    run_dir = Path(cfg.run_dir)
    exc = write_error(run_dir)
    if exc is not None:
        raise ConfigError(
            "run_dir", cfg.run_dir, f"cannot write there ({exc.strerror}); choose a writable folder"
        )
    if not is_launching_rank():
        return run_dir
    from rocmtrain import run_lock

    other = run_lock.acquire(run_dir)
    if other is not None:
        raise ConfigError("run_dir", cfg.run_dir, IN_USE.format(other))
    _keep_previous_metrics(run_dir)
    return run_dir


#: the previous attempt's metrics.csv as this process renamed it (prepare_run_dir)
_KEPT_METRICS: list[Path] = []


def _keep_previous_metrics(run_dir: Path) -> None:
    """Rename an earlier attempt's ``logs/metrics.csv`` to ``metrics.attempt<N>.csv``."""
    metrics = run_dir / "logs" / "metrics.csv"
    if not metrics.is_file():
        return
    n = 1
    while (kept := metrics.with_name(f"metrics.attempt{n}.csv")).exists():
        n += 1
    metrics.rename(kept)
    _KEPT_METRICS.append(kept)
    log.info("resume: the previous attempt's metrics are kept in %s", kept)


def put_back_metrics(run_dir: Path) -> None:
    """Undo prepare_run_dir's rename when the run could not resume (no new metrics written)."""
    metrics = run_dir / "logs" / "metrics.csv"
    while _KEPT_METRICS:
        kept = _KEPT_METRICS.pop()
        if kept.parent == metrics.parent and kept.is_file() and not metrics.exists():
            kept.rename(metrics)
