"""Moved to :mod:`rocmtrain.callbacks.grad_health` (the training callbacks live in :mod:`rocmtrain.callbacks`).

``import rocmtrain.precision.grad_health`` keeps working for code written against the old layout, with a
DeprecationWarning; import from :mod:`rocmtrain.callbacks.grad_health` instead.
"""

import warnings

warnings.warn(
    "rocmtrain.precision.grad_health moved to rocmtrain.callbacks.grad_health; import from there",
    DeprecationWarning,
    stacklevel=2,
)

from rocmtrain.callbacks.grad_health import *  # noqa: E402,F403
