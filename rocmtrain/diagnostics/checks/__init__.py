"""Doctor checks; :func:`run_checks` runs them all on one :class:`Inputs`."""

from __future__ import annotations

import logging

from rocmtrain.diagnostics.checks import collective_env, gpu, system, versions
from rocmtrain.diagnostics.checks.base import (
    STATUSES,
    Check,
    GpuFacts,
    Inputs,
    gather_gpu_facts,
)

log = logging.getLogger(__name__)

ALL_CHECKS = (*gpu.CHECKS, *versions.CHECKS, *system.CHECKS, *collective_env.CHECKS)


def run_checks(inputs: Inputs, facts: GpuFacts | None = None) -> tuple[GpuFacts, list[Check]]:
    """Gather GPU facts (unless given) and run every check; a crashing check becomes an error."""
    facts = facts if facts is not None else gather_gpu_facts(inputs)
    results: list[Check] = []
    for fn in ALL_CHECKS:
        try:
            out = fn(facts, inputs)
        except Exception as e:  # a doctor must report, not crash
            log.debug("check %s crashed", fn.__name__, exc_info=True)
            out = Check(
                fn.__name__.removeprefix("check_"),
                "error",
                f"check crashed: {e!r}",
                "report this as a rocmtrain bug with `doctor --json` output",
            )
        results.extend(out if isinstance(out, list) else [out])
    return facts, results


__all__ = [
    "ALL_CHECKS",
    "STATUSES",
    "Check",
    "GpuFacts",
    "Inputs",
    "gather_gpu_facts",
    "run_checks",
]
