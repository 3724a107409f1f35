"""Summarise bench_e2e_gpu.sh stages into ``summary.md`` (markdown tables) and ``results.json``.

    python scripts/bench/e2e_summary.py --stages WORK/stages.jsonl --out OUT/e2e [--mode gpu]

``stages.jsonl``: one JSON object per stage (name, kind=anchor|rocmtrain, gpus, status, rc,
seconds, command, result=<json path>, run_dir). Anchor results come from
``e2e_torchrec_anchor.py --out``; rocmtrain results from ``<run_dir>/throughput.json``
(e2e_throughput.ThroughputCallback). Stage names encode the config:
``anchor_<n>gpu_<prec>`` / ``rt_<n>gpu_<kernel>_<prec>[_<variant>]`` (variants: ``nopipe`` = no
input pipeline, ``lean`` = optional callbacks off, ``fresh`` = new batches every step (the
convergence run)). Profiles (``<run_dir>/profile/step_timeline*.json``) and sync reports
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
NAME = re.compile(r"(anchor|rt)_(\d)gpu(?:_(fbgemm|triton|torch))?_(bf16|fp32)(?:_([a-z]+))?$")


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


def row_of(stage: dict[str, Any]) -> dict[str, Any]:
    """One table row: the stage plus its measured numbers (None where missing)."""
    m = NAME.match(stage["name"])
    row: dict[str, Any] = {
        "name": stage["name"],
        "impl": "plain TorchRec" if stage["kind"] == "anchor" else "rocmtrain",
        "gpus": stage.get("gpus"),
        "kernel": (m.group(3) if m and m.group(3) else "fbgemm"),
        "precision": m.group(4) if m else "?",
        "variant": (m.group(5) or "") if m else "",
        "pipeline": not (m and m.group(5) == "nopipe"),
        "status": stage.get("status"),
        "seconds": stage.get("seconds"),
        "command": stage.get("command"),
        "samples_per_s": None,
        "step_ms": None,
        "peak_mem_gib": None,
        "val_auc": [],
        "global_batch": None,
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
        )
        if row["status"] == "ok" and not doc.get("final"):
            row["status"] = "partial"
    return row


def _fmt_rate(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x / 1e6:.3f} M" if x >= 1e5 else f"{x:,.0f}"


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def annotate(rows: list[dict[str, Any]]) -> None:
    """vs-anchor ratio (same GPUs, precision) and 2-GPU scaling (same impl/kernel/precision)."""
    by = {(r["impl"], r["gpus"], r["kernel"], r["precision"], r["variant"]): r for r in rows}
    for r in rows:
        anchor = by.get(("plain TorchRec", r["gpus"], "fbgemm", r["precision"], ""))
        one = by.get((r["impl"], 1, r["kernel"], r["precision"], r["variant"]))
        rate = r["samples_per_s"]
        r["vs_anchor"] = (
            rate / anchor["samples_per_s"]
            if rate and anchor and anchor["samples_per_s"] and r["impl"] == "rocmtrain"
            else None
        )
        r["scaling"] = (
            rate / one["samples_per_s"]
            if rate and one and one["samples_per_s"] and r["gpus"] and r["gpus"] > 1
            else None
        )


def targets(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in rows:
        if r["impl"] != "rocmtrain" or not r["samples_per_s"] or r["variant"]:
            continue
        if r["gpus"] == 1:
            ok = r["samples_per_s"] >= TARGET_1GPU
            lines.append(
                f"- {r['name']}: {_fmt_rate(r['samples_per_s'])} samples/s vs 1.9 M target: "
                f"{'MET' if ok else 'missed'}; vs plain TorchRec "
                f"{_fmt(r['vs_anchor'], '.2f')}x (target >= 1.0x)"
            )
        elif r["scaling"] is not None:
            ok = r["scaling"] >= TARGET_SCALING
            lines.append(
                f"- {r['name']}: 2-GPU scaling {r['scaling']:.2f}x (target >= 1.85x): "
                f"{'MET' if ok else 'missed'}"
            )
    return lines


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


def sync_excerpt(stages: list[dict[str, Any]], n: int = 12) -> str:
    parts = []
    for s in stages:
        run = _run_dir(s)
        md = run / "syncs" / "syncs_rank0.md" if run else None
        if md is not None and md.is_file():
            body = md.read_text().split("\n## ")[0].splitlines()
            parts.append(f"### Sync report ({s['name']})\n\n" + "\n".join(body[: n + 4]))
    return "\n\n".join(parts) + "\n" if parts else ""


def render(rows: list[dict[str, Any]], stages, *, mode: str, env: str) -> str:
    out = [f"# End-to-end benchmark ({mode})", ""]
    if env:
        out += ["```", env.strip(), "```", ""]
    out += [
        "| stage | impl | GPUs | kernel | precision | pipeline | status | samples/s (median) "
        "| step ms | peak GiB | vs anchor | scaling | val AUC first→last "
        "| train AUC first→last | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        auc_s, train_s = (
            f"{a[0]:.4f}→{a[-1]:.4f}" if a else "—" for a in (r["val_auc"], r.get("train_auc"))
        )
        out.append(
            f"| {r['name']} | {r['impl']} | {r['gpus']} | {r['kernel']} | {r['precision']} | "
            f"{'sparse_dist' if r['pipeline'] else 'none'} | {r['status']} | "
            f"{_fmt_rate(r['samples_per_s'])} | {_fmt(r['step_ms'], '.2f')} | "
            f"{_fmt(r['peak_mem_gib'], '.1f')} | {_fmt(r['vs_anchor'], '.2f')} | "
            f"{_fmt(r['scaling'], '.2f')} | {auc_s} | {train_s} | {_fmt(r['seconds'], 'd')} |"
        )
    out += ["", "## Targets", ""] + (targets(rows) or ["- no rocmtrain result yet"]) + [""]
    out += ["## Commands", ""] + [f"- `{r['name']}`: `{r['command']}`" for r in rows] + [""]
    for extra in (profile_excerpt(stages), sync_excerpt(stages)):
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
    (args.out / "summary.md").write_text(render(rows, stages, mode=args.mode, env=env))
    (args.out / "results.json").write_text(json.dumps({"mode": args.mode, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
