"""Where rocmtrain's log records go when nobody configured logging, and how loud ranks > 0 are.

Python prints nothing below WARNING until an application configures logging, so in a user's own
script (``Trainer(strategy="torchrec")``) the strategy's INFO lines (the sharding plan, each env
var it changes, the watchdog's settings) would never appear. :func:`install_fallback` gives the
``rocmtrain`` logger a handler that prints them to stderr only while the root logger has no
handler of its own: once the application (or Hydra, in the CLI) configures logging, its handlers
take over and this one stays silent. As Lightning does for its own logger, the ``rocmtrain``
logger is set to INFO unless the application set a level.

Every rank runs the same code, so every INFO line would print once per rank: ranks other than 0
print WARNING and above to the console (their INFO still reaches any log file).
"""

from __future__ import annotations

import logging
import sys

from rocmtrain.ranks import global_rank as rank  # noqa: F401  (``log_setup.rank``: the old name)

_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


class _Fallback(logging.StreamHandler):
    """Prints rocmtrain's records while the application has configured no logging."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return  # the application's handlers print it
        super().emit(record)


def install_fallback() -> None:
    logger = logging.getLogger("rocmtrain")
    if any(isinstance(h, _Fallback) for h in logger.handlers):
        return
    if logger.level == logging.NOTSET:  # INFO from rank 0; the other ranks would repeat it
        logger.setLevel(logging.INFO if rank() == 0 else logging.WARNING)
    handler = _Fallback(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT))
    logger.addHandler(handler)


def quiet_other_ranks() -> None:
    """The CLI's way (Hydra gave each rank a console and a log file): every rank's records
    reach its log file, and on ranks > 0 the console prints WARNING and above only."""
    logging.getLogger("rocmtrain").setLevel(logging.INFO)
    if rank() == 0:
        return
    for handler in logging.getLogger().handlers:
        stream = getattr(handler, "stream", None)
        if isinstance(handler, logging.StreamHandler) and stream in (sys.stderr, sys.stdout):
            handler.setLevel(max(handler.level, logging.WARNING))
