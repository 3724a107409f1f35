"""Moved to :mod:`rocmtrain.callbacks.throughput` (the training callbacks live in :mod:`rocmtrain.callbacks`).

``import rocmtrain.throughput`` keeps working for code written against the old layout, with a
DeprecationWarning; import from :mod:`rocmtrain.callbacks.throughput` instead.
"""

import warnings

warnings.warn(
    "rocmtrain.throughput moved to rocmtrain.callbacks.throughput; import from there",
    DeprecationWarning,
    stacklevel=2,
)

from rocmtrain.callbacks.throughput import *  # noqa: E402,F403
