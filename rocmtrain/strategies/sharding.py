"""The strategy's sharding plan: which plan ``TorchRecStrategy`` shards with, and what it costs.

:mod:`rocmtrain.strategies.planning` runs TorchRec's planner and :mod:`rocmtrain.strategies.balance`
costs and balances a plan; both are free functions of their arguments. This module is the part
that reads the strategy's own arguments (``sharding_type``, ``per_table_sharding``, ``kernel``,
``balance``, ``plan`` ...) and feeds them to those functions, so that setup, the dry run
(``python -m rocmtrain dry_run=true``) and the pre-launch check of ``rocmtrain.train`` all go
through the same :meth:`ShardingPlanMixin.plan_for`.

TorchRec is imported inside the methods, not here: ``import rocmtrain`` must not import it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytorch_lightning as pl
    import torch.distributed as dist
    from torch import nn
    from torchrec.distributed.types import ShardingPlan

    from rocmtrain.strategies.balance import BalanceReport

log = logging.getLogger(__name__)

#: the per-rank batch the planner costs when neither the strategy nor the datamodule names one
DEFAULT_PLANNER_BATCH = 512


class ShardingPlanMixin:
    """Plan, balance report and sharders of a :class:`~rocmtrain.strategies.TorchRecStrategy`.

    A mixin rather than a helper object because Lightning, the CLI and the tests reach these as
    methods and attributes of the strategy itself; the state lives on the strategy, which sets
    the attributes declared below in its ``__init__``.
    """

    _sharding_type: str
    _per_table_sharding: dict[str, str]
    _kernel: str
    _balance: str
    _balance_report: BalanceReport | None
    _fused_params: dict[str, Any] | None
    _plan: ShardingPlan | None
    _pooling_factors: dict[str, float] | None
    _planner_batch_size: int | None
    _hbm_cap_gb: float | None
    _ddr_cap_gb: float | None
    _sharder_list: list[Any] | None

    if TYPE_CHECKING:

        @property
        def lightning_module(self) -> pl.LightningModule | None: ...

        def _trainer(self) -> pl.Trainer | None: ...

    def plan_for(
        self,
        model: nn.Module,
        *,
        world_size: int,
        local_world_size: int,
        compute_device: str,
        batch_size: int | None = None,
        pg: dist.ProcessGroup | None = None,
    ) -> ShardingPlan:
        """The sharding plan of ``model`` (the dry run prints this same plan). Without ``pg`` the
        planner runs on a fake topology of ``world_size`` ``compute_device`` devices.

        With ``balance`` ``report`` or ``auto`` the plan's per-rank cost is in
        :attr:`balance_report`; ``auto`` returns the balanced plan when the planner's is more
        than 10 % off the mean (computed identically on every rank: no collective).
        """
        from rocmtrain.strategies.planning import make_plan, sharding_constraints

        if self._plan is not None:  # the caller's plan: reported, never replaced
            self._balance_report = self._report(model, self._plan, world_size, mode=self._balance)
            return self._plan
        self.check_supported(compute_device)
        plan = make_plan(
            model,
            sharders=self._sharders(),
            world_size=world_size,
            local_world_size=local_world_size,
            compute_device=compute_device,
            constraints=sharding_constraints(
                model,
                self._sharding_type,
                per_table=self._per_table_sharding,
                pooling_factors=self._pooling_factors,
            ),
            batch_size=batch_size or self._planner_batch_size or DEFAULT_PLANNER_BATCH,
            hbm_cap_gb=self._hbm_cap_gb,
            ddr_cap_gb=self._ddr_cap_gb,
            pg=pg,
        )
        self._balance_report = self._report(model, plan, world_size, mode=self._balance)
        if self._balance != "auto" or self._balance_report is None:
            return plan
        return self._rebalance(model, plan, world_size, local_world_size, compute_device)

    @property
    def balance_report(self) -> BalanceReport | None:
        """Per-rank lookup cost and memory of the last :meth:`plan_for` (``None`` with
        ``balance="off"``)."""
        return self._balance_report

    def check_supported(self, compute_device: str) -> None:
        """Raise :class:`~rocmtrain.strategies.planning.PlanError` before anything starts when
        the sharders cannot shard the tables as configured on ``compute_device``."""
        from rocmtrain.strategies.planning import check_sharding_supported

        check_sharding_supported(
            self._sharders(),
            self._sharding_type,
            per_table=self._per_table_sharding,
            compute_device=compute_device,
            kernel=self._kernel,
        )

    def _report(
        self, model: nn.Module, plan: ShardingPlan, world_size: int, *, mode: str
    ) -> BalanceReport | None:
        from rocmtrain.strategies.balance import BalanceReport, plan_cost, table_specs

        if self._balance == "off":
            return None
        cost = plan_cost(plan, table_specs(model), self._pooling_factors, world_size)
        return BalanceReport(mode=mode, planner=cost)

    def _rebalance(
        self,
        model: nn.Module,
        plan: ShardingPlan,
        world_size: int,
        local_world_size: int,
        compute_device: str,
    ) -> ShardingPlan:
        """The balanced plan, or the planner's (with a note saying why) when it is already within
        10 % of the mean or the balanced one would crowd its fullest rank."""
        from rocmtrain.strategies.balance import balanced_plan, is_balanced, plan_cost, table_specs

        report = self._balance_report
        assert report is not None
        if is_balanced(report.planner):
            self._balance_report = dataclasses.replace(
                report, note="within 10 % of the mean: the planner's plan is kept"
            )
            return plan
        balanced = balanced_plan(
            model,
            plan,
            sharders=self._sharders(),
            world_size=world_size,
            local_world_size=local_world_size,
            compute_device=compute_device,
            pooling_factors=self._pooling_factors,
            pinned=self._pinned_tables(model),
        )
        cost = plan_cost(balanced, table_specs(model), self._pooling_factors, world_size)
        # The planner's plan fits (its fullest rank <= 85 % of a device, 15 % reserved); a plan
        # whose fullest rank holds no more than that, or no more than 10 % over an even split
        # (<= 1.1 x the planner's fullest), fits too. Beyond that (user-pinned tables): keep it.
        most = max(r.memory_bytes for r in cost.ranks)
        even = sum(r.memory_bytes for r in cost.ranks) / len(cost.ranks)
        if most > max(max(r.memory_bytes for r in report.planner.ranks), 1.1 * even):
            self._balance_report = dataclasses.replace(
                report,
                note="the balanced plan needs more memory on its fullest rank than the "
                "planner's plan and 10 % over an even split: the planner's plan is kept",
            )
            return plan
        self._balance_report = dataclasses.replace(report, balanced=cost)
        return balanced

    def _pinned_tables(self, model: nn.Module) -> dict[str, str]:
        """``{table: sharding_type}`` the user fixed (per table or for all); the balancer only
        moves the tables left to the planner (``auto``)."""
        from rocmtrain.strategies.balance import table_specs

        pinned = {
            name: self._per_table_sharding.get(name, self._sharding_type)
            for name in table_specs(model)
        }
        return {name: kind for name, kind in pinned.items() if kind != "auto"}

    def _sharders(self) -> list[Any]:
        """The sharders of ``kernel`` and ``fused_params``, built once and shared by the support
        check, the planner, the balancer and ``DistributedModelParallel``."""
        from rocmtrain.strategies.planning import build_sharders

        if self._sharder_list is None:
            self._sharder_list = build_sharders(self._kernel, fused_params=self._fused_params)
        return self._sharder_list

    def _batch_size(self) -> int:
        """The planner's per-rank batch: the argument, else the datamodule's ``batch_size``."""
        if self._planner_batch_size is not None:
            return self._planner_batch_size
        trainer = self._trainer()
        dm = getattr(trainer, "datamodule", None)
        for source in (dm, getattr(dm, "hparams", None), self.lightning_module):
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
