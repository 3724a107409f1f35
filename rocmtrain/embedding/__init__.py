"""rocmtrain's embedding kernels inside TorchRec: a drop-in EmbeddingBagCollection and a DMP sharder.

Usage::

    # single device / data parallel: same configs and KJT in, KeyedTensor out as torchrec's EBC
    from rocmtrain.embedding import EmbeddingBagCollection
    ebc = EmbeddingBagCollection(tables=configs, optimizer=OptimizerSpec("rowwise_adagrad", lr=0.05))
    kt = ebc(kjt); loss(kt.values()).backward()   # rows updated in backward (fused optimizer)

    # DistributedModelParallel (table-wise / row-wise shards on our kernels)
    from rocmtrain.embedding import get_sharders
    sharders = get_sharders("triton")        # "torch" = reference backend, "fbgemm" -> None
    dmp = DistributedModelParallel(model, sharders=sharders, plan=plan, env=env, device=device)

See ``rocmtrain/embedding/EMBEDDING.md`` (how it plugs into TorchRec, checkpoints, limits).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rocmtrain.config.strategy import KERNELS

if TYPE_CHECKING:
    from torchrec.distributed.types import ModuleSharder


#: ``model.embedding_optimizer`` values our kernels implement (``adagrad`` = FBGEMM EXACT_ADAGRAD
#: is fbgemm-only); a config check can refuse other values early for kernel=triton|torch
SUPPORTED_EMBEDDING_OPTIMIZERS = ("sgd", "rowwise_adagrad", "adam")

__all__ = ["KERNELS", "SUPPORTED_EMBEDDING_OPTIMIZERS", "EmbeddingBagCollection", "get_sharders"]


def get_sharders(
    kernel: str, *, fused_params: dict[str, Any] | None = None
) -> list[ModuleSharder] | None:
    """Sharders for ``DistributedModelParallel`` running ``kernel``.

    ``"fbgemm"`` -> ``None`` (use TorchRec's default sharders, FBGEMM TBE).
    ``"triton"`` / ``"torch"`` -> ``[RocmEmbeddingBagCollectionSharder(backend=kernel)]``: every
    ``EmbeddingBagCollection`` table is sharded table-wise or row-wise onto
    ``rocmtrain.kernels.TableBatchedEmbeddingBags`` with ``backend=kernel`` via TorchRec's
    ``CUSTOMIZED_KERNEL``. ``fused_params`` as TorchRec's (``{"optimizer":
    EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05, "eps": 1e-8}``); an optimizer
    attached with ``apply_optimizer_in_backward`` overrides it per table. Create the sharders
    before the planner (they register the planner's cost entry for our kernel).
    """
    if kernel not in KERNELS:
        raise ValueError(
            f"kernel={kernel!r} is not one of {KERNELS}: use fbgemm (TorchRec/FBGEMM TBE), "
            "triton (rocmtrain's Triton kernels, GPU) or torch (rocmtrain's reference kernel)"
        )
    if kernel == "fbgemm":
        return None
    from rocmtrain.embedding.sharder import RocmEmbeddingBagCollectionSharder

    return [RocmEmbeddingBagCollectionSharder(kernel, fused_params=fused_params)]


def __getattr__(name: str) -> Any:  # lazy: importing this package does not import torchrec
    if name == "EmbeddingBagCollection":
        from rocmtrain.embedding.ebc import EmbeddingBagCollection

        return EmbeddingBagCollection
    raise AttributeError(f"module 'rocmtrain.embedding' has no attribute {name!r}")
