"""Hydra entry point of ``python -m rocmtrain`` (called by ``rocmtrain.__main__``).

    python -m rocmtrain                                  # recipe dlrm_cpu: 2 gloo ranks on CPU
    python -m rocmtrain recipe=dlrm_mi300 dry_run=true   # world size, plan, env, launch command
    python -m rocmtrain recipe=dlrm_cpu trainer.max_epochs=1 data.batch_size=128
    python -m rocmtrain --cfg job                        # print the composed config
    python -m rocmtrain --help                           # groups and options

Flow: register the schema and recipes in Hydra's ConfigStore → compose (typed; a bad key or
type fails here) → :func:`run` validates values → ``rocmtrain.launch.maybe_submit`` (Slurm) →
dry run or :func:`rocmtrain.train.train`. Known bad input (config values, missing files, missing
GPUs, a plan that does not fit) ends with one ``rocmtrain: error: ...`` line and exit code 2.
The run directory is printed on exit, success or failure.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from rocmtrain import exit_codes
from rocmtrain.config.schema import (
    PRIMARY_CONFIG,
    available_recipes,
    configs_dir,
    register_configs,
    to_run_config,
)

#: exceptions that are the user's to fix: printed as one line, exit code USAGE
_USAGE_ERRORS: tuple[type[BaseException], ...] = ()


def _usage_errors() -> tuple[type[BaseException], ...]:
    from rocmtrain.config import ConfigError
    from rocmtrain.config.data import DataConfigError
    from rocmtrain.strategies.planning import PlanError
    from rocmtrain.train import HardwareError

    return (ConfigError, DataConfigError, PlanError, HardwareError, FileNotFoundError)


def _rank() -> int:
    env = os.environ  # RANK (torchrun/Lightning), SLURM_PROCID (a Slurm task), LOCAL_RANK
    return int(env.get("RANK", env.get("SLURM_PROCID", env.get("LOCAL_RANK", "0"))) or 0)


_PINNED: list[str] = []  # the run_dir override added by _pin_run_dir (not the user's)


def _pin_run_dir(argv: list[str]) -> list[str]:
    """Give the run a concrete timestamp once, in the launching process, so the ranks Lightning
    starts (which re-run this command line) and a Slurm requeue agree on ``run_dir``."""
    if any(a.startswith(("run_dir=", "+run_dir=", "++run_dir=")) for a in argv):
        return argv
    if any(a.startswith("-") for a in argv):  # --cfg, --help, -m, ...: nothing runs
        return argv
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    _PINNED.append(f"run_dir=runs/${{recipe}}/{stamp}")
    return [*argv, _PINNED[-1]]


#: third-party warnings that say nothing actionable to a user of the CLI (library code keeps them)
_QUIET_WARNINGS = (
    r".*`broadcast_buffers` is deprecated.*",
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",
    r".*Your `IterableDataset` has `__len__` defined.*",
    r".*The `srun` command is available on your system but is not used.*",
    r".*It is recommended to use `self.log\(.*sync_dist=True\)`.*",
)


def hydra_main(argv: list[str]) -> int:
    """Compose the config from ``argv`` (Hydra overrides) and run it; returns the exit code."""
    import warnings

    import hydra

    for pattern in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)

    from rocmtrain.faults.preemption import arm_early, disarm_early

    arm_early()  # a preemption signal during start-up: requeue exit, not a killed rank
    register_configs()
    argv = _pin_run_dir(list(argv))
    result: dict[str, int] = {}

    @hydra.main(version_base="1.3", config_path=str(configs_dir()), config_name=PRIMARY_CONFIG)
    def _entry(cfg: Any) -> None:
        try:
            result["code"] = run(cfg)
        except SystemExit as exc:  # e.g. preemption/hang handlers exit 75 (REQUEUE): keep the code
            result["code"] = exc.code if isinstance(exc.code, int) else exit_codes.FAILURE

    saved = sys.argv
    sys.argv = [saved[0] if saved else "rocmtrain", *argv]  # Lightning re-runs sys.argv per rank
    try:
        _entry()
    except SystemExit as exc:  # Hydra reports compose errors itself, then exits 1
        code = exc.code if isinstance(exc.code, int) else exit_codes.FAILURE
        if "started" not in result and code != exit_codes.OK:
            print(
                "rocmtrain: error: the command line or a recipe does not compose (see above). "
                f"Recipes: {', '.join(available_recipes())}; valid keys: "
                "python -m rocmtrain --cfg job",
                file=sys.stderr,
            )
            return exit_codes.USAGE
        return result.get("code", code)
    finally:
        sys.argv = saved
        disarm_early(())  # still held (dry run, submit, compose error): default action back
    return result.get("code", exit_codes.OK)


def run(cfg: Any) -> int:
    """Validate, then submit / dry-run / train the composed config. Returns the exit code."""
    from rocmtrain.config.schema import validate_run_config

    run_dir = None
    try:
        run_dir = str(cfg.run_dir)
        rc = to_run_config(cfg)
        validate_run_config(rc)
        code = maybe_submit(rc, _task_overrides())
        if code is not None:
            run_dir = None  # submitted / printed: the job's run dir was printed by maybe_submit
            return code
        if rc.dry_run:
            print_plan(rc, _task_overrides())
            return exit_codes.OK
        from rocmtrain.train import train

        train(rc)
        return exit_codes.OK
    except _usage_errors() as exc:
        print(f"rocmtrain: error: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    finally:
        if run_dir and _rank() == 0:
            print(f"rocmtrain: run dir: {os.path.abspath(run_dir)}", file=sys.stderr)


def _task_overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return []
    task = OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False)
    return [str(o) for o in task if str(o) not in _PINNED]


# -- integration point: Slurm submission (rocmtrain.launch, owner: slurm area) -------------------
def maybe_submit(cfg: Any, overrides: list[str]) -> int | None:
    """Submit to Slurm (or print its dry run) when ``cluster.kind == slurm``; None = run here."""
    from rocmtrain.launch import maybe_submit as submit

    return submit(cfg, overrides)


# -- dry run --------------------------------------------------------------------------------------
def print_plan(cfg: Any, overrides: list[str]) -> None:
    """Print world size, the sharding plan per table, the env vars and the launch command.

    Needs no GPU and no process group: the planner runs on a fake topology of
    ``trainer.devices x trainer.num_nodes`` devices of the recipe's kind.
    """
    import torch

    from rocmtrain.models.dlrm import build_dlrm, pooling_factors
    from rocmtrain.strategies.planning import (
        build_sharders,
        describe_plan,
        make_plan,
        sharding_constraints,
    )

    gpu = cfg.trainer.accelerator in ("gpu", "auto") and (
        cfg.trainer.accelerator == "gpu" or cfg.strategy.backend == "nccl"
    )
    device = "cuda" if gpu else "cpu"
    backend = (
        cfg.strategy.backend if cfg.strategy.backend != "auto" else ("nccl" if gpu else "gloo")
    )
    ws, m = cfg.world_size, cfg.model
    rows = m.table_rows()
    out = [f"rocmtrain dry run: recipe {cfg.recipe} (nothing is trained)"]
    out.append(
        f"  world size      {ws} = {cfg.trainer.devices} {device} rank(s)/node x "
        f"{cfg.trainer.num_nodes} node(s); backend {backend}"
        + (" (RCCL on ROCm)" if backend == "nccl" else "")
    )
    cap = f", capped at {m.max_rows_per_table:,}" if m.max_rows_per_table else ""
    out.append(
        f"  model           DLRM ({m.interaction} interaction), {m.num_features} tables, "
        f"D={m.embedding_dim}, {sum(rows):,} rows{cap}, embeddings "
        f"{sum(rows) * m.embedding_dim * 4 / 2**30:.2f} GiB fp32"
    )
    out.append(
        f"  batch           {cfg.data.batch_size}/rank, global {cfg.data.batch_size * ws}; "
        f"data {cfg.data.kind}; precision {cfg.precision.mode}; kernel {cfg.kernel}"
    )
    model = build_dlrm(m, dense_device=torch.device("meta"))
    plan = make_plan(
        model,
        sharders=build_sharders(cfg.kernel),
        world_size=ws,
        local_world_size=cfg.trainer.devices,
        compute_device=device,
        constraints=sharding_constraints(
            model,
            cfg.strategy.sharding_type,
            per_table=cfg.strategy.per_table_sharding,
            pooling_factors=pooling_factors(m),
        ),
        batch_size=cfg.data.batch_size,
        hbm_cap_gb=cfg.strategy.hbm_cap_gb,
        ddr_cap_gb=cfg.strategy.ddr_cap_gb,
    )
    from rocmtrain.train import use_pipeline

    loop = "TorchRec TrainPipelineSparseDist" if use_pipeline(cfg) else "plain Lightning loop"
    out.append(f"  train loop      {loop} (strategy.pipeline={cfg.strategy.pipeline})")
    out.append(
        f"  sharding plan   TorchRec planner, sharding_type={cfg.strategy.sharding_type}, "
        f"topology {ws} x {device}"
    )
    out += [f"    {row}" for row in describe_plan(plan)]
    out.append("  environment     set in every rank before init_process_group:")
    out += [f"    {line}" for line in _planned_env(cfg)]
    out.append("  launch")
    out += [f"    {line}" for line in _launch_lines(cfg, overrides)]
    print("\n".join(out), flush=True)


def _planned_env(cfg: Any) -> list[str]:
    # integration point: rocmtrain.comms.rccl (owner: RCCL area)
    try:
        from rocmtrain.comms.rccl import plan_rccl_env
    except ImportError:
        return ["(rocmtrain.comms.rccl not available: no RCCL/NCCL variables would be set)"]
    warnings: list[str] = []
    try:
        env = plan_rccl_env(cfg.rccl, run_dir=cfg.run_dir, warnings=warnings)
    except ValueError as exc:
        from rocmtrain.config import ConfigError

        raise ConfigError("rccl", "(see message)", str(exc)) from exc
    lines = [f"{k}={v}" for k, v in sorted(env.items())] or ["(none: library defaults)"]
    return lines + [f"warning: {w}" for w in warnings]


def _launch_lines(cfg: Any, overrides: list[str]) -> list[str]:
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
