"""Summarise bench_e2e_gpu.sh stages into ``summary.md`` (markdown tables) and ``results.json``.

    python scripts/bench/e2e_summary.py --stages WORK/stages.jsonl --out OUT/e2e [--mode gpu]

``stages.jsonl``: one JSON object per stage (name, kind=anchor|rocmtrain|swapin, gpus, status, rc,
seconds, command, result=<json path>, run_dir). Anchor results come from
``e2e_torchrec_anchor.py --out``; rocmtrain and swap-in results from ``<run_dir>/throughput.json``
(e2e_throughput.ThroughputCallback). Stage names encode the config:
``anchor_<n>gpu_<prec>[_<variant>]`` / ``rt_<n>gpu_<kernel>_<prec>[_<variant>]`` /
``swapin_<n>gpu_<prec>[_<variant>]``, then ``_r<k>`` for the k-th repeat of the same stage
(variants: ``compiled`` = anchor/swap-in with the DCN cross net compiled in place, ``base`` = the
dense levers off, ``densec``/``bf16res``/``embbf16``/``fusedopt`` = one lever on, ``nopipe`` = no input
pipeline, ``lean`` = optional callbacks off, ``fresh`` = new batches every step (the convergence
run)).

Repeats of a stage form a group (median, min-max). Every "vs anchor" figure is against the best
anchor of the run: the anchor group (same GPUs and precision, not a convergence run) with the
highest median rate; a group's ratio is given as its median over the best anchor's median and as
a lower bound, its slowest reading over the anchor's fastest. ``convergence.png``: train loss per
step and val AUC per epoch of the convergence runs (anchor and rocmtrain). Profiles (``<run_dir>/profile/step_timeline*.json``) and sync reports
(``<run_dir>/syncs/syncs_rank0.md``) of any stage are summarised too. Missing or failed stages are
listed with their status; the script never fails on partial data.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

TARGET_1GPU = 1.9e6  # samples/s: MLPerf Training v4.0 8xH200 DLRM-DCNv2 record, per GPU
TARGET_SCALING = 1.85
TARGET_VS_TUNED = 1.2  # rocmtrain 1 GPU vs the best (tuned) anchor, lower bound
TARGET_RATE = 2.5e6
TARGET_AUC_GAP = 0.003
TARGET_USER_CMD = 0.95  # the recipe run on its own vs the benchmark's recipe stage
TARGET_LOADER = 0.95  # a user's module with an ordinary DataLoader vs pre-staged batches
TARGET_FILES = 0.95  # the recipe from multi-hot files vs on its synthetic data
NAME = re.compile(
    r"(anchor|rt|swapin)_(\d)gpu(?:_(fbgemm|triton|torch))?_(bf16|fp32)(?:_([a-z0-9_]+))?$"
)
REPEAT = re.compile(r"^(.*)_r(\d+)$")
IMPL = {"anchor": "plain TorchRec", "rocmtrain": "rocmtrain", "swapin": "user module + strategy"}


def load_stages(path: Path) -> list[dict[str, Any]]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rows.append(json.loads(line))
    return rows


def _read_json(path: str | None) -> dict[str, Any] | None:
    if not path or not Path(path).is_file():
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def split_repeat(name: str) -> tuple[str, int]:
    """``rt_1gpu_fbgemm_bf16_r2`` -> (``rt_1gpu_fbgemm_bf16``, 2); no suffix = repeat 1."""
    m = REPEAT.match(name)
    return (m.group(1), int(m.group(2))) if m else (name, 1)


def row_of(stage: dict[str, Any]) -> dict[str, Any]:
    """One table row: the stage plus its measured numbers (None where missing)."""
    group, repeat = split_repeat(stage["name"])
    m = NAME.match(group)
    variant = (m.group(5) or "") if m else ""
    row: dict[str, Any] = {
        "name": stage["name"],
        "group": group,
        "repeat": repeat,
        "kind": stage["kind"],
        "impl": IMPL.get(stage["kind"], stage["kind"]),
        "gpus": stage.get("gpus"),
        "kernel": (m.group(3) if m and m.group(3) else "fbgemm"),
        "precision": m.group(4) if m else "?",
        "variant": variant,
        "pipeline": variant != "nopipe",
        "status": stage.get("status"),
        "seconds": stage.get("seconds"),
        "command": stage.get("command"),
        "samples_per_s": None,
        "step_ms": None,
        "peak_mem_gib": None,
        "val_auc": [],
        "global_batch": None,
        "host_step_ms": _host_step_ms(stage),
    }
    doc = _read_json(stage.get("result"))
    if doc is None:
        return row
    if stage["kind"] == "anchor":
        row.update(
            samples_per_s=doc.get("samples_per_s"),
            step_ms=doc.get("median_step_ms"),
            peak_mem_gib=doc.get("peak_mem_gib"),
            global_batch=doc.get("global_batch"),
            val_auc=[h["val_auc"] for h in doc.get("history", []) if "val_auc" in h],
            step_losses=doc.get("step_losses"),
        )
    else:
        peaks = doc.get("peak_mem_alloc_gib_per_rank") or []
        row.update(
            samples_per_s=doc.get("samples_per_s"),
            step_ms=doc.get("step_ms_median"),
            peak_mem_gib=max(peaks) if peaks else None,
            global_batch=doc.get("global_batch"),
            val_auc=[h["val_auc"] for h in doc.get("history", []) if "val_auc" in h],
            train_auc=[h["train_auc"] for h in doc.get("history", []) if "train_auc" in h],
            measured_steps=doc.get("measured_steps"),
            final=doc.get("final"),
            step_losses=doc.get("step_losses"),
        )
        if row["status"] == "ok" and not doc.get("final"):
            row["status"] = "partial"
    return row


def _host_step_ms(stage: dict[str, Any]) -> float | None:
    """The device monitor's host-side step time (p50 between batch starts, rank 0): about the
    device step when the GPU is the limit (the host waits on a full launch queue), below it when
    the host has slack; at or above it, the run is host-bound."""
    run = stage.get("run_dir")
    doc = _read_json(str(Path(run) / "monitor" / "step_stats.json")) if run else None
    return (doc or {}).get("stats", {}).get("step_time_p50_ms")


def _fmt_rate(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x / 1e6:.3f} M" if x >= 1e5 else f"{x:,.0f}"


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def groups(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Repeats of one stage: ``{group: {rates, median, min, max, n, peak_mem_gib, rows}}``."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        g = out.setdefault(r["group"], {"rows": [], "rates": [], "peaks": []})
        g["rows"].append(r)
        if r["samples_per_s"]:
            g["rates"].append(r["samples_per_s"])
        if r["peak_mem_gib"] is not None:
            g["peaks"].append(r["peak_mem_gib"])
    for g in out.values():
        rates = g["rates"]
        g.update(
            n=len(rates),
            median=_median(rates) if rates else None,
            min=min(rates) if rates else None,
            max=max(rates) if rates else None,
            peak_mem_gib=max(g["peaks"]) if g["peaks"] else None,
        )
    return out


def best_anchor(
    rows: list[dict[str, Any]], gpus: int | None, precision: str, grouped=None
) -> str | None:
    """The anchor group (same GPUs and precision, not a convergence run) of highest median."""
    grouped = grouped or groups(rows)
    names = {
        r["group"]
        for r in rows
        if r["kind"] == "anchor"
        and r["gpus"] == gpus
        and r["precision"] == precision
        and "fresh" not in r["variant"]
        and "loader" not in r["variant"]  # fed by a user's loader: the swap-in comparison's
    }
    names = [n for n in names if grouped[n]["median"]]
    return max(names, key=lambda n: grouped[n]["median"]) if names else None


def annotate(rows: list[dict[str, Any]]) -> None:
    """vs-anchor ratio (against the best anchor, same GPUs and precision) and 2-GPU scaling."""
    grouped = groups(rows)
    by = {(r["impl"], r["gpus"], r["kernel"], r["precision"], r["variant"]): r for r in rows}
    for r in rows:
        best = best_anchor(rows, r["gpus"], r["precision"], grouped)
        anchor = grouped[best]["median"] if best else None
        one = by.get((r["impl"], 1, r["kernel"], r["precision"], r["variant"]))
        rate = r["samples_per_s"]
        r["anchor"] = best
        r["vs_anchor"] = rate / anchor if rate and anchor and r["kind"] != "anchor" else None
        r["scaling"] = (
            rate / one["samples_per_s"]
            if rate and one and one["samples_per_s"] and r["gpus"] and r["gpus"] > 1
            else None
        )


def ratio(grouped: dict[str, dict[str, Any]], num: str, den: str | None) -> dict[str, Any] | None:
    """Median ratio and its lower bound (slowest ``num`` reading over fastest ``den`` reading)."""
    a, b = grouped.get(num), grouped.get(den) if den else None
    if not a or not b or not a["median"] or not b["median"]:
        return None
    return {
        "median": a["median"] / b["median"],
        "low": a["min"] / b["max"],
        "high": a["max"] / b["min"],
        "n": (a["n"], b["n"]),
    }


def paired(grouped: dict[str, dict[str, Any]], num: str, den: str) -> dict[str, Any] | None:
    """Per-round ratios ``num`` / ``den`` of the repeats run side by side (same repeat index, as
    the interleaved rounds run them): median, min, max, n."""
    if num not in grouped or den not in grouped:
        return None
    a, b = ({r["repeat"]: r["samples_per_s"] for r in grouped[g]["rows"] if r["samples_per_s"]}
            for g in (num, den))  # fmt: skip
    xs = [a[k] / b[k] for k in sorted(a.keys() & b.keys())]
    if not xs:
        return None
    return {"median": _median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _fmt_ratio(q: dict[str, Any] | None, digits: int = 2) -> str:
    if q is None:
        return "—"
    return (
        f"{q['median']:.{digits}f}x (lower bound {q['low']:.{digits}f}x, n={q['n'][0]}/{q['n'][1]})"
    )


def repeats_table(rows: list[dict[str, Any]]) -> list[str]:
    """Every stage group: readings, median, min-max, peak memory, ratio to the best anchor."""
    grouped = groups(rows)
    out = [
        "## Stage groups (repeats interleaved; ratios against the best anchor)",
        "",
        "| group | impl | n | samples/s median | min–max | peak GiB | vs best anchor: median "
        "| lower bound |",
        "|---|---|---:|---:|---|---:|---:|---:|",
    ]
    for name, g in grouped.items():
        r0 = g["rows"][0]
        best = best_anchor(rows, r0["gpus"], r0["precision"], grouped)
        q = ratio(grouped, name, best) if r0["kind"] != "anchor" else None
        out.append(
            f"| {name} | {r0['impl']} | {g['n']} | {_fmt_rate(g['median'])} | "
            f"{_fmt_rate(g['min'])}–{_fmt_rate(g['max'])} | {_fmt(g['peak_mem_gib'], '.1f')} | "
            f"{_fmt(q['median'] if q else None, '.2f')} | {_fmt(q['low'] if q else None, '.2f')} |"
        )
    anchors = [n for n, g in grouped.items() if g["rows"][0]["kind"] == "anchor"]
    best1 = best_anchor(rows, 1, "bf16", grouped)
    if anchors:
        out += ["", f"Best anchor (1 GPU, bf16): `{best1 or '—'}`."]
    return out + [""]


def _lever_lines(grouped: dict[str, dict[str, Any]]) -> list[str]:
    """Each dense lever on its own against ``_base`` (the levers off), all of them together, and
    the recipe against ``_nocg`` (its compiled parts without CUDA graphs)."""
    base, nocg, head = "rt_1gpu_fbgemm_bf16_base", "rt_1gpu_fbgemm_bf16_nocg", "rt_1gpu_fbgemm_bf16"
    out = []
    if base in grouped and grouped[base]["median"]:
        for name, what in (
            ("rt_1gpu_fbgemm_bf16_densec", "model.compile_dense=true"),
            ("rt_1gpu_fbgemm_bf16_embbf16", "model.embedding_output_dtype=bf16"),
            ("rt_1gpu_fbgemm_bf16_fusedopt", "model.dense_optimizer_impl=fused"),
            ("rt_1gpu_fbgemm_bf16_bf16res", "model.dcn_autocast_residual=true"),
            (head, "all together (the recipe)"),
        ):
            q = ratio(grouped, name, base)
            peak = grouped.get(name, {}).get("peak_mem_gib")
            out.append(
                f"- `{name}` ({what}): {_fmt_ratio(q)} vs base; peak {_fmt(peak, '.1f')} GiB "
                f"(base {_fmt(grouped[base]['peak_mem_gib'], '.1f')})"
            )
    if nocg in grouped and grouped[nocg]["median"]:
        out.append(
            f"- CUDA graphs (model.compile_mode=reduce-overhead): `{head}` "
            f"{_fmt_ratio(ratio(grouped, head, nocg))} vs `{nocg}` (without); peak "
            f"{_fmt(grouped.get(head, {}).get('peak_mem_gib'), '.1f')} vs "
            f"{_fmt(grouped[nocg]['peak_mem_gib'], '.1f')} GiB"
        )
    if not out:
        return []
    return ["## Dense levers (1 GPU, bf16; against `_base` = the levers off)", "", *out, ""]


#: stages that run the recipe with one of its step levers undone (or one more added), and what
#: each changes; the recipe's ratio against each is what that lever buys (below 1: the variant
#: is faster, a lever not (yet) in the recipe)
STEP_VARIANTS = (
    ("rt_1gpu_fbgemm_bf16_before", "its step levers undone (bounds check on, foreach Adagrad)"),
    ("rt_1gpu_fbgemm_bf16_boundson", "model.embedding_bounds_check=on"),
    ("rt_1gpu_fbgemm_bf16_optforeach", "model.dense_optimizer_impl=foreach"),
    ("rt_1gpu_fbgemm_bf16_ddpopt", "model.compile_ddp_optimizer=true (split at DDP's buckets)"),
    ("rt_1gpu_fbgemm_bf16_semi", "strategy.pipeline=semi_sync"),
    ("rt_1gpu_fbgemm_bf16_embfp16", "model.embedding_weight_dtype=fp16"),
    ("rt_1gpu_fbgemm_bf16_maxat", "model.compile_mode=max-autotune"),
)


def _step_variant_lines(grouped: dict[str, dict[str, Any]]) -> list[str]:
    """The recipe against each of its step variants run in the same rounds (median of the
    readings and the lower bound: the recipe's slowest over the variant's fastest)."""
    head = "rt_1gpu_fbgemm_bf16"
    out = [
        f"- `{head}` vs `{name}` ({what}): {_fmt_ratio(ratio(grouped, head, name), 3)}"
        for name, what in STEP_VARIANTS
        if name in grouped and grouped[name]["median"] and head in grouped
    ]
    if not out:
        return []
    return ["## Step levers (1 GPU, bf16; the recipe against each variant)", "", *out, ""]


def targets(rows: list[dict[str, Any]]) -> list[str]:
    grouped = groups(rows)
    lines = []
    for r in rows:
        if r["kind"] != "rocmtrain" or not r["samples_per_s"] or r["variant"] or r["repeat"] > 1:
            continue
        if r["gpus"] == 1:
            ok = r["samples_per_s"] >= TARGET_1GPU
            lines.append(
                f"- {r['name']}: {_fmt_rate(r['samples_per_s'])} samples/s vs 1.9 M target: "
                f"{'MET' if ok else 'missed'}; vs best anchor "
                f"{_fmt(r['vs_anchor'], '.2f')}x (target >= 1.0x)"
            )
        elif r["scaling"] is not None:
            ok = r["scaling"] >= TARGET_SCALING
            lines.append(
                f"- {r['name']}: 2-GPU scaling {r['scaling']:.2f}x (target >= 1.85x): "
                f"{'MET' if ok else 'missed'}"
            )
    head = "rt_1gpu_fbgemm_bf16"
    best = best_anchor(rows, 1, "bf16", grouped)
    q = ratio(grouped, head, best)
    if q is not None:
        g = grouped[head]
        ok = q["low"] >= TARGET_VS_TUNED and g["min"] >= TARGET_RATE
        lines.append(
            f"- {head} over {g['n']} repeats vs best anchor `{best}`: {_fmt_ratio(q)}; "
            f"median {_fmt_rate(g['median'])} (min {_fmt_rate(g['min'])}); target lower bound "
            f">= {TARGET_VS_TUNED}x and >= 2.5 M: {'MET' if ok else 'missed'}"
        )
        pa, pr = grouped[best]["peak_mem_gib"], g["peak_mem_gib"]
        if pa is not None and pr is not None:
            lines.append(
                f"- peak memory {head} {pr:.1f} GiB vs anchor {pa:.1f} GiB: "
                f"{'MET' if pr <= pa else 'missed'} (target <= the anchor's)"
            )
    for run, anchor in convergence_pairs(rows):  # same samples, seed and repeat
        a, b = anchor["val_auc"], run["val_auc"]
        if a and b:
            gap = b[-1] - a[-1]
            lines.append(
                f"- convergence ({run['name']} vs {anchor['name']}): final val AUC {b[-1]:.4f} vs "
                f"tuned anchor {a[-1]:.4f} (gap {gap:+.4f}; target within {TARGET_AUC_GAP}): "
                f"{'MET' if gap >= -TARGET_AUC_GAP else 'missed'}"
            )
    q = ratio(grouped, "rt_1gpu_triton_bf16", head)
    if q is not None:  # three digits: the two kernels' rates differ by tenths of a per cent
        p = paired(grouped, "rt_1gpu_triton_bf16", head)
        per_round = (
            f"; per round {p['median']:.3f}x [{p['min']:.3f}–{p['max']:.3f}] (n={p['n']})"
            if p
            else ""
        )
        lines.append(
            f"- kernel=triton vs kernel=fbgemm (`rt_1gpu_triton_bf16` vs `{head}`): "
            f"{_fmt_ratio(q, 3)}{per_round}; target lower bound (slowest over fastest) >= 1.0x: "
            f"{'MET' if q['low'] >= 1.0 else 'missed'}"
        )
    fresh = "rt_1gpu_fbgemm_bf16_fresh"  # the user's own command, run on its own
    q = ratio(grouped, fresh, head)
    if q is not None:
        lines.append(
            f"- the user's command (`{fresh}`) vs the recipe stage: median "
            f"{grouped[fresh]['median'] / grouped[head]['median']:.3f}x, {_fmt_ratio(q, 3)}; "
            f"target (its rate >= {TARGET_USER_CMD}x the stage's figure, the median): "
            f"{'MET' if grouped[fresh]['median'] >= TARGET_USER_CMD * grouped[head]['median'] else 'missed'}"
        )
    files = "rt_1gpu_fbgemm_bf16_multihot"
    q = ratio(grouped, files, head)
    if q is not None:
        lines.append(
            f"- the recipe from multi-hot files (`{files}`) vs on its shipped synthetic data: "
            f"{_fmt_ratio(q)}; target lower bound >= {TARGET_FILES}x: "
            f"{'MET' if q['low'] >= TARGET_FILES else 'missed'}"
        )
    for compiled in ("", "_compiled"):
        staged, loader = f"swapin_1gpu_bf16{compiled}", f"swapin_1gpu_bf16{compiled}_loader"
        anchor = f"anchor_1gpu_bf16{compiled}_loader"
        for num, den, target, what in (
            (loader, staged, TARGET_LOADER, "pre-staged batches"),
            (loader, anchor, 1.0, "plain TorchRec fed by the same DataLoader"),
        ):
            q = ratio(grouped, num, den)
            if q is not None:
                lines.append(
                    f"- {num} vs `{den}` ({what}): {_fmt_ratio(q)}; target lower bound >= "
                    f"{target}x: {'MET' if q['low'] >= target else 'missed'}"
                )
    return lines


def convergence_pairs(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(rocmtrain ``rt_1gpu_*_fresh[_rK]``, anchor ``anchor_1gpu_*_fresh[_rK]``) of each repeat K:
    the convergence runs on the same samples (a repeat may use another seed on both sides)."""
    ours = {r["repeat"]: r for r in rows
            if r["kind"] == "rocmtrain" and r["variant"] == "fresh" and r["gpus"] == 1}
    theirs = {r["repeat"]: r for r in rows
              if r["kind"] == "anchor" and "fresh" in r["variant"] and r["gpus"] == 1}  # fmt: skip
    return [(ours[k], theirs[k]) for k in sorted(ours.keys() & theirs.keys())]


def convergence(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """The convergence runs: the anchor's (``anchor_*_fresh``), rocmtrain's recipe
    (``rt_*_fresh``) and any rocmtrain variant (``rt_*_<variant>_fresh``, keyed by its name)."""
    found: dict[str, dict[str, Any] | None] = {"anchor": None, "rocmtrain": None}
    for r in rows:
        if "fresh" not in r["variant"] or r["gpus"] != 1:
            continue
        if r["kind"] == "anchor":
            found["anchor"] = r
        elif r["kind"] == "rocmtrain":
            found["rocmtrain" if r["variant"] == "fresh" else r["name"]] = r
    return found


def plot_convergence(rows: list[dict[str, Any]], path: Path) -> str:
    """Train loss per step and val AUC per epoch of both convergence runs -> ``path`` (PNG)."""
    conv = {k: v for k, v in convergence(rows).items() if v}
    if not conv:
        return ""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return "(matplotlib missing: no convergence.png)"
    fig = Figure(figsize=(11, 4))
    FigureCanvasAgg(fig)
    ax_loss, ax_auc = fig.subplots(1, 2)
    for r in conv.values():
        label = f"{r['impl']} ({r['name']})"
        losses = r.get("step_losses") or []
        if losses:
            k = max(1, min(10, len(losses) // 10))  # running mean over k steps
            smooth = [sum(losses[max(0, i - k + 1) : i + 1]) / len(losses[max(0, i - k + 1) : i + 1])
                      for i in range(len(losses))]  # fmt: skip
            ax_loss.plot(range(1, len(losses) + 1), smooth, label=label)
        if r["val_auc"]:
            ax_auc.plot(range(1, len(r["val_auc"]) + 1), r["val_auc"], marker="o", label=label)
    ax_loss.set(xlabel="step", ylabel="train loss (BCE, running mean)", title="train loss")
    ax_auc.set(xlabel="epoch", ylabel="val AUC", title="val AUC after each epoch")
    ax_auc.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (ax_loss, ax_auc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return f"![convergence]({path.name})"


def _run_dir(stage: dict[str, Any]) -> Path | None:
    if stage.get("run_dir"):
        return Path(stage["run_dir"])
    result = stage.get("result")  # anchors: WORK/NAME.json, profile in WORK/runs/NAME/profile
    return Path(result).parent / "runs" / stage["name"] if result else None


def profile_excerpt(stages: list[dict[str, Any]], n: int = 20) -> str:
    """Step timelines of every profiled stage, then the top kernels of each."""
    out, tables = [], []
    for s in stages:
        run = _run_dir(s)
        if run is None:
            continue
        prof = run / "profile"
        for tl in sorted(prof.glob("step_timeline*.json")):
            t = _read_json(str(tl)) or {}
            busy, wall = t.get("mean_device_busy_ms"), t.get("mean_wall_ms")
            out.append(
                f"| {s['name']} | {_fmt(wall, '.2f')} | {_fmt(busy, '.2f')} | "
                f"{_fmt(100 * busy / wall if busy and wall else None, '.0f')} | "
                f"{_fmt(t.get('mean_host_sync_calls'), '.1f')} |"
            )
        for md in sorted(prof.glob("top_kernels*.md")):
            lines = md.read_text().splitlines()
            tables.append(f"### Profile ({s['name']}, {md.name})\n\n" + "\n".join(lines[: n + 6]))
    if not out and not tables:
        return ""
    head = [
        "## Step timeline (torch.profiler, 3 recorded steps inside the warm-up)",
        "",
        "| stage | wall ms/step | GPU busy ms/step | GPU busy % | blocking sync calls/step |",
        "|---|---:|---:|---:|---:|",
    ]
    return "\n".join(head + out) + "\n\n" + "\n\n".join(tables) + "\n"


def op_diff(stages: list[dict[str, Any]], n: int = 15) -> str:
    """Per-step calls and self time of every kernel, rocmtrain's first profiled stage minus the
    anchor's: the ops with the largest time difference (what one run does that the other does not)."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for s in stages:
        run = _run_dir(s)
        if run is None or s.get("kind") not in ("anchor", "rocmtrain") or s["kind"] in found:
            continue
        for path in sorted((run / "profile").glob("op_counts*.json")):
            doc = _read_json(str(path))
            if doc:
                found[s["kind"]] = (s["name"], doc)
                break
    if len(found) < 2:
        return ""
    (rt_name, rt), (an_name, an) = found["rocmtrain"], found["anchor"]
    zero = {"calls": 0.0, "self_ms": 0.0}
    rows = []
    for op in set(rt) | set(an):
        a, b = an.get(op, zero), rt.get(op, zero)
        rows.append((b["self_ms"] - a["self_ms"], b["calls"] - a["calls"], op, a, b))
    rows.sort(key=lambda r: -abs(r[0]))
    total = sum(r[0] for r in rows)
    out = [
        f"### Per-step difference: `{rt_name}` minus `{an_name}` (net {total:+.2f} ms)",
        "",
        "| op | Δ ms/step | Δ calls/step | anchor ms (calls) | rocmtrain ms (calls) |",
        "|---|---:|---:|---:|---:|",
    ]
    for d_ms, d_calls, op, a, b in rows[:n]:
        name = op.replace("|", "\\|")
        name = name if len(name) <= 80 else name[:77] + "..."
        out.append(
            f"| `{name}` | {d_ms:+.3f} | {d_calls:+.1f} | {a['self_ms']:.3f} ({a['calls']:.1f}) | "
            f"{b['self_ms']:.3f} ({b['calls']:.1f}) |"
        )
    return "\n".join(out) + "\n"


def sync_excerpt(stages: list[dict[str, Any]], n: int = 12) -> str:
    parts = []
    for s in stages:
        run = _run_dir(s)
        md = run / "syncs" / "syncs_rank0.md" if run else None
        if md is not None and md.is_file():
            body = md.read_text().split("\n## ")[0].splitlines()
            parts.append(f"### Sync report ({s['name']})\n\n" + "\n".join(body[: n + 4]))
    return "\n\n".join(parts) + "\n" if parts else ""


def render(rows: list[dict[str, Any]], stages, *, mode: str, env: str, plot: str = "") -> str:
    out = [f"# End-to-end benchmark ({mode})", ""]
    if env:
        out += ["```", env.strip(), "```", ""]
    out += [
        "| stage | impl | GPUs | kernel | precision | pipeline | status | samples/s (median) "
        "| step ms | host step ms (p50) | peak GiB | vs anchor | scaling | val AUC first→last "
        "| train AUC first→last | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        auc_s, train_s = (
            f"{a[0]:.4f}→{a[-1]:.4f}" if a else "—" for a in (r["val_auc"], r.get("train_auc"))
        )
        out.append(
            f"| {r['name']} | {r['impl']} | {r['gpus']} | {r['kernel']} | {r['precision']} | "
            f"{'sparse_dist' if r['pipeline'] else 'none'} | {r['status']} | "
            f"{_fmt_rate(r['samples_per_s'])} | {_fmt(r['step_ms'], '.2f')} | "
            f"{_fmt(r['host_step_ms'], '.2f')} | {_fmt(r['peak_mem_gib'], '.1f')} | {_fmt(r['vs_anchor'], '.2f')} | "
            f"{_fmt(r['scaling'], '.2f')} | {auc_s} | {train_s} | {_fmt(r['seconds'], 'd')} |"
        )
    out += [""] + repeats_table(rows) + _lever_lines(groups(rows))
    out += _step_variant_lines(groups(rows))
    out += ["## Targets", ""] + (targets(rows) or ["- no rocmtrain result yet"]) + [""]
    if plot:
        out += ["## Convergence (new batches every step; same seed and samples)", "", plot, ""]
    out += ["## Commands", ""] + [f"- `{r['name']}`: `{r['command']}`" for r in rows] + [""]
    for extra in (profile_excerpt(stages), op_diff(stages), sync_excerpt(stages)):
        if extra:
            out += [extra]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--mode", default="gpu")
    p.add_argument("--env", type=Path, default=None)
    args = p.parse_args(argv)
    stages = load_stages(args.stages)
    rows = [row_of(s) for s in stages]
    annotate(rows)
    env = args.env.read_text() if args.env and args.env.is_file() else ""
    args.out.mkdir(parents=True, exist_ok=True)
    plot = plot_convergence(rows, args.out / "convergence.png")
    (args.out / "summary.md").write_text(render(rows, stages, mode=args.mode, env=env, plot=plot))
    (args.out / "results.json").write_text(json.dumps({"mode": args.mode, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
