"""Moved to :mod:`rocmtrain.callbacks.monitor` (the training callbacks live in :mod:`rocmtrain.callbacks`).

``import rocmtrain.diagnostics.monitor`` keeps working for code written against the old layout, with a
DeprecationWarning; import from :mod:`rocmtrain.callbacks.monitor` instead.
"""

import warnings

warnings.warn(
    "rocmtrain.diagnostics.monitor moved to rocmtrain.callbacks.monitor; import from there",
    DeprecationWarning,
    stacklevel=2,
)

from rocmtrain.callbacks import monitor_callbacks as build_callbacks  # noqa: E402,F401
from rocmtrain.callbacks.monitor import *  # noqa: E402,F403
