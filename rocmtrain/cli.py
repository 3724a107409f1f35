"""Hydra entry point of ``python -m rocmtrain`` (called by ``rocmtrain.__main__``).

    python -m rocmtrain                                  # recipe dlrm_cpu: 2 gloo ranks on CPU
    python -m rocmtrain recipe=dlrm_mi300 dry_run=true   # world size, plan, env, launch command
    python -m rocmtrain recipe=dlrm_cpu trainer.max_epochs=1 data.batch_size=128
    python -m rocmtrain --cfg job                        # print the composed config
    python -m rocmtrain --help                           # groups and options

Flow: register the schema and recipes in Hydra's ConfigStore → compose (typed; a bad key or
type fails here) → :func:`run` validates values and computes the placement once →
``rocmtrain.launch.maybe_submit`` (Slurm) → dry run (:mod:`rocmtrain.dry_run`) or
:func:`rocmtrain.train.run_training`. Known bad input (config values, missing files, missing
GPUs, a plan that does not fit) ends with one ``rocmtrain: error: ...`` line and exit code 2.
The run directory is printed on exit, success or failure.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from rocmtrain import exit_codes
from rocmtrain.config.schema import (
    PRIMARY_CONFIG,
    available_recipes,
    configs_dir,
    register_configs,
    to_run_config,
)
from rocmtrain.ranks import global_rank


def _usage_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that are the user's to fix: printed as one line, exit code USAGE."""
    from rocmtrain.checkpoint import ResumeError
    from rocmtrain.comms.rendezvous import RendezvousError
    from rocmtrain.config import ConfigError
    from rocmtrain.strategies.planning import PlanError
    from rocmtrain.train import HardwareError

    return (
        ConfigError,
        PlanError,
        HardwareError,
        RendezvousError,
        ResumeError,
        FileNotFoundError,
    )


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
    # Lightning counts loader processes only; rocmtrain's data picks them (data.num_workers=null),
    # GPU runs make synthetic batches on the device, and the input pipeline reports a slow loader
    r".*does not have many workers which may be a bottleneck.*",
)


def hydra_main(argv: list[str]) -> int:
    """Compose the config from ``argv`` (Hydra overrides) and run it; returns the exit code.

    Exit codes: 0 done, 1 training failed (one line names the rank and the exception; the
    traceback is in ``<run_dir>/logs/``, or on screen with ``HYDRA_FULL_ERROR=1``), 2 the command
    line or the config is unusable, 75 hang or preemption (requeue), 128+N a signal ended start-up.
    """
    import warnings

    import hydra

    for pattern in _QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    # a full disk fails the job log's file handler on every record; the console still gets each
    # line, and the one error line says what failed, without a traceback per log record
    logging.raiseExceptions = False

    from rocmtrain.faults.preemption import arm_early, disarm_early
    from rocmtrain.launch.orphans import die_with_parent, started_by_lightning

    arm_early()  # a preemption signal during start-up: requeue exit, not a killed rank
    if started_by_lightning():  # a rank Lightning re-ran this command for: gone with rank 0
        die_with_parent()
    register_configs()
    argv = _pin_run_dir(list(argv))
    problem = _multirun_problem(argv) or _unwritable_run_dir(argv)
    if problem:
        print(f"rocmtrain: error: {problem}", file=sys.stderr)
        disarm_early(())
        return exit_codes.USAGE
    result: dict[str, int] = {}

    @hydra.main(version_base="1.3", config_path=str(configs_dir()), config_name=PRIMARY_CONFIG)
    def _entry(cfg: Any) -> None:
        result["started"] = 1
        result["code"] = run(cfg)

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


def _compose_quietly(overrides: list[str]) -> Any:
    """The composed config of ``overrides``, or None when they do not compose (the real run
    then reports that with Hydra's own message)."""
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(config_dir=str(configs_dir()), version_base="1.3"):
            return compose(PRIMARY_CONFIG, overrides=overrides)
    except Exception:  # noqa: BLE001 - reported by the real run
        return None


def _multirun_problem(argv: list[str]) -> str | None:
    """A Hydra sweep (``-m``) runs its jobs one after another in this process, but every rank
    Lightning starts re-runs the whole command line, so each rank would sweep on its own, into
    its own run dirs. A sweep is refused unless each of its jobs is one rank."""
    if not {"-m", "--multirun"} & set(argv):
        return None
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    overrides = [a for a in argv if not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001 - Hydra reports a bad override itself
        return None
    # every combination's world size would be exact; the first value of each sweep is enough for
    # all but the world-size keys themselves, whose values are all tried
    fixed, sizes = [], []
    for o in parsed:
        key = o.input_line.split("=", 1)[0]
        values = list(o.sweep_string_iterator()) if o.is_sweep_override() else None
        if values is None:
            fixed.append(o.input_line)
        elif key.lstrip("+~") in ("trainer.devices", "trainer.num_nodes"):
            sizes += [[f"{key}={v}" for v in values]]
        else:
            fixed.append(f"{key}={values[0]}")
    for combo in itertools.product(*sizes):
        cfg = _compose_quietly([*fixed, *combo])
        if cfg is None:
            return None
        ranks = int(OmegaConf.select(cfg, "trainer.devices")) * int(
            OmegaConf.select(cfg, "trainer.num_nodes")
        )
        if ranks > 1 and OmegaConf.select(cfg, "cluster.kind") == "local":
            return (
                f"-m (Hydra multirun) with {ranks} ranks: every rank would run its own sweep; "
                "sweep with trainer.devices=1, or run one command per setting "
                "(for s in 1 2; do python -m rocmtrain seed=$s; done)"
            )
    return None


def _unwritable_run_dir(argv: list[str]) -> str | None:
    """Hydra creates ``run_dir`` before the job starts (a traceback when it cannot): check the
    composed ``run_dir`` first. None when it is writable or the command does not compose (Hydra
    then reports that itself)."""
    if any(a.startswith("-") for a in argv):
        return None
    from omegaconf import OmegaConf

    cfg = _compose_quietly(argv)
    if cfg is None:
        return None
    raw = str(OmegaConf.select(cfg, "run_dir") or "")
    if not raw.strip():  # Path("") is the current folder, and its checkpoints "/checkpoints"
        return (
            f"run_dir={raw!r} is empty; name the run's folder (run_dir=runs/my_run), or leave "
            "run_dir out for runs/<recipe>/<date_time>"
        )
    path = Path(raw).absolute()
    if global_rank() == 0:  # ranks Lightning starts join the run that holds the lock
        from rocmtrain import run_lock
        from rocmtrain.run_dirs import IN_USE

        other = run_lock.holder(path)
        if other is not None:
            return f"run_dir={str(path)!r} is invalid: {IN_USE.format(other)}"
    from rocmtrain.run_dirs import write_error

    exc = write_error(path)
    if exc is not None:
        return (
            f"run_dir={str(path)!r} is not writable ({exc.strerror}); choose a writable folder "
            "(run_dir=/path/to/runs/name)"
        )
    return None


def run(cfg: Any) -> int:
    """Validate, then submit / dry-run / train the composed config. Returns the exit code."""
    from rocmtrain.config.schema import validate_run_config
    from rocmtrain.log_setup import quiet_other_ranks

    quiet_other_ranks()  # Hydra has set up the console: each INFO line once, from rank 0
    run_dir = Path(str(cfg.run_dir))
    existed = not _only_hydra_files(run_dir)  # Hydra has written .hydra/ and its log by now
    started = False
    try:
        reject_unknown_keys(cfg)
        rc = to_run_config(cfg)
        validate_run_config(rc)  # the one validation of this run
        code = maybe_submit(rc, _task_overrides())
        if code is not None:
            return code
        from rocmtrain.train import placement_of

        where = placement_of(rc)  # the GPU question, answered once for the run
        if rc.dry_run:
            from rocmtrain.dry_run import dry_run

            dry_run(rc, _task_overrides(), where)
            return exit_codes.OK
        from rocmtrain.train import run_training

        started = True
        run_training(rc, where)
        return exit_codes.OK
    except _usage_errors() as exc:
        started = started and _has_checkpoint_or_logs(run_dir)
        print(f"rocmtrain: error: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    except KeyboardInterrupt:
        print(
            f"rocmtrain: interrupted (rank {global_rank()}); no checkpoint written", file=sys.stderr
        )
        return exit_codes.INTERRUPTED
    except Exception as exc:  # a crash while training: one line here, the traceback in the run dir
        _report_crash(exc, run_dir)
        return exit_codes.FAILURE
    finally:
        if not started and not existed:
            _discard(run_dir)  # a rejected command leaves no run dir behind
        elif global_rank() == 0 and run_dir.is_dir():
            print(f"rocmtrain: run dir: {run_dir.resolve()}", file=sys.stderr)


def reject_unknown_keys(cfg: Any) -> None:
    """``+trainer.max_epoch=1`` adds a key the schema does not have; OmegaConf keeps it and
    ``to_object`` would drop it silently. Raise :class:`ConfigError` naming it instead."""
    import dataclasses
    import difflib

    from omegaconf import DictConfig, OmegaConf

    from rocmtrain.config import ConfigError

    def walk(node: Any, prefix: str) -> None:
        if not isinstance(node, DictConfig):
            return
        kind = OmegaConf.get_type(node)
        if kind is None or not dataclasses.is_dataclass(kind):
            return
        fields = [f.name for f in dataclasses.fields(kind)]
        for key in node.keys():
            name = f"{prefix}{key}"
            if key not in fields:
                close = difflib.get_close_matches(str(key), fields, n=1)
                fix = (
                    f"did you mean {prefix}{close[0]}?"
                    if close
                    else f"{prefix.rstrip('.') or 'the root'} has no such key"
                )
                raise ConfigError(
                    name,
                    OmegaConf.select(node, str(key)),
                    f"unknown key; {fix} (valid keys: python -m rocmtrain --cfg job)",
                )
            walk(node._get_node(key), f"{name}.")

    walk(cfg, "")


def _report_crash(exc: BaseException, run_dir: Path) -> None:
    from rocmtrain.faults.hints import write_traceback

    rank = global_rank()
    path = write_traceback(exc, run_dir, rank)
    first = (str(exc).strip().splitlines() or [""])[0]
    where = path.resolve() if path is not None else "not written"
    print(
        f"rocmtrain: error: training failed on rank {rank}: {type(exc).__name__}: {first} "
        f"(traceback: {where})",
        file=sys.stderr,
    )
    for note in getattr(exc, "__notes__", ()):  # error hints (rocmtrain.faults.hints)
        print(note, file=sys.stderr)
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        import traceback

        traceback.print_exception(exc, file=sys.stderr)


def _only_hydra_files(run_dir: Path) -> bool:
    """True when ``run_dir`` is missing or holds only what Hydra wrote for this command."""
    if not run_dir.is_dir():
        return True
    from rocmtrain.run_lock import LOCK_NAME  # the launching rank's lock is this command's too

    return all(p.name in (".hydra", LOCK_NAME) or p.suffix == ".log" for p in run_dir.iterdir())


def _has_checkpoint_or_logs(path: Path) -> bool:
    return any((path / name).exists() for name in ("checkpoints", "logs", "watchdog"))


def _discard(run_dir: Path) -> None:
    """Remove a run dir that holds only what Hydra wrote for this command (``.hydra``, the job
    log); never a folder with anything else in it."""
    import shutil

    if not run_dir.is_dir() or global_rank() != 0:
        return
    if _only_hydra_files(run_dir):
        shutil.rmtree(run_dir, ignore_errors=True)
        parent = run_dir.parent
        if parent.is_dir() and not any(parent.iterdir()):  # runs/<recipe>/ made for it alone
            parent.rmdir()


def _task_overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return []
    task = OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False)
    return [str(o) for o in task if str(o) not in _PINNED]


# -- Slurm submission (rocmtrain.launch) ---------------------------------------------------------
def maybe_submit(cfg: Any, overrides: list[str]) -> int | None:
    """Submit to Slurm (or print its dry run) when ``cluster.kind == slurm``; None = run here."""
    from rocmtrain.launch import maybe_submit as submit

    return submit(cfg, overrides)
