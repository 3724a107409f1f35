"""The TorchRec compute kernel that runs rocmtrain's ``TableBatchedEmbeddingBags`` for one shard group.

TorchRec groups the table shards a rank holds (same kernel, dtype, pooling, fused params) into a
``GroupedEmbeddingConfig`` and builds one compute kernel per group. For
``EmbeddingComputeKernel.CUSTOMIZED_KERNEL`` our lookup (:mod:`rocmtrain.embedding.sharder`)
builds :class:`RocmBatchedFusedEmbeddingBag`, modelled on TorchRec's own
``TritonBatchedFusedEmbeddingBag``:

- ``emb_module``: a :class:`rocmtrain.kernels.TableBatchedEmbeddingBags` over the LOCAL shard
  shapes (``local_rows`` x ``local_cols``), with the optimizer from ``fused_params``
  (:func:`rocmtrain.embedding.params.tbe_options`); ``backend`` ``"triton"`` or ``"torch"``.
- ``state_dict`` (inherited from ``BaseBatchedEmbeddingBag``): ``<table>.weight`` as
  ``ShardedTensor`` whose local shards are views into the flat weight buffer.
- ``fused_optimizer``: TorchRec's ``TritonEmbeddingFusedOptimizer`` over an adapter of our module
  (:class:`_EmbModuleView`): per-table ``ShardedTensor`` optimizer states (``momentum1`` for
  rowwise Adagrad, ``momentum1``/``exp_avg_sq`` for Adam) that are views of our fp32 state, and
  ``lr`` in the param group (a scheduler changing it reaches the kernel).

The backward of the lookup applies the optimizer in place (no ``.grad`` on the weights), exactly
like FBGEMM's fused TBE.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch
import torch.distributed as dist
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
from torch import nn
from torchrec.distributed.batched_embedding_kernel import (
    BaseBatchedEmbeddingBag,
    TritonEmbeddingFusedOptimizer,
)
from torchrec.distributed.composable.table_batched_embedding_slice import (
    TableBatchedEmbeddingSlice,
)
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig
from torchrec.distributed.types import ShardingEnv, ShardingType
from torchrec.modules.embedding_configs import data_type_to_dtype
from torchrec.optim.fused import EmptyFusedOptimizer, FusedOptimizer, FusedOptimizerModule
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rocmtrain.config.strategy import KERNELS
from rocmtrain.embedding.params import tbe_options
from rocmtrain.kernels import TableBatchedEmbeddingBags

#: backends of TableBatchedEmbeddingBags a sharded kernel may use: rocmtrain's own kernels
BACKENDS = tuple(k for k in KERNELS if k != "fbgemm")


class _EmbModuleView:
    """What ``TritonEmbeddingFusedOptimizer`` reads from an embedding module, over our TBE."""

    def __init__(self, tbe: TableBatchedEmbeddingBags) -> None:
        self.tbe = tbe

    @property
    def learning_rate(self) -> float:
        return self.tbe.optimizer.lr

    @learning_rate.setter
    def learning_rate(self, lr: float) -> None:
        if lr != self.tbe.optimizer.lr:
            self.tbe.optimizer = dataclasses.replace(self.tbe.optimizer, lr=float(lr))

    def split_embedding_weights(self) -> list[torch.Tensor]:
        return self.tbe.split_embedding_weights()

    def get_optimizer_state(self) -> list[dict[str, torch.Tensor]]:
        # TorchRec names state 0 "momentum1" (FBGEMM's name), later ones by our key.
        return self.tbe.split_optimizer_states()


class RocmEmbeddingFusedOptimizer(TritonEmbeddingFusedOptimizer):
    """TorchRec's fused optimizer for a Triton TBE, plus FBGEMM's ``set_optimizer_step`` (the
    step count drives Adam's bias correction and the stochastic-rounding stream; like FBGEMM it
    is not part of the state_dict, so call ``dmp.fused_optimizer.set_optimizer_step(n)`` after a
    resume)."""

    def set_optimizer_step(self, step: int) -> None:
        self._emb_module.tbe.step = int(step)


def _pooling(mode: PoolingMode) -> str:
    if mode == PoolingMode.SUM:
        return "sum"
    if mode == PoolingMode.MEAN:
        return "mean"
    raise ValueError(
        f"pooling {mode}: rocmtrain's kernels do pooled SUM and MEAN bags only; use "
        "PoolingType.SUM/MEAN or kernel=fbgemm"
    )


class RocmBatchedFusedEmbeddingBag(BaseBatchedEmbeddingBag[torch.Tensor], FusedOptimizerModule):
    """TorchRec embedding kernel over :class:`~rocmtrain.kernels.TableBatchedEmbeddingBags`."""

    def __init__(
        self,
        config: GroupedEmbeddingConfig,
        pg: dist.ProcessGroup | None = None,
        device: torch.device | None = None,
        sharding_type: ShardingType | None = None,
        env: ShardingEnv | None = None,
        *,
        backend: str = "triton",
    ) -> None:
        super().__init__(config, pg, device, sharding_type)
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}: use one of {BACKENDS}")
        spec, extra = tbe_options(config.fused_params)
        extra.setdefault("weights_dtype", data_type_to_dtype(config.data_type))
        self._emb_module = TableBatchedEmbeddingBags(
            list(zip(self._local_rows, self._local_cols, strict=True)),
            feature_table_map=self._feature_table_map,
            optimizer=spec,
            pooling=_pooling(self._pooling),
            backend=backend,
            device=device,
            **extra,
        )
        self._view = _EmbModuleView(self._emb_module)
        self._optim = RocmEmbeddingFusedOptimizer(config, self._view, pg)  # type: ignore[arg-type]
        self.init_parameters()

    @property
    def emb_module(self) -> TableBatchedEmbeddingBags:  # type: ignore[override]
        return self._emb_module

    @property
    def fused_optimizer(self) -> FusedOptimizer:
        return self._optim

    @property
    def _param_per_table(self) -> dict[str, TableBatchedEmbeddingSlice]:  # type: ignore[override]
        """Per-table weight slices (registered by the sharded EBC as ``embedding_bags.<t>.weight``)."""
        result: dict[str, TableBatchedEmbeddingSlice] = {}
        lay = self._emb_module.layout
        weights = self._view.split_embedding_weights()
        states = self._view.get_optimizer_state()
        for t, cfg in enumerate(self._config.embedding_tables):
            if cfg.name in result:
                raise ValueError(
                    f"table {cfg.name} has several shards in one group on this rank; rocmtrain's "
                    "kernel supports table_wise and row_wise (one shard per rank) only"
                )
            lo, hi = lay.weights_offsets[t], lay.weights_offsets[t + 1]
            weight = TableBatchedEmbeddingSlice(
                data=self._emb_module.weights,
                start_offset=lo,
                end_offset=hi,
                num_embeddings=-1,
                embedding_dim=cfg.local_cols,
            )
            weight._in_backward_optimizers = [  # type: ignore[attr-defined]
                RocmEmbeddingFusedOptimizer(
                    config=self._config,
                    emb_module=self._view,  # type: ignore[arg-type]
                    pg=self._pg,
                    create_for_table=cfg.name,
                    param_weight_for_table=weight,
                    embedding_weights_by_table=weights,
                    all_optimizer_states=states,
                )
            ]
            result[cfg.name] = weight
        return result

    @_param_per_table.setter
    def _param_per_table(self, v: dict[str, TableBatchedEmbeddingSlice]) -> None:
        self.__dict__["_param_per_table"] = v  # the base class assigns {} in __init__

    def forward(
        self,
        features: KeyedJaggedTensor,
        vbe_output: torch.Tensor | None = None,
        vbe_output_offsets: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if features.variable_stride_per_key():
            raise ValueError(
                "variable batch size per feature (VBE) is not supported by rocmtrain's kernels; "
                "use a fixed batch size per feature or kernel=fbgemm"
            )
        weights = features.weights_or_none()
        if weights is not None and not torch.is_floating_point(weights):
            weights = None
        return self._emb_module(features.values(), features.offsets(), weights)

    def split_embedding_weights(self) -> list[torch.Tensor]:
        return self._emb_module.split_embedding_weights()

    def named_buffers(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Fused parameters count as buffers and are not listed (TorchRec's convention)."""
        yield from ()

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        """``<table>.weight`` per table, marked as already optimized in backward (so dense
        optimizers built with ``in_backward_optimizer_filter`` skip them)."""
        for name, tensor in self.named_split_embedding_weights(prefix, recurse, remove_duplicate):
            param = nn.Parameter(tensor, requires_grad=False)
            param._in_backward_optimizers = [EmptyFusedOptimizer()]  # type: ignore[attr-defined]
            yield name, param

    def extra_repr(self) -> str:
        return f"backend={self._emb_module.backend_name}"
