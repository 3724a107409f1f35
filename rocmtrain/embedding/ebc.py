"""Drop-in ``torchrec.EmbeddingBagCollection`` on rocmtrain's kernels, with the optimizer fused in.

Usage::

    from rocmtrain.embedding import EmbeddingBagCollection
    from rocmtrain.kernels import OptimizerSpec
    ebc = EmbeddingBagCollection(tables=configs,              # torchrec EmbeddingBagConfig list
                                 optimizer=OptimizerSpec("rowwise_adagrad", lr=0.05))
    kt = ebc(kjt)                       # KeyedTensor, keys/column order as torchrec's EBC
    loss_fn(kt.values()).backward()     # touched rows updated in backward; no .grad, no step()
    ebc.load_state_dict(torchrec_ebc.state_dict())    # keys embedding_bags.<table>.weight
    ebc.fused_optimizer.state_dict()    # per-table optimizer state (KeyedOptimizer)

Tables are grouped by (pooling, dtype) into one :class:`~rocmtrain.kernels.TableBatchedEmbeddingBags`
per group; ``embedding_bags.<table>.weight`` are views into the groups' flat buffers, so
``state_dict`` / ``load_state_dict`` read and write the kernel's weights directly.

Data parallel (``process_group=...``): every rank holds all tables (replicated, same init via
the same ``seed``). In backward each rank all-gathers the (grad_output, ids, offsets,
per-sample weights) of every rank, concatenates them into one global batch and applies ONE
fused update with the gradient divided by the world size, i.e. DDP's averaged gradient, applied
the same way on every rank, so the replicas stay identical (use ``deterministic=True`` with the
Triton backend so float atomics cannot make replicas drift). The gradient exchanged is sparse:
O(global ids + B x sum D), never a dense ``[rows, D]`` tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchrec.modules.embedding_configs import (
    EmbeddingBagConfig,
    PoolingType,
    data_type_to_dtype,
)
from torchrec.modules.embedding_modules import EmbeddingBagCollectionInterface
from torchrec.optim.fused import FusedOptimizer
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from rocmtrain.embedding.dp import gathered_update
from rocmtrain.kernels import OptimizerSpec, TableBatchedEmbeddingBags

_POOLING = {PoolingType.SUM: "sum", PoolingType.MEAN: "mean"}


class _Group:
    """Tables sharing (pooling, dtype): one TBE, its features in torchrec order."""

    def __init__(self, tables: list[EmbeddingBagConfig], tbe: TableBatchedEmbeddingBags) -> None:
        self.tables = tables
        self.features = [f for t in tables for f in t.feature_names]
        self.tbe = tbe


class EmbeddingBagCollection(EmbeddingBagCollectionInterface):
    """``torchrec.EmbeddingBagCollection`` on :class:`~rocmtrain.kernels.TableBatchedEmbeddingBags`.

    ``tables``/``is_weighted``/``device`` as torchrec's. Keyword-only: ``optimizer`` (the fused
    optimizer, an :class:`~rocmtrain.kernels.OptimizerSpec`), ``backend`` (``"auto"``: Triton on
    GPU, torch reference on CPU), ``process_group`` (``None``: single device; a process group:
    data parallel, see the module docstring), ``deterministic``, ``seed`` (weight init and
    stochastic rounding), ``output_dtype``.
    """

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        is_weighted: bool = False,
        device: torch.device | str | None = None,
        *,
        optimizer: OptimizerSpec = OptimizerSpec(),  # noqa: B008 (frozen dataclass)
        backend: str = "auto",
        process_group: dist.ProcessGroup | None = None,
        deterministic: bool = False,
        seed: int = 0,
        output_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        _check_tables(tables)
        self._configs = list(tables)
        self._is_weighted = is_weighted
        self._pg = process_group
        device = torch.device(device) if device is not None else torch.device("cpu")
        if device.type == "meta":
            raise ValueError(
                "device=meta: rocmtrain's EmbeddingBagCollection allocates its weights at once; "
                "for DistributedModelParallel keep torchrec's EBC on meta and pass "
                "rocmtrain.embedding.get_sharders(...) instead"
            )
        keys: dict[tuple[str, torch.dtype], list[EmbeddingBagConfig]] = {}
        for t in tables:
            keys.setdefault((_POOLING[t.pooling], data_type_to_dtype(t.data_type)), []).append(t)
        # The TBEs are not submodules: state_dict holds only torchrec's keys (the weight views
        # below); _apply moves them and re-binds the views.
        self._groups: list[_Group] = []
        for g, ((pooling, dtype), group) in enumerate(keys.items()):
            fmap = [i for i, t in enumerate(group) for _ in t.feature_names]
            tbe = TableBatchedEmbeddingBags(
                [(t.num_embeddings, t.embedding_dim) for t in group],
                feature_table_map=fmap,
                optimizer=optimizer,
                weights_dtype=dtype,
                output_dtype=output_dtype,
                pooling=pooling,  # type: ignore[arg-type]
                backend=backend,  # type: ignore[arg-type]
                deterministic=deterministic,
                seed=seed + g,
                device=device,
            )
            self._groups.append(_Group(group, tbe))
        self._embedding_names = [f for t in tables for f in t.feature_names]
        self._lengths_per_key = [t.embedding_dim for t in tables for _ in t.feature_names]
        self.embedding_bags = nn.ModuleDict({t.name: nn.Module() for t in tables})
        self._bind_views()
        self._optim = _EBCFusedOptimizer(self)

    # -- torchrec interface ----------------------------------------------------------------------
    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    @property
    def fused_optimizer(self) -> FusedOptimizer:
        """Per-table optimizer state as a torchrec ``KeyedOptimizer`` (``state_dict`` etc.)."""
        return self._optim

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        missing = [f for f in self._embedding_names if f not in features.keys()]
        if missing:
            raise ValueError(
                f"KeyedJaggedTensor lacks features {missing} of this EmbeddingBagCollection "
                f"(it has {features.keys()}); pass a KJT with keys {self._embedding_names}"
            )
        outs: list[torch.Tensor] = []
        for group in self._groups:
            kjt = features
            if features.keys() != group.features:
                kjt = features.permute([features.keys().index(f) for f in group.features])
            psw = kjt.weights() if self._is_weighted else None
            if self._pg is None:
                outs.append(group.tbe(kjt.values(), kjt.offsets(), psw))
            else:
                outs.append(gathered_update(group.tbe, kjt.values(), kjt.offsets(), psw, self._pg))
        values = outs[0] if len(outs) == 1 else self._in_config_order(outs)
        return KeyedTensor(
            keys=self._embedding_names, length_per_key=self._lengths_per_key, values=values
        )

    # -- internals -------------------------------------------------------------------------------
    def _in_config_order(self, outs: list[torch.Tensor]) -> torch.Tensor:
        cols: dict[str, list[torch.Tensor]] = {}
        for group, out in zip(self._groups, outs, strict=True):
            splits = out.split(group.tbe.layout.feature_dims(), dim=1)
            tables = [t.name for t in group.tables for _ in t.feature_names]
            for name, col in zip(tables, splits, strict=True):
                cols.setdefault(name, []).append(col)
        return torch.cat([c for t in self._configs for c in cols[t.name]], dim=1)

    def _bind_views(self) -> None:
        """(Re)register ``embedding_bags.<t>.weight`` as views of the TBE buffers."""
        for group in self._groups:
            for cfg, w in zip(group.tables, group.tbe.split_embedding_weights(), strict=True):
                # requires_grad=False: updated in backward, never gets a .grad, so dense
                # optimizers and DDP skip it. (No ``_in_backward_optimizers`` marker: DDP would
                # install its optimizer-overlap hooks for it.)
                param = nn.Parameter(w, requires_grad=False)
                self.embedding_bags[cfg.name]._parameters["weight"] = param

    def _apply(self, fn: Any, recurse: bool = True) -> EmbeddingBagCollection:
        for bag in self.embedding_bags.values():  # views: re-made from the moved TBEs
            bag._parameters.pop("weight", None)
        for group in self._groups:
            group.tbe._apply(fn, recurse)
        super()._apply(fn, recurse)
        self._bind_views()
        self._optim = _EBCFusedOptimizer(self)
        return self

    @property
    def tbes(self) -> list[TableBatchedEmbeddingBags]:
        """The kernels, one per (pooling, dtype) group of tables."""
        return [g.tbe for g in self._groups]

    def table_states(self) -> dict[str, dict[str, torch.Tensor]]:
        """``{table: {state name: fp32 view}}`` of the fused optimizer."""
        out: dict[str, dict[str, torch.Tensor]] = {}
        for group in self._groups:
            for cfg, st in zip(group.tables, group.tbe.split_optimizer_states(), strict=True):
                out[cfg.name] = st
        return out


class _EBCFusedOptimizer(FusedOptimizer):
    """KeyedOptimizer view of the fused state: params ``embedding_bags.<t>.weight``, state
    ``{<t>.<state name>: tensor}``, one param group whose ``lr`` reaches the kernels."""

    def __init__(self, ebc: EmbeddingBagCollection) -> None:
        self._ebc = ebc
        states = ebc.table_states()
        params: dict[str, torch.Tensor] = {}
        state: dict[Any, Any] = {}
        for name, bag in ebc.embedding_bags.items():
            w = bag.weight
            params[f"embedding_bags.{name}.weight"] = w
            state[w] = {f"{name}.{k}": v for k, v in states[name].items()}
        lr = ebc._groups[0].tbe.optimizer.lr
        super().__init__(params, state, [{"params": list(params.values()), "lr": lr}])

    def _sync_lr(self) -> None:
        import dataclasses

        lr = float(self.param_groups[0]["lr"])
        for group in self._ebc._groups:
            if group.tbe.optimizer.lr != lr:
                group.tbe.optimizer = dataclasses.replace(group.tbe.optimizer, lr=lr)

    def set_optimizer_step(self, step: int) -> None:
        """Set the kernels' step count (Adam bias correction; not in the state_dict, as in
        FBGEMM): call it after loading a checkpoint of an Adam-trained model."""
        for group in self._ebc._groups:
            group.tbe.step = int(step)

    def step(self, closure: Any = None) -> None:
        self._sync_lr()  # the update itself ran in backward

    def zero_grad(self, set_to_none: bool = False) -> None:
        self._sync_lr()


def _check_tables(tables: Sequence[EmbeddingBagConfig]) -> None:
    if not tables:
        raise ValueError("tables is empty: pass at least one EmbeddingBagConfig")
    seen: set[str] = set()
    features: set[str] = set()
    for t in tables:
        if t.name in seen:
            raise ValueError(f"table name {t.name!r} appears twice; table names must be unique")
        seen.add(t.name)
        if t.pooling not in _POOLING:
            raise ValueError(
                f"table {t.name}: pooling={t.pooling}; rocmtrain's kernels do SUM and MEAN"
            )
        if not t.feature_names:
            raise ValueError(f"table {t.name}: feature_names is empty; name its input features")
        dup = features.intersection(t.feature_names)
        if dup:
            raise ValueError(
                f"table {t.name}: features {sorted(dup)} are already read by another table; "
                "torchrec's shared-feature naming (feature@table) is not supported here"
            )
        features.update(t.feature_names)
