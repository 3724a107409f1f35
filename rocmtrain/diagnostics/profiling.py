"""Moved to :mod:`rocmtrain.callbacks.profiling` (the training callbacks live in :mod:`rocmtrain.callbacks`).

``import rocmtrain.diagnostics.profiling`` keeps working for code written against the old layout, with a
DeprecationWarning; import from :mod:`rocmtrain.callbacks.profiling` instead.
"""

import warnings

warnings.warn(
    "rocmtrain.diagnostics.profiling moved to rocmtrain.callbacks.profiling; import from there",
    DeprecationWarning,
    stacklevel=2,
)

from rocmtrain.callbacks.profiling import *  # noqa: E402,F403
