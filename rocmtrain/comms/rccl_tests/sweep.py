"""Sweep protocol × algorithm × channel settings over message sizes; write a table, a plot, a preset.

    python -m rocmtrain rccl-tests sweep --collectives all_reduce,alltoall \\
        --protocols unset,LL,LL128,Simple --algorithms unset,Ring,Tree --channels unset \\
        --min-bytes 8 --max-bytes 256M --ngpus 8 --out runs/rccl_sweep --preset-name mi300x_measured

Each setting is an :class:`~rocmtrain.config.rccl.RcclConfig` turned into env vars by the same code a
training run uses (:func:`rocmtrain.comms.rccl.plan_rccl_env`), so a preset means what was measured.
``unset`` really removes the variable from the child's environment (RCCL's own tuning), and is the
baseline. Outputs in ``--out``: ``sweep.md`` (the metric per size and setting, failures named), ``sweep.json``,
``sweep.png`` (the metric vs size per setting, one panel per collective) and ``<preset-name>.yaml`` in the
``configs/rccl/`` format. The preset picks the setting with the best geometric-mean speed-up over the
baseline for sizes >= ``score_min_bytes``; a gain under ``margin`` keeps the baseline (sets nothing).
``--metric`` picks what is compared: busbw (default), algbw, or time — on a single GPU busbw is 0 by
definition (nccl-tests scales it by (n-1)/n), so sweep ``time`` there.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rocmtrain.comms.rccl import COLLECTIVE_FIELDS, Platform, plan_rccl_env
from rocmtrain.comms.rccl_tests.parser import Row
from rocmtrain.comms.rccl_tests.runner import (
    Outcome,
    RunSpec,
    build_command,
    find_binary,
    run_test,
)
from rocmtrain.config.rccl import RcclConfig

#: env vars a sweep controls: removed from the child's environment unless the setting sets them
SWEPT_VARS = tuple(COLLECTIVE_FIELDS[f] for f in (
    "protocol", "algorithm", "override_protocol", "override_algorithm", "min_channels",
    "max_channels"))  # fmt: skip


@dataclass(frozen=True)
class Setting:
    protocol: str | None = None
    algorithm: str | None = None
    channels: int | None = None

    @property
    def name(self) -> str:
        parts = [f"proto={self.protocol}" if self.protocol else "",
                 f"algo={self.algorithm}" if self.algorithm else "",
                 f"ch={self.channels}" if self.channels else ""]  # fmt: skip
        return " ".join(p for p in parts if p) or "unset (library decides)"

    def config(self) -> RcclConfig:
        return RcclConfig(protocol=self.protocol, algorithm=self.algorithm,
                          min_channels=self.channels, max_channels=self.channels)  # fmt: skip


def grid(
    protocols: Sequence[str], algorithms: Sequence[str], channels: Sequence[str]
) -> list[Setting]:
    """Cartesian product; the token ``unset`` means None (leave RCCL's choice). Validated early."""

    def opt(v: str) -> str | None:
        return None if v.strip().lower() in ("unset", "none", "") else v.strip()

    out: list[Setting] = []
    for p, a, c in itertools.product(protocols, algorithms, channels):
        ch = opt(c)
        setting = Setting(opt(p), opt(a), int(ch) if ch is not None else None)
        plan_rccl_env(setting.config(), collective_only=True, plat=Platform(None, None))
        if setting not in out:
            out.append(setting)
    return out


@dataclass
class SweepRun:
    setting: Setting
    collective: str
    command: list[str]
    env: dict[str, str]
    ok: bool
    errors: list[str]
    rows: list[Row] = field(default_factory=list)


#: what a sweep compares: column, unit, and whether higher is better
METRICS = {"busbw": ("busbw_gbps", "GB/s", True), "algbw": ("algbw_gbps", "GB/s", True),
           "time": ("time_us", "us", False)}  # fmt: skip


def _value(row: Row, metric: str = "busbw") -> float:
    """The out-of-place value (in-place when only that block exists)."""
    m = row.out_of_place or row.in_place
    return getattr(m, METRICS[metric][0]) if m is not None else float("nan")


def child_env(base: Mapping[str, str], setting_env: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in SWEPT_VARS}
    env.update(setting_env)
    return env


def run_sweep(
    *,
    collectives: Sequence[str],
    settings: Sequence[Setting],
    spec: RunSpec,
    out_dir: Path,
    search_dirs: Sequence[str] = (),
    launcher: str = "local",
    nprocs: int = 1,
    timeout_s: float = 600.0,
    base_env: Mapping[str, str] | None = None,
    plat: Platform | None = None,
    log=print,
) -> list[SweepRun]:
    """Run every (collective, setting); keep the raw logs in ``out_dir/logs``. Never raises on a
    failed run (it is recorded); raises FileNotFoundError when a binary is missing (before running)."""
    plat = plat or Platform.detect()
    base = dict(os.environ if base_env is None else base_env)
    binaries = {c: find_binary(c, search_dirs=search_dirs, environ=base) for c in collectives}
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    runs: list[SweepRun] = []
    for coll, setting in itertools.product(collectives, settings):
        senv = plan_rccl_env(setting.config(), collective_only=True, plat=plat)
        cmd = build_command(binaries[coll], spec, launcher=launcher, nprocs=nprocs)  # type: ignore[arg-type]
        slug = "".join(ch if ch.isalnum() else "_" for ch in f"{coll}_{setting.name}")
        t0 = time.monotonic()
        res: Outcome = run_test(cmd, timeout_s=timeout_s, env=child_env(base, senv),
                                log_path=out_dir / "logs" / f"{slug}.log")  # fmt: skip
        log(
            f"{coll:>14} {setting.name:<32} {'ok' if res.ok else 'FAILED'} "
            f"({time.monotonic() - t0:.1f} s){'' if res.ok else ': ' + res.errors[0]}"
        )
        runs.append(SweepRun(setting, coll, cmd, senv, res.ok, res.errors, res.parsed.rows))
    return runs


def score(
    runs: Sequence[SweepRun], *, score_min_bytes: int = 0, metric: str = "busbw"
) -> dict[Setting, float | None]:
    """Geometric mean over sizes of the speed-up vs the baseline (value ratio, or time ratio
    baseline/setting for ``time``); > 1 is better. None when a run of the setting failed.

    On one rank busbw is 0 by definition (factor (n-1)/n): use ``metric="time"`` there.
    """
    higher = METRICS[metric][2]
    base = {(r.collective, row.size_bytes): _value(row, metric) for r in runs
            if r.setting == Setting() and r.ok for row in r.rows}  # fmt: skip
    out: dict[Setting, float | None] = {}
    for setting in dict.fromkeys(r.setting for r in runs):
        mine = [r for r in runs if r.setting == setting]
        if not all(r.ok for r in mine):
            out[setting] = None
            continue
        logs = [(1 if higher else -1) * math.log(_value(row, metric) / base[(r.collective, row.size_bytes)])
                for r in mine for row in r.rows
                if row.size_bytes >= score_min_bytes and base.get((r.collective, row.size_bytes), 0) > 0
                and _value(row, metric) > 0]  # fmt: skip
        out[setting] = math.exp(sum(logs) / len(logs)) if logs else None
    return out


def choose(scores: Mapping[Setting, float | None], *, margin: float = 0.03) -> Setting:
    """The best-scoring setting if it beats the baseline by more than ``margin``, else the baseline."""
    valid = {s: v for s, v in scores.items() if v is not None}
    if not valid:
        return Setting()
    best = max(valid, key=lambda s: valid[s])
    return best if valid[best] > 1.0 + margin and best != Setting() else Setting()


def table_markdown(
    runs: Sequence[SweepRun], scores: Mapping[Setting, float | None], *, metric: str = "busbw"
) -> str:
    """The metric (out-of-place) per size × setting, one table per collective, then the scores."""
    unit = METRICS[metric][1]
    lines: list[str] = []
    settings = list(dict.fromkeys(r.setting for r in runs))
    for coll in dict.fromkeys(r.collective for r in runs):
        mine = {r.setting: r for r in runs if r.collective == coll}
        sizes = sorted({row.size_bytes for r in mine.values() for row in r.rows})
        lines += [f"### {coll}: {metric} {unit} (out-of-place)", "",
                  "| size (B) | " + " | ".join(s.name for s in settings) + " |",
                  "|---:|" + "---:|" * len(settings)]  # fmt: skip
        for size in sizes:
            cells = []
            for s in settings:
                row = (
                    next((x for x in mine[s].rows if x.size_bytes == size), None)
                    if s in mine
                    else None
                )
                cells.append("—" if row is None else f"{_value(row, metric):.2f}")
            lines.append(f"| {size} | " + " | ".join(cells) + " |")
        failed = [f"- {s.name}: {'; '.join(mine[s].errors[:2])}" for s in settings
                  if s in mine and not mine[s].ok]  # fmt: skip
        lines += ["", *(["Failed runs:", *failed, ""] if failed else [])]
    lines += [
        f"### score: geometric-mean {metric} speed-up vs unset (> 1 is better)",
        "",
        "| setting | score |",
        "|---|---:|",
    ]
    for s, v in scores.items():
        lines.append(f"| {s.name} | {'failed' if v is None else f'{v:.3f}'} |")
    return "\n".join(lines) + "\n"


def plot_png(runs: Sequence[SweepRun], path: Path, *, metric: str = "busbw") -> None:
    """The metric vs message size, one line per setting, one panel per collective (matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colls = list(dict.fromkeys(r.collective for r in runs))
    fig, axes = plt.subplots(1, len(colls), figsize=(6.5 * len(colls), 4.5), squeeze=False)
    for ax, coll in zip(axes[0], colls, strict=True):
        for r in (r for r in runs if r.collective == coll and r.rows):
            ax.plot([row.size_bytes for row in r.rows], [_value(row, metric) for row in r.rows],
                    marker=".", label=r.setting.name + ("" if r.ok else " (FAILED)"))  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(f"{metric} ({METRICS[metric][1]})")
        if not METRICS[metric][2]:
            ax.set_yscale("log")
        ax.set_title(coll)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def preset_yaml(
    chosen: Setting, scores: Mapping[Setting, float | None], *, command: str, metric: str = "busbw"
) -> str:
    """A ``configs/rccl/`` option file: only the chosen knobs; comments say how it was measured."""
    head = [
        "# Generated by `python -m rocmtrain rccl-tests sweep` — measured, not folklore.",
        f"# date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"# command: {command}",
        f"# scores (geometric-mean {metric} speed-up vs unset; failed = a run failed):",
        *[f"#   {s.name}: {'failed' if v is None else f'{v:.3f}'}" for s, v in scores.items()],
        f"# chosen: {chosen.name}",
    ]
    cfg = chosen.config()
    body = {k: getattr(cfg, k) for k in ("protocol", "algorithm", "min_channels", "max_channels")
            if getattr(cfg, k) is not None}  # fmt: skip
    if not body:
        head.append(
            "# RCCL's own choice was best (or not beaten by the margin): this preset sets nothing."
        )
        return "\n".join(head) + "\n{}\n"
    return "\n".join(head) + "\n" + "".join(f"{k}: {json.dumps(v)}\n" for k, v in body.items())


def write_outputs(
    runs: Sequence[SweepRun],
    out_dir: Path,
    *,
    preset_name: str,
    command: str,
    score_min_bytes: int = 0,
    margin: float = 0.03,
    metric: str = "busbw",
) -> dict[str, Path]:
    """Write sweep.md, sweep.json, sweep.png and <preset_name>.yaml; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    scores = score(runs, score_min_bytes=score_min_bytes, metric=metric)
    chosen = choose(scores, margin=margin)
    paths = {"table": out_dir / "sweep.md", "json": out_dir / "sweep.json",
             "plot": out_dir / "sweep.png", "preset": out_dir / f"{preset_name}.yaml"}  # fmt: skip
    paths["table"].write_text(f"# rccl-tests sweep\n\n`{command}`\n\n{table_markdown(runs, scores, metric=metric)}"
                              f"\nchosen: **{chosen.name}**\n")  # fmt: skip
    paths["json"].write_text(json.dumps({
        "command": command, "chosen": asdict(chosen),
        "scores": [{"setting": asdict(s), "score": v} for s, v in scores.items()],
        "runs": [{"collective": r.collective, "setting": asdict(r.setting), "env": r.env,
                  "command": r.command, "ok": r.ok, "errors": r.errors,
                  "rows": [asdict(row) for row in r.rows]} for r in runs],
    }, indent=1))  # fmt: skip
    try:
        plot_png(runs, paths["plot"], metric=metric)
    except ImportError as exc:  # no matplotlib: the table, JSON and preset still count
        paths["plot"].with_suffix(".txt").write_text(f"no plot: {exc}; pip install matplotlib\n")
        del paths["plot"]
    paths["preset"].write_text(preset_yaml(chosen, scores, command=command, metric=metric))
    return paths
