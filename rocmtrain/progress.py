"""Moved to :mod:`rocmtrain.callbacks.progress` (the training callbacks live in :mod:`rocmtrain.callbacks`).

``import rocmtrain.progress`` keeps working for code written against the old layout, with a
DeprecationWarning; import from :mod:`rocmtrain.callbacks.progress` instead.
"""

import warnings

warnings.warn(
    "rocmtrain.progress moved to rocmtrain.callbacks.progress; import from there",
    DeprecationWarning,
    stacklevel=2,
)

from rocmtrain.callbacks.progress import *  # noqa: E402,F403
