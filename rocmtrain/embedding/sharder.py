"""TorchRec sharder that runs rocmtrain's kernels through ``EmbeddingComputeKernel.CUSTOMIZED_KERNEL``.

Usage (what ``TorchRecStrategy`` does for ``kernel=triton`` / ``kernel=torch``)::

    from rocmtrain.embedding import get_sharders
    sharders = get_sharders("triton")            # None for "fbgemm" (TorchRec's defaults)
    plan = planner.collective_plan(model, sharders, pg)      # tables get "customized_kernel"
    dmp = DistributedModelParallel(model, plan=plan, sharders=sharders, env=..., device=...)

How it plugs in (no monkeypatching of TorchRec):

1. :class:`RocmEmbeddingBagCollectionSharder` (an ``EmbeddingBagCollectionSharder``) offers only
   ``customized_kernel`` for ``table_wise`` / ``row_wise`` (the planner can pick nothing else) and
   ``shard()`` returns :class:`RocmShardedEmbeddingBagCollection`.
2. :class:`RocmShardedEmbeddingBagCollection` overrides ``_create_lookups``: for TW / RW shardings
   it builds :class:`RocmPooledEmbeddingsLookup` (TorchRec's ``GroupedPooledEmbeddingsLookup``
   whose ``_create_embedding_kernel`` returns our
   :class:`~rocmtrain.embedding.kernel.RocmBatchedFusedEmbeddingBag` for ``customized_kernel``).
3. TorchRec skips its state_dict / ShardedTensor bookkeeping for ``customized_kernel`` tables
   ("implemented in child class"). Our kernel's state_dict and per-table slices have exactly the
   layout of the FUSED kernel's, so ``_initialize_torch_state`` runs TorchRec's FUSED path for
   them: ``embedding_bags.<table>.weight`` is a ``ShardedTensor`` over views of our weights, and
   ``torch.distributed.checkpoint`` saves / loads it like any FBGEMM table.
4. The planner's cost model has no bandwidth entry for ``customized_kernel``;
   :func:`register_planner_bandwidth` registers TorchRec's default estimator config extended
   with one (that of ``fused``: both stream each row once), via the estimator factory's
   ``register`` API.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torchrec.distributed.embedding_kernel import BaseEmbedding
from torchrec.distributed.embedding_lookup import GroupedPooledEmbeddingsLookup
from torchrec.distributed.embedding_types import EmbeddingComputeKernel, GroupedEmbeddingConfig
from torchrec.distributed.embeddingbag import (
    EmbeddingBagCollectionSharder,
    ShardedEmbeddingBagCollection,
)
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingSharding
from torchrec.distributed.sharding.tw_sharding import TwPooledEmbeddingSharding
from torchrec.distributed.types import ParameterSharding, ShardingEnv, ShardingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from rocmtrain.embedding.kernel import BACKENDS, RocmBatchedFusedEmbeddingBag
from rocmtrain.embedding.params import tbe_options

CUSTOMIZED = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
#: sharding types our kernel serves
SHARDING_TYPES = (ShardingType.TABLE_WISE.value, ShardingType.ROW_WISE.value)


class RocmPooledEmbeddingsLookup(GroupedPooledEmbeddingsLookup):
    """``GroupedPooledEmbeddingsLookup`` that builds our kernel for ``customized_kernel`` groups."""

    def __init__(self, *args: Any, backend: str, **kwargs: Any) -> None:
        # _create_embedding_kernel runs inside super().__init__: set the backend first.
        object.__setattr__(self, "_rocm_backend", backend)
        super().__init__(*args, **kwargs)

    def _create_embedding_kernel(
        self,
        config: GroupedEmbeddingConfig,
        device: torch.device | None,
        pg: dist.ProcessGroup | None,
        sharding_type: ShardingType | None,
        env: ShardingEnv | None,
    ) -> BaseEmbedding:
        if config.compute_kernel == EmbeddingComputeKernel.CUSTOMIZED_KERNEL:
            return RocmBatchedFusedEmbeddingBag(
                config=config,
                pg=pg,
                device=device,
                sharding_type=sharding_type,
                env=env,
                backend=self._rocm_backend,
            )
        return super()._create_embedding_kernel(config, device, pg, sharding_type, env)


class RocmShardedEmbeddingBagCollection(ShardedEmbeddingBagCollection):
    """``ShardedEmbeddingBagCollection`` whose TW/RW lookups run rocmtrain's kernels."""

    def __init__(self, *args: Any, backend: str, **kwargs: Any) -> None:
        object.__setattr__(self, "_rocm_backend", backend)
        super().__init__(*args, **kwargs)

    def _create_lookups(self) -> None:
        for sharding in self._embedding_shardings:
            uses_ours = any(
                c.compute_kernel == EmbeddingComputeKernel.CUSTOMIZED_KERNEL
                for c in getattr(sharding, "_grouped_embedding_configs", [])
            )
            if not uses_ours:
                self._lookups.append(sharding.create_lookup())
                continue
            if isinstance(sharding, RwPooledEmbeddingSharding):
                sharding_type: ShardingType | None = ShardingType.ROW_WISE
            elif isinstance(sharding, TwPooledEmbeddingSharding):
                sharding_type = None  # what TorchRec's TW lookup passes
            else:
                raise ValueError(
                    f"{type(sharding).__name__} with compute kernel {CUSTOMIZED}: rocmtrain's "
                    f"kernels serve sharding types {SHARDING_TYPES}; constrain the plan to those "
                    "(strategy.sharding_type) or use kernel=fbgemm"
                )
            self._lookups.append(
                RocmPooledEmbeddingsLookup(
                    grouped_configs=sharding._grouped_embedding_configs,
                    pg=sharding._pg,
                    device=sharding._device,
                    sharding_type=sharding_type,
                    env=sharding._env,
                    backend=self._rocm_backend,
                )
            )

    def _initialize_torch_state(self, skip_registering: bool = False) -> None:
        # TorchRec leaves customized_kernel tables out of its state_dict bookkeeping. Our kernel
        # exposes the FUSED kernel's layout (ShardedTensor state_dict, per-table slices), so run
        # TorchRec's FUSED path for our tables.
        original = self.module_sharding_plan
        as_fused = {
            name: _with_kernel(ps, EmbeddingComputeKernel.FUSED.value)
            if ps.compute_kernel == CUSTOMIZED
            else ps
            for name, ps in original.items()
        }
        self.module_sharding_plan = as_fused  # type: ignore[assignment]
        try:
            super()._initialize_torch_state(skip_registering=skip_registering)
        finally:
            self.module_sharding_plan = original

    def extra_repr(self) -> str:
        return f"rocmtrain backend={self._rocm_backend}"


def _with_kernel(ps: ParameterSharding, kernel: str) -> ParameterSharding:
    clone = ParameterSharding.__new__(ParameterSharding)
    clone.__dict__.update(ps.__dict__)
    clone.compute_kernel = kernel
    return clone


class RocmEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """Shards ``torchrec.EmbeddingBagCollection`` table-wise / row-wise onto rocmtrain's kernels.

    ``backend``: ``"triton"`` (GPU; CPU only under ``TRITON_INTERPRET=1``) or ``"torch"`` (the
    pure-torch reference backend). ``fused_params`` as TorchRec's (see
    :func:`rocmtrain.embedding.params.tbe_options`); the optimizer attached with
    ``apply_optimizer_in_backward`` overrides the one given here, table by table.
    """

    def __init__(
        self,
        backend: str = "triton",
        *,
        fused_params: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}: use one of {BACKENDS}")
        tbe_options(fused_params)  # fail now, not at sharding time, on keys we cannot honour
        super().__init__(fused_params=fused_params, **kwargs)
        self.backend = backend
        register_planner_bandwidth()

    def shard(
        self,
        module: EmbeddingBagCollection,
        params: dict[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device | None = None,
        module_fqn: str | None = None,
    ) -> ShardedEmbeddingBagCollection:
        for table, ps in params.items():
            if ps.compute_kernel == CUSTOMIZED and ps.sharding_type not in SHARDING_TYPES:
                raise ValueError(
                    f"table {table}: sharding_type={ps.sharding_type} with {CUSTOMIZED}; "
                    f"rocmtrain's kernels serve {SHARDING_TYPES}"
                )
        return RocmShardedEmbeddingBagCollection(
            module=module,
            table_name_to_parameter_sharding=params,
            env=env,
            fused_params=self.fused_params,
            device=device,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
            module_fqn=module_fqn,
            sharded_module_order_overwrite=self._sharded_module_order_overwrite,
            backend=self.backend,
        )

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return list(SHARDING_TYPES)

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        return [CUSTOMIZED] if sharding_type in SHARDING_TYPES else []

    @property
    def sharded_module_type(self) -> type[ShardedEmbeddingBagCollection]:
        return RocmShardedEmbeddingBagCollection


def register_planner_bandwidth() -> None:
    """Give TorchRec's cost model a bandwidth for ``customized_kernel``: that of ``fused``.

    TorchRec's default estimator config (``EmbeddingPerfEstimatorFactory``, name
    ``DEFAULT_PERF_ESTIMATOR``) has no entry for ``customized_kernel`` and raises "Unrecognized or
    unsupported compute kernel". We register, through the factory's public ``register`` API, a
    subclass of TorchRec's default config that estimates ``customized_kernel`` like ``fused``
    (both stream each looked-up row once, with the optimizer fused into backward) and defers to
    TorchRec for everything else. Idempotent; called by the sharder's constructor.
    """
    from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR
    from torchrec.distributed.planner.estimator.config import EmbeddingPerfEstimatorConfig
    from torchrec.distributed.planner.estimator.estimator import EmbeddingPerfEstimatorFactory

    registry = EmbeddingPerfEstimatorFactory._registry
    current = registry.get(DEFAULT_PERF_ESTIMATOR.lower(), EmbeddingPerfEstimatorConfig)
    if getattr(current, "_rocmtrain_customized", False):
        return

    class RocmPerfEstimatorConfig(current):  # type: ignore[valid-type, misc]
        """TorchRec's default estimator config + a ``customized_kernel`` bandwidth."""

        _rocmtrain_customized = True

        def get_device_bw(self, compute_device: str, compute_kernel: str, *args, **kwargs):  # type: ignore[no-untyped-def]
            if compute_kernel == CUSTOMIZED:
                compute_kernel = EmbeddingComputeKernel.FUSED.value
            return super().get_device_bw(compute_device, compute_kernel, *args, **kwargs)

    EmbeddingPerfEstimatorFactory.register(DEFAULT_PERF_ESTIMATOR)(RocmPerfEstimatorConfig)
