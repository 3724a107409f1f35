"""Dependency noise: log lines a user cannot act on, shown at most once per run.

A run is many processes: one per rank, and helpers that import the same libraries again (compile
workers, loader processes). A dependency that warns at import warns in each of them: FBGEMM's
release-compatibility table lags its own releases, so ``import fbgemm_gpu`` logs "no entry for
1.6.0" in every process (pytorch/FBGEMM#5953), and torch.fx logs its ``is_fx_tracing`` hint
once per process that TorchRec traces in. :func:`quiet_dependencies` (run when ``rocmtrain`` is
imported, before TorchRec and FBGEMM are) lets each such line through once, in the first
process of the run (global rank 0, not a helper process), and drops it everywhere else.
Nothing else is filtered: a dependency's other warnings and errors reach the user as they are.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re

#: (logger name, pattern of the message): lines known to say nothing a user can act on
NOISE: tuple[tuple[str, re.Pattern[str]], ...] = (
    # fbgemm_gpu/__init__.py logs through the root logger at import
    ("", re.compile(r"_fbgemm_torch_compat_table has no entry")),
    ("torch.fx._symbolic_trace", re.compile(r"is_fx_tracing will return true")),
)


def first_process() -> bool:
    """Global rank 0's own process (not a rank Lightning or torchrun started, not a helper)."""
    if multiprocessing.parent_process() is not None:
        return False
    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "0")
        if value.isdigit() and int(value) != 0:
            return False
    return True


class OncePerRun(logging.Filter):
    """Passes each :data:`NOISE` line once in the first process and never in the others."""

    def __init__(self, patterns: tuple[re.Pattern[str], ...]) -> None:
        super().__init__()
        self.patterns = patterns
        self.shown: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        for pattern in self.patterns:
            if pattern.search(message):
                if pattern.pattern in self.shown or not first_process():
                    return False
                self.shown.add(pattern.pattern)
        return True


_installed: list[tuple[logging.Logger, OncePerRun]] = []


def quiet_dependencies() -> None:
    """Attach :class:`OncePerRun` to the loggers of :data:`NOISE` (once per process)."""
    if _installed:
        return
    by_logger: dict[str, list[re.Pattern[str]]] = {}
    for name, pattern in NOISE:
        by_logger.setdefault(name, []).append(pattern)
    for name, patterns in by_logger.items():
        logger = logging.getLogger(name)
        once = OncePerRun(tuple(patterns))
        logger.addFilter(once)
        _installed.append((logger, once))


#: hints to trade fp32 matmul precision for speed; a run whose config sets the precision on
#: purpose (``precision.matmul_precision``) has answered them
PRECISION_HINTS = (
    # torch/_inductor/compile_fx.py, a Python warning
    r".*TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled.*",
    # Lightning's CUDA accelerator, an INFO line through its rank_zero logger
    r".*that has Tensor Cores\. To properly utilize them.*",
)


def quiet_precision_hints() -> None:
    """Drop :data:`PRECISION_HINTS` (for runs whose config sets the matmul precision)."""
    import warnings

    warnings.filterwarnings("ignore", message=PRECISION_HINTS[0])
    lightning_hint = re.compile(PRECISION_HINTS[1])

    class _Drop(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not lightning_hint.search(record.getMessage())

    # lightning_utilities' rank_zero_info logs through whichever of these imported last
    for name in (
        "pytorch_lightning.utilities.rank_zero",
        "lightning_fabric.utilities.rank_zero",
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.rank_zero",
    ):
        logging.getLogger(name).addFilter(_Drop())
