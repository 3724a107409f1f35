"""Summarise bench_e2e_gpu.sh stages into ``summary.md`` (markdown tables) and ``results.json``.

    python scripts/bench/e2e_summary.py --stages WORK/stages.jsonl --out OUT/e2e [--mode gpu]

``stages.jsonl``: one JSON object per stage (name, kind=anchor|rocmtrain, gpus, status, rc,
seconds, command, result=<json path>, run_dir). Anchor results come from
``e2e_torchrec_anchor.py --out``; rocmtrain results from ``<run_dir>/throughput.json``
(e2e_throughput.ThroughputCallback). Stage names encode the config:
``anchor_<n>gpu_<prec>`` / ``rt_<n>gpu_<kernel>_<prec>[_nopipe]``. Missing or failed stages are
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
NAME = re.compile(r"(anchor|rt)_(\d)gpu(?:_(fbgemm|triton|torch))?_(bf16|fp32)(_nopipe)?$")


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
        "pipeline": not (m and m.group(5)),
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
    by = {(r["impl"], r["gpus"], r["kernel"], r["precision"], r["pipeline"]): r for r in rows}
    for r in rows:
        anchor = by.get(("plain TorchRec", r["gpus"], "fbgemm", r["precision"], True))
        one = by.get((r["impl"], 1, r["kernel"], r["precision"], r["pipeline"]))
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
        if r["impl"] != "rocmtrain" or not r["samples_per_s"]:
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


def profile_excerpt(rows: list[dict[str, Any]], stages: list[dict[str, Any]], n: int = 20) -> str:
    for s in stages:
        if not s.get("run_dir"):
            continue
        md = Path(s["run_dir"]) / "profile" / "top_kernels_rank0.md"
        if md.is_file():
            lines = md.read_text().splitlines()
            return f"### Profile ({s['name']}, {md.name})\n\n" + "\n".join(lines[: n + 4]) + "\n"
    return ""


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
    prof = profile_excerpt(rows, stages)
    if prof:
        out += [prof]
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
