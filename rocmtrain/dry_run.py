"""``python -m rocmtrain ... dry_run=true``: what a run would do, with nothing trained.

Prints the world size, the sharding plan per table (TorchRec's planner on a fake topology), the
environment the strategy sets in every rank, and the launch command. Needs no GPU and no process
group, so a GPU recipe's plan can be read on a laptop.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rocmtrain.config.schema import RunConfig
    from rocmtrain.platform import Placement


def dry_run(cfg: RunConfig, overrides: list[str], where: Placement) -> None:
    """The ``dry_run=true`` command: refuse a CPU rank count the machine cannot hold, then
    print the plan."""
    from rocmtrain.train import check_cpu_ranks

    check_cpu_ranks(cfg, where)
    print_plan(cfg, overrides, where)


def print_plan(cfg: RunConfig, overrides: list[str], where: Placement | None = None) -> None:
    """Print world size, the sharding plan per table, the env vars and the launch command.

    Needs no GPU and no process group: the planner runs on a fake topology of
    ``trainer.devices x trainer.num_nodes`` devices of the recipe's kind.
    """
    import torch

    from rocmtrain.config.model import WEIGHT_BYTES
    from rocmtrain.models.dlrm import build_dlrm
    from rocmtrain.strategies import TorchRecStrategy
    from rocmtrain.strategies.planning import describe_plan

    if where is None:
        from rocmtrain.train import placement_of

        where = placement_of(cfg)
    device, process_group = where.device, where.process_group
    ws, m = cfg.world_size, cfg.model
    rows = m.table_rows()
    out = [f"rocmtrain dry run: recipe {cfg.recipe} (nothing is trained)"]
    out.append(
        f"  world size      {ws} = {cfg.trainer.devices} {device} rank(s)/node x "
        f"{cfg.trainer.num_nodes} node(s); backend {process_group}"
        + (" (RCCL on ROCm)" if process_group == "nccl" else "")
    )
    cap = f", capped at {m.max_rows_per_table:,}" if m.max_rows_per_table else ""
    out.append(
        f"  model           DLRM ({m.interaction} interaction), {m.num_features} tables, "
        f"D={m.embedding_dim}, {sum(rows):,} rows{cap}, embeddings "
        f"{sum(rows) * m.embedding_dim * WEIGHT_BYTES[m.embedding_weight_dtype] / 2**30:.2f} GiB "
        f"{m.embedding_weight_dtype}"
    )
    out.append(
        f"  batch           {cfg.data.batch_size}/rank, global {cfg.data.batch_size * ws}; "
        f"data {cfg.data.kind}; precision {cfg.precision.mode}; kernel {cfg.kernel}"
    )
    model = build_dlrm(m, dense_device=torch.device("meta"))
    strategy = TorchRecStrategy.from_config(cfg)
    plan = strategy.plan_for(
        model, world_size=ws, local_world_size=cfg.trainer.devices, compute_device=device
    )
    kind = strategy.pipeline_kind(where)
    loop = {
        "sparse_dist": "rocmtrain input pipeline (TorchRec's sparse-dist schedule)",
        "semi_sync": (
            "rocmtrain input pipeline, embedding work on a side stream (one step stale from "
            f"batch {cfg.strategy.semi_sync_start_batch})"
        ),
    }.get(kind or "", "plain Lightning loop")
    out.append(f"  train loop      {loop} (strategy.pipeline={cfg.strategy.pipeline})")
    out.append(
        f"  sharding plan   TorchRec planner, sharding_type={cfg.strategy.sharding_type}, "
        f"topology {ws} x {device}"
    )
    out += [f"    {row}" for row in describe_plan(plan)]
    if strategy.balance_report is not None:
        out.append("  plan cost       lookup bytes per sample (pooling factor x dim) per rank")
        out += [f"    {line}" for line in strategy.balance_report.lines()]
    out.append("  environment     set in every rank before init_process_group:")
    out += [f"    {line}" for line in _planned_env(cfg)]
    out.append("  launch")
    out += [f"    {line}" for line in _launch_lines(cfg, overrides)]
    print("\n".join(out), flush=True)


def _planned_env(cfg: RunConfig) -> list[str]:
    """What the strategy sets in every rank, and what it says about the environment: the same
    checks as a real run, so a bad value (``NCCL_PROTO=LL9``) fails the dry run too."""
    from rocmtrain.comms.rccl import environment_findings, plan_rccl_env
    from rocmtrain.config import ConfigError

    warnings: list[str] = []
    try:
        env = plan_rccl_env(cfg.rccl, run_dir=cfg.run_dir, warnings=warnings)
        warnings += environment_findings(dict(os.environ))
    except ValueError as exc:
        raise ConfigError("rccl", "(environment)", str(exc)) from exc
    lines = [f"{k}={v}" for k, v in sorted(env.items())] or ["(none: library defaults)"]
    return lines + [f"warning: {w}" for w in warnings]


def _launch_lines(cfg: RunConfig, overrides: list[str]) -> list[str]:
    args = " ".join(o for o in overrides if not o.startswith("dry_run="))
    cmd = f"python -m rocmtrain {args}".rstrip()
    if cfg.trainer.num_nodes == 1:
        return [
            cmd,
            f"(Lightning starts {cfg.trainer.devices} rank(s) on this node, one per "
            f"{'GPU' if cfg.trainer.accelerator != 'cpu' else 'process'})",
        ]
    return [
        f"{cmd} cluster=slurm   # {cfg.trainer.num_nodes} nodes: submit through Slurm, or run "
        "this command on every node with MASTER_ADDR, MASTER_PORT, NODE_RANK set",
    ]
