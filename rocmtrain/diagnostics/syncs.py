"""Moved to :mod:`rocmtrain.callbacks.syncs` (the training callbacks live in :mod:`rocmtrain.callbacks`).

``import rocmtrain.diagnostics.syncs`` keeps working for code written against the old layout, with a
DeprecationWarning; import from :mod:`rocmtrain.callbacks.syncs` instead.
"""

import warnings

warnings.warn(
    "rocmtrain.diagnostics.syncs moved to rocmtrain.callbacks.syncs; import from there",
    DeprecationWarning,
    stacklevel=2,
)

from rocmtrain.callbacks.syncs import *  # noqa: E402,F403
