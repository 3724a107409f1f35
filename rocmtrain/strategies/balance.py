"""Per-rank cost of a sharding plan, and a balanced plan when the planner's is lopsided.

TorchRec's planner balances its own performance estimate, which on one host is dominated by
memory and kernel terms; it happily puts the 100-ids-per-sample table and most of the big tables
on one rank. What a rank does every step is read (and in the backward write) the embedding rows
that its shards are asked for, so the cost model here is the lookup bytes per sample::

    cost = plan_cost(plan, table_specs(model), pooling_factors)
    cost.imbalance                  # max/mean of the per-rank lookup bytes, 1.0 = perfect
    for line in cost.lines(): print(line)
    plan = balanced_plan(model, plan, sharders=..., world_size=2, local_world_size=2,
                         compute_device="cuda", pooling_factors=...)

Per shard of a table with ``R`` rows, dim ``D``, ``p`` ids per sample (pooling factor) and ``e``
bytes per element, a shard of ``r x c`` costs ``p * (r / R) * c * e`` bytes per sample of the
global batch: a row-wise shard sees the ids in proportion to its rows (ids assumed uniform over
rows), a column-wise shard reads all ids but only its columns. A data-parallel table is looked
up by every rank for its own samples: ``p * D * e / world_size`` on each. Memory is the weights
of the shards a rank holds (optimizer state not counted).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn
from torchrec.distributed.types import ModuleSharder, ShardingPlan
from torchrec.modules.embedding_configs import data_type_to_dtype
from torchrec.modules.embedding_modules import EmbeddingBagCollection

#: the balanced plan must bring every rank's lookup cost within this share of the mean
TOLERANCE = 0.10


@dataclass(frozen=True)
class TableSpec:
    """Shape of one embedding table: rows, dim and bytes per element."""

    rows: int
    dim: int
    element_bytes: int = 4


@dataclass(frozen=True)
class RankCost:
    """One rank's load: lookup bytes per sample of the global batch, and table memory."""

    rank: int
    lookup_bytes: float
    memory_bytes: float


@dataclass(frozen=True)
class PlanCost:
    """Per-rank cost of a plan; ``imbalance`` = max / mean of the lookup bytes."""

    ranks: tuple[RankCost, ...]

    @staticmethod
    def _ratio(values: Sequence[float]) -> float:
        mean = sum(values) / len(values) if values else 0.0
        return max(values) / mean if mean > 0 else 1.0

    @property
    def imbalance(self) -> float:
        return self._ratio([r.lookup_bytes for r in self.ranks])

    @property
    def memory_imbalance(self) -> float:
        return self._ratio([r.memory_bytes for r in self.ranks])

    def within(self, tolerance: float = TOLERANCE) -> bool:
        """Whether every rank's lookup cost is within ``tolerance`` of the mean (both ways)."""
        return _within([r.lookup_bytes for r in self.ranks], tolerance)

    def lines(self) -> list[str]:
        """Readable rows: one per rank, then the imbalance."""
        out = [
            f"rank {r.rank}: lookup {r.lookup_bytes / 1024:10.2f} KiB/sample   "
            f"tables {r.memory_bytes / 2**30:8.3f} GiB"
            for r in self.ranks
        ]
        out.append(
            f"imbalance (max/mean): lookup {self.imbalance:.3f}, memory {self.memory_imbalance:.3f}"
        )
        return out


def table_specs(module: nn.Module) -> dict[str, TableSpec]:
    """Rows, dim and element bytes of every table of every EmbeddingBagCollection in ``module``."""
    out: dict[str, TableSpec] = {}
    for sub in module.modules():
        if isinstance(sub, EmbeddingBagCollection):
            for t in sub.embedding_bag_configs():
                size = data_type_to_dtype(t.data_type).itemsize
                out[t.name] = TableSpec(t.num_embeddings, t.embedding_dim, size)
    return out


def plan_cost(
    plan: ShardingPlan,
    tables: Mapping[str, TableSpec],
    pooling_factors: Mapping[str, float] | None,
    world_size: int,
) -> PlanCost:
    """Per-rank lookup bytes per sample and table memory of ``plan`` (see the module doc).

    ``pooling_factors`` missing a table count it as one id per sample (one-hot).
    """
    lookup = [0.0] * world_size
    memory = [0.0] * world_size
    pf = dict(pooling_factors or {})
    for module_plan in plan.plan.values():
        for name, ps in module_plan.items():  # type: ignore[union-attr]
            _add_table(lookup, memory, ps, tables[name], float(pf.get(name, 1.0)))
    return PlanCost(tuple(RankCost(r, lookup[r], memory[r]) for r in range(world_size)))


def _add_table(
    lookup: list[float], memory: list[float], ps: Any, spec: TableSpec, pooling: float
) -> None:
    """Add one table's per-rank lookup bytes and memory (``ps``: its ParameterSharding)."""
    world_size = len(lookup)
    if ps.sharding_spec is None:  # data parallel: every rank, its own samples
        for r in range(world_size):
            lookup[r] += pooling * spec.dim * spec.element_bytes / world_size
            memory[r] += spec.rows * spec.dim * spec.element_bytes
        return
    for shard in ps.sharding_spec.shards:
        rows, cols = shard.shard_sizes
        r = shard.placement.rank()
        lookup[r] += pooling * (rows / spec.rows) * cols * spec.element_bytes
        memory[r] += rows * cols * spec.element_bytes


@dataclass(frozen=True)
class BalanceReport:
    """The planner's plan cost, and the balanced plan's where ``balance=auto`` replaced it."""

    mode: str
    planner: PlanCost
    balanced: PlanCost | None = None
    note: str = ""

    def lines(self) -> list[str]:
        out = [f"planner's plan (strategy.balance={self.mode}):"]
        out += [f"  {line}" for line in self.planner.lines()]
        if self.balanced is not None:
            out.append("balanced plan (used):")
            out += [f"  {line}" for line in self.balanced.lines()]
        if self.note:
            out.append(self.note)
        return out


def is_balanced(cost: PlanCost, tolerance: float = TOLERANCE) -> bool:
    """Lookup bytes and table memory of every rank within ``tolerance`` of their means."""
    return _within([r.lookup_bytes for r in cost.ranks], tolerance) and _within(
        [r.memory_bytes for r in cost.ranks], tolerance
    )


#: sharding kinds whose placement balanced_plan chooses; tables pinned to others keep the planner's
_PLACED_HERE = ("table_wise", "row_wise", "column_wise")


def _split_kind(sharders: Sequence[ModuleSharder], compute_device: str) -> str:
    """How a heavy table is spread over all ranks: row-wise where the sharders offer it (it
    splits memory and ids alike), else column-wise (TorchRec's FBGEMM sharder on CPU)."""
    offered: set[str] = set()
    for sharder in sharders:
        offered |= set(sharder.sharding_types(compute_device))
    for kind in ("row_wise", "column_wise"):
        if kind in offered:
            return kind
    raise ValueError(
        f"the sharders offer neither row_wise nor column_wise on {compute_device} "
        f"({', '.join(sorted(offered))}): nothing to balance with"
    )


def _assign(
    whole: Sequence[str],
    split: set[str],
    fixed: tuple[list[float], list[float]],
    cost: Mapping[str, float],
    mem: Mapping[str, float],
) -> tuple[dict[str, int], list[float], list[float]]:
    """Greedy: ``fixed`` per-rank loads first (tables kept as they are), split tables add
    ``1/W`` of their cost to every rank; the ``whole`` ones, heaviest first, go to the rank
    where the larger of its normalised lookup and memory load stays lowest."""
    lookup, memory = list(fixed[0]), list(fixed[1])
    world_size = len(lookup)
    for n in split:
        for r in range(world_size):
            lookup[r] += cost[n] / world_size
            memory[r] += mem[n] / world_size
    names = [*whole, *split]
    mean_l = max((sum(cost[n] for n in names) + sum(fixed[0])) / world_size, 1e-12)
    mean_m = max((sum(mem[n] for n in names) + sum(fixed[1])) / world_size, 1e-12)
    ranks: dict[str, int] = {}
    for n in sorted(whole, key=lambda n: (-max(cost[n] / mean_l, mem[n] / mean_m), n)):
        best = min(
            range(world_size),
            key=lambda r: (
                max((lookup[r] + cost[n]) / mean_l, (memory[r] + mem[n]) / mean_m),
                lookup[r],
                r,
            ),
        )
        ranks[n] = best
        lookup[best] += cost[n]
        memory[best] += mem[n]
    return ranks, lookup, memory


def _within(values: Sequence[float], tolerance: float) -> bool:
    mean = sum(values) / len(values)
    return mean <= 0 or all(abs(v - mean) <= tolerance * mean for v in values)


def balanced_plan(
    module: nn.Module,
    plan: ShardingPlan,
    *,
    sharders: Sequence[ModuleSharder],
    world_size: int,
    local_world_size: int,
    compute_device: str,
    pooling_factors: Mapping[str, float] | None,
    pinned: Mapping[str, str] | None = None,
    tolerance: float = TOLERANCE,
) -> ShardingPlan:
    """A plan whose per-rank lookup cost (and table memory) is within ``tolerance`` of the mean.

    Starting from every table whole on one rank, the table with the largest share of the lookup
    cost or of the memory is spread over all ranks (row-wise, or column-wise where the sharders
    offer no row-wise), one at a time, until the greedy placement of the remaining whole tables
    is balanced; small tables stay table-wise. ``pinned`` = the user's ``{table: sharding_type}``:
    ``table_wise`` tables are never split (their rank is chosen here), ``row_wise`` and
    ``column_wise`` ones are split that way over all ranks, any other kind (``data_parallel``,
    ``table_row_wise``, ...) keeps the planner's placement. Compute kernels are the planner's.
    Deterministic, so every rank computes the same plan without a collective.
    """
    from torchrec.distributed import sharding_plan as sp

    pinned = dict(pinned or {})
    tables = table_specs(module)
    pf = dict(pooling_factors or {})
    planned = {
        name: ps
        for module_plan in plan.plan.values()
        for name, ps in module_plan.items()  # type: ignore[union-attr]
    }
    names = sorted(planned)
    cost = {n: pf.get(n, 1.0) * tables[n].dim * tables[n].element_bytes for n in names}
    mem = {n: float(tables[n].rows * tables[n].dim * tables[n].element_bytes) for n in names}
    split_kind = _split_kind(sharders, compute_device)
    kept = {n for n in names if pinned.get(n, "table_wise") not in _PLACED_HERE}
    fixed = ([0.0] * world_size, [0.0] * world_size)
    for n in kept:
        _add_table(*fixed, planned[n], tables[n], float(pf.get(n, 1.0)))
    split = {n for n in names if pinned.get(n) in ("row_wise", "column_wise")}
    candidates = sorted(
        (n for n in names if n not in pinned),
        key=lambda n: (-max(cost[n] / sum(cost.values()), mem[n] / sum(mem.values())), n),
    )
    while True:
        whole = [n for n in names if n not in split and n not in kept]
        ranks, lookup, memory = _assign(whole, split, fixed, cost, mem)
        if (_within(lookup, tolerance) and _within(memory, tolerance)) or not candidates:
            break
        split.add(candidates.pop(0))

    def generator(name: str):  # noqa: ANN202 - TorchRec's ParameterShardingGenerator
        ps, kernel = planned[name], planned[name].compute_kernel
        if name in kept:
            return lambda *_: ps
        if name in ranks:
            return sp.table_wise(rank=ranks[name], compute_kernel=kernel)
        if pinned.get(name, split_kind) == "row_wise":
            return sp.row_wise(compute_kernel=kernel)
        return sp.column_wise(ranks=list(range(world_size)), compute_kernel=kernel)

    out: dict = {}
    for path, module_plan in plan.plan.items():
        sub = module.get_submodule(path)
        sharder = next(s for s in sharders if isinstance(sub, s.module_type))
        out[path] = sp.construct_module_sharding_plan(
            sub,
            {name: generator(name) for name in module_plan},  # type: ignore[union-attr]
            sharder=sharder,
            local_size=local_world_size,
            world_size=world_size,
            device_type=compute_device,
        )
    return ShardingPlan(out)
