"""The strategy's sharding plan: which plan ``TorchRecStrategy`` shards with, and what it costs.

:mod:`rocmtrain.strategies.planning` runs TorchRec's planner and :mod:`rocmtrain.strategies.balance`
costs and balances a plan. This module holds the strategy's planning arguments
(:class:`PlanSettings`: ``sharding_type``, ``per_table_sharding``, ``kernel``, ``balance``,
``plan`` ...) and the functions that feed them to the planner, so that setup, the dry run
(``python -m rocmtrain dry_run=true``) and the pre-launch check of ``rocmtrain.train`` all go
through the same :func:`plan_for`; and :func:`shard_model`, which wraps the model in
``DistributedModelParallel`` with the plan.

TorchRec is imported inside the methods, not here: ``import rocmtrain`` must not import it.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rocmtrain.strategies.deprecated import mixin_getattr

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pytorch_lightning as pl
    import torch
    import torch.distributed as dist
    from torch import nn
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingPlan

    from rocmtrain.config.strategy import StrategyArguments
    from rocmtrain.strategies.balance import BalanceReport

log = logging.getLogger(__name__)

#: the per-rank batch the planner costs when neither the strategy nor the datamodule names one
DEFAULT_PLANNER_BATCH = 512

#: keyword arguments of torchrec's DefaultDataParallelWrapper that ``ddp_kwargs`` may set directly;
#: any other key goes to ``torch.nn.parallel.DistributedDataParallel`` itself
DDP_WRAPPER_KEYS = ("bucket_cap_mb", "static_graph", "find_unused_parameters")


@dataclass
class PlanSettings:
    """What the strategy was asked to shard with (validated by the strategy's constructor)."""

    sharding_type: str = "auto"
    """Every table's sharding unless ``per_table`` names one (``auto``: the planner's choice)."""
    per_table: dict[str, str] = field(default_factory=dict)
    """``{table: sharding_type}`` overrides."""
    kernel: str = "fbgemm"
    """Embedding kernel of the sharders."""
    balance: str = "report"
    """``off`` | ``report`` | ``auto`` (see :func:`plan_for`)."""
    fused_params: dict[str, Any] | None = None
    """FBGEMM fused-optimizer parameters for the sharders."""
    pooling_factors: dict[str, float] | None = None
    """Expected ids per sample per table (multi-hot) for the cost model."""
    batch_size: int | None = None
    """Per-rank batch the planner costs; None: the datamodule's (:func:`planner_batch`)."""
    hbm_cap_gb: float | None = None
    """Per-device memory the planner may use (GiB)."""
    ddr_cap_gb: float | None = None
    """Per-rank host memory the planner may use (GiB)."""


def plan_settings(args: StrategyArguments) -> PlanSettings:
    """The planning part of the strategy's (checked) arguments."""
    return PlanSettings(
        sharding_type=args.sharding_type,
        per_table=args.per_table_sharding,
        kernel=args.kernel,
        balance=args.balance,
        fused_params=args.fused_params,
        pooling_factors=args.pooling_factors,
        batch_size=args.planner_batch_size,
        hbm_cap_gb=args.hbm_cap_gb,
        ddr_cap_gb=args.ddr_cap_gb,
    )


def build_sharders(settings: PlanSettings) -> list[Any]:
    """The sharders of ``kernel`` and ``fused_params`` (build once: the support check, the
    planner, the balancer and ``DistributedModelParallel`` must share them)."""
    from rocmtrain.strategies.planning import build_sharders as build

    return build(settings.kernel, fused_params=settings.fused_params)


def check_supported(settings: PlanSettings, sharders: list[Any], compute_device: str) -> None:
    """Raise :class:`~rocmtrain.strategies.planning.PlanError` before anything starts when the
    sharders cannot shard the tables as configured on ``compute_device``."""
    from rocmtrain.strategies.planning import check_sharding_supported

    check_sharding_supported(
        sharders,
        settings.sharding_type,
        per_table=settings.per_table,
        compute_device=compute_device,
        kernel=settings.kernel,
    )


def plan_for(
    settings: PlanSettings,
    model: nn.Module,
    sharders: list[Any],
    *,
    world_size: int,
    local_world_size: int,
    compute_device: str,
    batch_size: int | None = None,
    pg: dist.ProcessGroup | None = None,
    plan: ShardingPlan | None = None,
) -> tuple[ShardingPlan, BalanceReport | None]:
    """The sharding plan of ``model`` and its per-rank cost (``None`` with ``balance="off"``).

    ``plan`` (the caller's) is reported, never replaced. Without ``pg`` the planner runs on a
    fake topology of ``world_size`` ``compute_device`` devices. ``balance="auto"`` returns the
    balanced plan when the planner's is more than 10 % off the mean (computed identically on
    every rank: no collective).
    """
    from rocmtrain.strategies.planning import make_plan, sharding_constraints

    if plan is not None:
        return plan, _report(settings, model, plan, world_size)
    check_supported(settings, sharders, compute_device)
    plan = make_plan(
        model,
        sharders=sharders,
        world_size=world_size,
        local_world_size=local_world_size,
        compute_device=compute_device,
        constraints=sharding_constraints(
            model,
            settings.sharding_type,
            per_table=settings.per_table,
            pooling_factors=settings.pooling_factors,
        ),
        batch_size=batch_size or settings.batch_size or DEFAULT_PLANNER_BATCH,
        hbm_cap_gb=settings.hbm_cap_gb,
        ddr_cap_gb=settings.ddr_cap_gb,
        pg=pg,
    )
    report = _report(settings, model, plan, world_size)
    if settings.balance != "auto" or report is None:
        return plan, report
    return _rebalance(settings, model, plan, report, sharders, world_size, local_world_size,
                      compute_device)  # fmt: skip


def _report(
    settings: PlanSettings, model: nn.Module, plan: ShardingPlan, world_size: int
) -> BalanceReport | None:
    from rocmtrain.strategies.balance import BalanceReport, plan_cost, table_specs

    if settings.balance == "off":
        return None
    cost = plan_cost(plan, table_specs(model), settings.pooling_factors, world_size)
    return BalanceReport(mode=settings.balance, planner=cost)


def _rebalance(
    settings: PlanSettings,
    model: nn.Module,
    plan: ShardingPlan,
    report: BalanceReport,
    sharders: list[Any],
    world_size: int,
    local_world_size: int,
    compute_device: str,
) -> tuple[ShardingPlan, BalanceReport]:
    """The balanced plan, or the planner's (with a note saying why) when it is already within
    10 % of the mean or the balanced one would crowd its fullest rank."""
    from rocmtrain.strategies.balance import balanced_plan, is_balanced, plan_cost, table_specs

    if is_balanced(report.planner):
        note = "within 10 % of the mean: the planner's plan is kept"
        return plan, dataclasses.replace(report, note=note)
    balanced = balanced_plan(
        model,
        plan,
        sharders=sharders,
        world_size=world_size,
        local_world_size=local_world_size,
        compute_device=compute_device,
        pooling_factors=settings.pooling_factors,
        pinned=_pinned_tables(settings, model),
    )
    cost = plan_cost(balanced, table_specs(model), settings.pooling_factors, world_size)
    # The planner's plan fits (its fullest rank <= 85 % of a device, 15 % reserved); a plan
    # whose fullest rank holds no more than that, or no more than 10 % over an even split
    # (<= 1.1 x the planner's fullest), fits too. Beyond that (user-pinned tables): keep it.
    most = max(r.memory_bytes for r in cost.ranks)
    even = sum(r.memory_bytes for r in cost.ranks) / len(cost.ranks)
    if most > max(max(r.memory_bytes for r in report.planner.ranks), 1.1 * even):
        note = (
            "the balanced plan needs more memory on its fullest rank than the planner's plan "
            "and 10 % over an even split: the planner's plan is kept"
        )
        return plan, dataclasses.replace(report, note=note)
    return balanced, dataclasses.replace(report, balanced=cost)


def _pinned_tables(settings: PlanSettings, model: nn.Module) -> dict[str, str]:
    """``{table: sharding_type}`` the user fixed (per table or for all); the balancer only
    moves the tables left to the planner (``auto``)."""
    from rocmtrain.strategies.balance import table_specs

    pinned = {
        name: settings.per_table.get(name, settings.sharding_type) for name in table_specs(model)
    }
    return {name: kind for name, kind in pinned.items() if kind != "auto"}


def planner_batch(settings: PlanSettings, trainer: pl.Trainer | None, module: Any) -> int:
    """The planner's per-rank batch: the argument, else the datamodule's ``batch_size``."""
    if settings.batch_size is not None:
        return settings.batch_size
    dm = getattr(trainer, "datamodule", None)
    for source in (dm, getattr(dm, "hparams", None), module):
        value = getattr(source, "batch_size", None) if source is not None else None
        if isinstance(value, int) and value > 0:
            return value
    log.warning(
        "TorchRecStrategy: no planner_batch_size given and the datamodule has no batch_size "
        "attribute: the planner costs a batch of %d; pass "
        "TorchRecStrategy(planner_batch_size=<per-rank batch>)",
        DEFAULT_PLANNER_BATCH,
    )
    return DEFAULT_PLANNER_BATCH


def log_plan(logger: logging.Logger, plan: ShardingPlan, report: BalanceReport | None) -> None:
    """The plan, table by table, and its per-rank cost (rank 0 logs them once per setup)."""
    from rocmtrain.strategies.planning import describe_plan

    logger.info("sharding plan:\n%s", "\n".join(map(str, describe_plan(plan))))
    if report is not None:
        logger.info("sharding plan cost per rank:\n%s", "\n".join(report.lines()))


def shard_model(
    model: nn.Module,
    plan: ShardingPlan,
    sharders: list[Any],
    *,
    device: torch.device,
    pg: dist.ProcessGroup,
    ddp_kwargs: Mapping[str, Any],
) -> DistributedModelParallel:
    """``model`` in ``DistributedModelParallel``: every table sharded by ``plan`` and
    materialised on this rank, the dense rest in DDP (with ``ddp_kwargs``)."""
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv

    return DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        device=device,
        plan=plan,
        sharders=sharders,
        data_parallel_wrapper=data_parallel_wrapper(ddp_kwargs),
    )


def data_parallel_wrapper(ddp_kwargs: Mapping[str, Any]) -> Any:
    """TorchRec's DDP wrapper of the dense part, with ``ddp_kwargs``."""
    from torchrec.distributed.model_parallel import DefaultDataParallelWrapper

    ddp = dict(ddp_kwargs)
    direct = {k: ddp.pop(k) for k in DDP_WRAPPER_KEYS if k in ddp}
    return DefaultDataParallelWrapper(**direct, ddp_kwargs=ddp or None)


__getattr__ = mixin_getattr(__name__, "ShardingPlanMixin")
