"""Table-batched embedding-bag kernels (Triton, with a pure-torch reference) and their layout.

Usage::

    from rocmtrain.kernels import OptimizerSpec, TableBatchedEmbeddingBags
    tbe = TableBatchedEmbeddingBags([(1000, 64)], optimizer=OptimizerSpec("sgd", lr=0.1))
    out = tbe(indices, offsets)

See ``rocmtrain/kernels/KERNELS.md`` for the layout, semantics and the per-arch launch table.
"""

from .layout import TBELayout
from .optim import OPTIMIZER_KINDS, OptimizerSpec
from .tbe import TableBatchedEmbeddingBags

__all__ = ["OPTIMIZER_KINDS", "OptimizerSpec", "TBELayout", "TableBatchedEmbeddingBags"]
