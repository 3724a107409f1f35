"""Sharding-plan glue over TorchRec's planner: constraints, topology, plan, readable summary.

Used by :class:`rocmtrain.strategies.TorchRecStrategy` (collectively, inside a process group)
and by ``dry_run=true`` (no process group: a fake topology, e.g. 8 ``cuda`` devices on a CPU
machine)::

    sharders = build_sharders("fbgemm")
    plan = make_plan(model, sharders=sharders, world_size=8, local_world_size=8,
                     compute_device="cuda", constraints=sharding_constraints(model, "auto"),
                     batch_size=16384, hbm_cap_gb=180)
    for row in describe_plan(plan): print(row)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch.distributed as dist
from torch import nn
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import (
    KernelConfig,
    ParameterConstraints,
    PlannerError,
    TopologyFactory,
    TrainerConfig,
)
from torchrec.distributed.types import ModuleSharder, ShardingPlan
from torchrec.modules.embedding_modules import EmbeddingBagCollection

GIB = 1024**3

# TorchRec's planner prints a 300-column stats table at INFO; rocmtrain prints its own summary.
logging.getLogger("torchrec.distributed.planner.stats").setLevel(logging.WARNING)
log = logging.getLogger(__name__)


class PlanError(RuntimeError):
    """The planner found no plan (e.g. the world cannot hold the tables); says what to change."""


def build_sharders(kernel: str, *, fused_params: dict | None = None) -> list[ModuleSharder]:
    """Sharders for ``kernel``: ``fbgemm`` = TorchRec's defaults (FBGEMM TBE), ``triton`` /
    ``torch`` = rocmtrain's TBE through ``rocmtrain.embedding.get_sharders``."""
    if kernel == "fbgemm":
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

        return [EmbeddingBagCollectionSharder(fused_params=fused_params)]
    try:
        from rocmtrain.embedding import get_sharders
    except ImportError as exc:
        raise PlanError(
            f"kernel={kernel} needs rocmtrain.embedding.get_sharders, which is not available in "
            f"this build ({exc}); use kernel=fbgemm"
        ) from exc
    sharders = get_sharders(kernel, fused_params=fused_params)
    if sharders is None:
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

        return [EmbeddingBagCollectionSharder(fused_params=fused_params)]
    return list(sharders)


def check_sharding_supported(
    sharders: Sequence[ModuleSharder],
    sharding_type: str,
    *,
    per_table: Mapping[str, str] | None = None,
    compute_device: str,
    kernel: str,
) -> None:
    """Raise :class:`PlanError` when the sharders cannot shard tables as asked on this device
    (e.g. TorchRec's FBGEMM sharder offers no row-wise sharding on CPU)."""
    offered: set[str] = set()
    for sharder in sharders:
        offered |= set(sharder.sharding_types(compute_device))
    wanted = {("strategy.sharding_type", sharding_type)} if sharding_type != "auto" else set()
    wanted |= {(f"strategy.per_table_sharding.{t}", k) for t, k in (per_table or {}).items()}
    for field, kind in sorted(wanted):
        if kind not in offered:
            raise PlanError(
                f"{field}={kind} is not available with kernel={kernel} on {compute_device}: the "
                f"sharders offer {', '.join(sorted(offered))}. Choose one of those"
                + (
                    " (on CPU, row-wise shards work with kernel=torch)"
                    if "row" in kind and compute_device == "cpu" and kernel == "fbgemm"
                    else ""
                )
            )


def table_names(module: nn.Module) -> list[str]:
    """Names of every table of every EmbeddingBagCollection inside ``module``."""
    names: list[str] = []
    for sub in module.modules():
        if isinstance(sub, EmbeddingBagCollection):
            names += [t.name for t in sub.embedding_bag_configs()]
    return names


#: every sharding type but data_parallel (whose tables DDP trains with the dense optimizer)
SHARDED_TYPES = ("table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise")


def optimized_in_backward(module: nn.Module) -> set[str]:
    """Tables whose weight has an optimizer from ``apply_optimizer_in_backward``."""
    names: set[str] = set()
    for sub in module.modules():
        if isinstance(sub, EmbeddingBagCollection):
            for t in sub.embedding_bag_configs():
                weight = sub.embedding_bags[t.name].weight
                if getattr(weight, "_in_backward_optimizers", None):
                    names.add(t.name)
    return names


def sharding_constraints(
    module: nn.Module,
    sharding_type: str = "auto",
    *,
    per_table: Mapping[str, str] | None = None,
    pooling_factors: Mapping[str, float] | None = None,
) -> dict[str, ParameterConstraints]:
    """Planner constraints: one sharding type for all tables (``auto`` = planner's choice),
    ``per_table`` overrides, and expected ids per sample (multi-hot) for the cost model."""
    per_table = dict(per_table or {})
    unknown = sorted(set(per_table) - set(table_names(module)))
    if unknown:
        raise PlanError(f"per-table sharding names unknown tables {unknown}")
    out: dict[str, ParameterConstraints] = {}
    fused = optimized_in_backward(module)
    for name in table_names(module):
        kind = per_table.get(name, sharding_type)
        kwargs: dict = {}
        if kind != "auto":
            kwargs["sharding_types"] = [kind]
        elif name in fused:
            # a data-parallel table is trained by the dense optimizer (DDP), so the optimizer
            # given by apply_optimizer_in_backward would silently not apply: keep it sharded
            kwargs["sharding_types"] = list(SHARDED_TYPES)
        if kind == "data_parallel" and name in fused:
            log.warning(
                "table %s is data_parallel (as asked): TorchRec trains it with the dense "
                "optimizer, not the embedding optimizer given by apply_optimizer_in_backward; "
                "shard it (e.g. table_wise) to keep that optimizer",
                name,
            )
        if pooling_factors and name in pooling_factors:
            kwargs["pooling_factors"] = [float(pooling_factors[name])]
        if kwargs:
            out[name] = ParameterConstraints(**kwargs)
    return out


def make_plan(
    module: nn.Module,
    *,
    sharders: Sequence[ModuleSharder],
    world_size: int,
    local_world_size: int,
    compute_device: str,
    constraints: Mapping[str, ParameterConstraints],
    batch_size: int,
    hbm_cap_gb: float | None = None,
    ddr_cap_gb: float | None = None,
    pg: dist.ProcessGroup | None = None,
) -> ShardingPlan:
    """Run TorchRec's planner. With ``pg`` the plan is made on rank 0 and broadcast."""
    topology = TopologyFactory.create_topology(
        trainer_config=TrainerConfig(
            world_size=world_size,
            local_world_size=local_world_size,
            hbm_cap_bytes=int(hbm_cap_gb * GIB) if hbm_cap_gb else None,
            ddr_cap_bytes=int(ddr_cap_gb * GIB) if ddr_cap_gb else None,
        ),
        kernel_config=KernelConfig(compute_device=compute_device),
    )
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=batch_size,
        constraints=dict(constraints),
        # reserve 15% of each device for dense weights, activations and the KJT buffers
        storage_reservation=FixedPercentageStorageReservation(0.15),
    )
    try:
        if pg is not None:
            return planner.collective_plan(module, list(sharders), pg)
        return planner.plan(module, list(sharders))
    except PlannerError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        need = _table_bytes(module) / GIB
        cap = hbm_cap_gb if compute_device != "cpu" else ddr_cap_gb
        raise PlanError(
            f"world size {world_size} ({compute_device}) cannot hold the sharding plan: {first} "
            f"The tables need {need:.2f} GiB (fp32, before optimizer state); each rank may use "
            f"{f'{cap:g} GiB' if cap else 'the TorchRec default'} minus 15% reserve. Fix: more "
            "ranks (trainer.devices / trainer.num_nodes), fewer rows (model.max_rows_per_table), "
            "a larger strategy.hbm_cap_gb / strategy.ddr_cap_gb, or sharding_type=row_wise."
        ) from exc


def _table_bytes(module: nn.Module) -> int:
    total = 0
    for sub in module.modules():
        if isinstance(sub, EmbeddingBagCollection):
            total += sum(
                t.num_embeddings * t.embedding_dim * 4 for t in sub.embedding_bag_configs()
            )
    return total


@dataclass(frozen=True)
class TablePlacement:
    """Where one table lives: sharding type, compute kernel, ranks and shard sizes."""

    table: str
    sharding_type: str
    compute_kernel: str
    ranks: tuple[int, ...]
    shard_sizes: tuple[tuple[int, ...], ...]

    def __str__(self) -> str:
        sizes = ", ".join("x".join(map(str, s)) for s in self.shard_sizes)
        ranks = ",".join(map(str, self.ranks))
        return (
            f"{self.table:<10} {self.sharding_type:<16} {self.compute_kernel:<20} "
            f"ranks [{ranks}] shards [{sizes}]"
        )


def describe_plan(plan: ShardingPlan) -> list[TablePlacement]:
    """One :class:`TablePlacement` per table of every sharded module of ``plan``."""
    rows: list[TablePlacement] = []
    for module_plan in plan.plan.values():
        for table, ps in module_plan.items():  # type: ignore[union-attr]
            shards = ps.sharding_spec.shards if ps.sharding_spec is not None else []
            ranks = tuple(ps.ranks or [s.placement.rank() for s in shards])
            rows.append(
                TablePlacement(
                    table=table,
                    sharding_type=ps.sharding_type,
                    compute_kernel=ps.compute_kernel,
                    ranks=ranks,
                    shard_sizes=tuple(tuple(s.shard_sizes) for s in shards),
                )
            )
    return rows
