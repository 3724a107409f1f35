"""``python -m rocmtrain precision-matrix``: per-op error vs fp64 on this platform, and comparisons.

    python -m rocmtrain precision-matrix --device cpu --out cpu.json --png cpu.png
    python -m rocmtrain precision-matrix --device cuda --out rocm.json --compare cuda.json
    python -m rocmtrain precision-matrix --model-drift --out rocm.json      # + small-DLRM loss/AUC run
    python -m rocmtrain precision-matrix --compare a.json --against b.json  # two saved runs, no run

Ops (exp, log1p, sqrt, rsqrt, sigmoid, tanh, softmax, layer_norm, matmul, embedding-bag sum, DLRM dot
interaction) × dtypes (fp16, bf16, fp32, and tf32 = TF32/XF32 GEMMs where the GPU has them) on fixed
seeded inputs; metrics in :mod:`rocmtrain.precision.matrix_ops`. Output: a printed table, a JSON
(``--out``, with the platform: backend, arch, torch/HIP/CUDA versions) and a PNG heatmap of
log10(max_rel) (``--png``).

``--compare BASELINE.json`` exits 1 and lists every (op, dtype) whose ``max_rel`` or ``mean_rel`` grew
past BOTH thresholds: ``new > --threshold × baseline`` (ratio, default 1.5) AND
``new - baseline > --abs-floor × eps(dtype)`` (default 0.25 machine epsilon of the tested dtype). The
ratio catches real regressions; the floor stops noise from flagging (1e-8 → 3e-8 in fp32 is a 3x
"growth" of nothing). The defaults are tight enough to flag an fp16 ``exp`` that went from correctly
rounded (max_rel ≈ 0.5 eps) to 1-ULP accurate (≈ 1 eps): the kind of per-op difference that adds up. Pairs present in only one file are listed as not compared. With ``--model-drift`` in both
files the per-step loss and final AUC are compared too (:mod:`rocmtrain.precision.drift`).
Exit codes: 0 ok, 1 regressions or drift, 2 usage errors.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from rocmtrain import exit_codes, platform
from rocmtrain.precision import drift, state
from rocmtrain.precision.capabilities import current_capabilities
from rocmtrain.precision.matrix_ops import DTYPES, EPS, OPS, run_op
from rocmtrain.precision.numerics import platform_summary

SCHEMA = 1


@contextmanager
def _matmul_mode(tf32: bool):
    """fp32 GEMMs exact (``highest``) or TF32/XF32 (``high``); restores every flag afterwards."""
    snap = state.snapshot()
    try:
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        torch.backends.cuda.matmul.allow_tf32 = tf32
        yield
    finally:
        state.restore(snap)


def available_dtypes(device: str) -> list[str]:
    """fp16, bf16, fp32, plus tf32 on a GPU with TF32/XF32 hardware."""
    names = ["fp16", "bf16", "fp32"]
    if device != "cpu" and current_capabilities().xf32:
        names.append("tf32")
    return names


def run_matrix(
    *, device: str = "cpu", seed: int = 0, ops: list[str] | None = None
) -> dict[str, Any]:
    """The matrix as a JSON-ready dict: ``results[op][dtype] = metrics``."""
    selected = [op for op in OPS if ops is None or op.name in ops]
    results: dict[str, dict[str, dict[str, float]]] = {}
    for op in selected:
        row: dict[str, dict[str, float]] = {}
        for name in available_dtypes(device):
            if name == "tf32" and not op.gemm:
                continue
            with _matmul_mode(tf32=name == "tf32"):
                row[name] = run_op(op, name, device=device, seed=seed)
        results[op.name] = row
    return {
        "schema": SCHEMA,
        "kind": "precision-matrix",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "seed": seed,
        "platform": platform_summary(device),
        "results": results,
    }


def format_table(doc: dict[str, Any]) -> str:
    """max_rel / max_ulp per op and dtype as a fixed-width table."""
    dtypes = sorted({d for row in doc["results"].values() for d in row}, key=list(DTYPES).index)
    head = f"{'op':<20}" + "".join(f"{d + ' max_rel':>16}{'ulp':>9}" for d in dtypes)
    lines = [
        f"precision matrix on {doc['platform'].get('backend')} {doc['platform'].get('arch')} "
        f"(torch {doc['platform'].get('torch')})",
        head,
        "-" * len(head),
    ]
    for op, row in doc["results"].items():
        cells = ""
        for d in dtypes:
            m = row.get(d)
            cells += f"{m['max_rel']:>16.3e}{m['max_ulp']:>9.2f}" if m else f"{'-':>16}{'-':>9}"
        lines.append(f"{op:<20}{cells}")
    return "\n".join(lines)


def write_png(doc: dict[str, Any], path: Path) -> None:
    """Heatmap of log10(max_rel), ops × dtypes, annotated with the values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(doc["results"])
    dtypes = sorted({d for row in doc["results"].values() for d in row}, key=list(DTYPES).index)
    grid = [[math.nan] * len(dtypes) for _ in ops]
    for i, op in enumerate(ops):
        for j, d in enumerate(dtypes):
            m = doc["results"][op].get(d)
            if m and m["max_rel"] > 0 and math.isfinite(m["max_rel"]):
                grid[i][j] = math.log10(m["max_rel"])
    fig, ax = plt.subplots(figsize=(1.6 * len(dtypes) + 3, 0.45 * len(ops) + 1.5))
    im = ax.imshow(grid, cmap="viridis", aspect="auto")
    vals = [v for row in grid for v in row if not math.isnan(v)] or [0.0]
    lo, hi = min(vals), max(vals)
    ax.set_xticks(range(len(dtypes)), dtypes)
    ax.set_yticks(range(len(ops)), ops)
    for i in range(len(ops)):
        for j in range(len(dtypes)):
            if not math.isnan(grid[i][j]):
                dark = grid[i][j] < (lo + hi) / 2
                ax.text(
                    j,
                    i,
                    f"{10 ** grid[i][j]:.1e}",
                    ha="center",
                    va="center",
                    color="w" if dark else "k",
                    fontsize=7,
                )
    p = doc["platform"]
    ax.set_title(
        f"max rel. error vs fp64 — {p.get('backend')} ({p.get('device')}, {p.get('arch')}), torch {p.get('torch')}",
        fontsize=9,
    )
    fig.colorbar(im, ax=ax, label="log10(max_rel)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compare(
    new: dict[str, Any], base: dict[str, Any], *, threshold: float = 1.5, abs_floor: float = 0.25
) -> tuple[list[str], list[str], list[str]]:
    """(regressions, fine, not_compared) as human-readable lines; see the module docstring."""
    bad: list[str] = []
    ok: list[str] = []
    missing: list[str] = []
    ops = list(dict.fromkeys([*base.get("results", {}), *new.get("results", {})]))
    for op in ops:
        b_row = base.get("results", {}).get(op, {})
        n_row = new.get("results", {}).get(op, {})
        for d in dict.fromkeys([*b_row, *n_row]):
            if d not in b_row or d not in n_row:
                missing.append(f"{op}/{d}: only in {'baseline' if d in b_row else 'new run'}")
                continue
            grown = []
            for metric in ("max_rel", "mean_rel"):
                b, n = float(b_row[d][metric]), float(n_row[d][metric])
                floor = abs_floor * EPS.get(d, 2.0**-23)
                if (n > threshold * b and n - b > floor) or (math.isinf(n) and not math.isinf(b)):
                    ratio = n / b if b > 0 else math.inf
                    grown.append(f"{metric} {b:.3e} -> {n:.3e} (x{ratio:.1f})")
            line = f"{op}/{d}: " + (
                "; ".join(grown)
                if grown
                else f"max_rel {b_row[d]['max_rel']:.3e} -> {n_row[d]['max_rel']:.3e}"
            )
            (bad if grown else ok).append(line)
    return bad, ok, missing


def _load(path: str) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:  # ValueError: bad JSON, or bytes that are not UTF-8
        raise SystemExit(f"precision-matrix: cannot read {path}: {e}") from e
    if not isinstance(doc, dict) or doc.get("kind") != "precision-matrix" or "results" not in doc:
        raise SystemExit(f"precision-matrix: {path} is not a precision-matrix JSON (no 'results')")
    return doc


def _output_problem(out: str | None, png: str | None) -> str | None:
    """Why ``--out`` / ``--png`` cannot be written (None when both can): found before the run.
    matplotlib would add ``.png`` to a name without it, so a PNG must be named as one."""
    if png and Path(png).suffix.lower() != ".png":
        return (
            f"--png {png} is not a .png file name"
            + (" (it is a folder)" if Path(png).is_dir() else "")
            + f"; name the image, e.g. --png {Path(png) / 'precision-matrix.png'}"
        )
    for flag, name in (("--out", out), ("--png", png)):
        if not name:
            continue
        path = Path(name)
        existed = path.exists()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a"):
                pass
        except OSError as e:
            return f"{flag} {name}: cannot write there ({e.strerror}); choose a writable path"
        if not existed:
            path.unlink()
    return None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rocmtrain precision-matrix", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="default: cuda if a GPU is visible, else cpu",
    )
    p.add_argument("--out", help="write the JSON here")
    p.add_argument("--png", help="write a heatmap PNG here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ops", help="comma list of ops (default: all)")
    p.add_argument(
        "--compare", metavar="BASELINE.json", help="compare against this run; exit 1 on regressions"
    )
    p.add_argument(
        "--against",
        metavar="NEW.json",
        help="with --compare: compare this saved run instead of running",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=1.5,
        help="error growth ratio that fails (default %(default)s)",
    )
    p.add_argument(
        "--abs-floor",
        type=float,
        default=0.25,
        help="growth must also exceed this many eps(dtype) (default %(default)s)",
    )
    p.add_argument(
        "--model-drift",
        action="store_true",
        help="also run the small DLRM model and store per-step loss/AUC",
    )
    p.add_argument("--drift-steps", type=int, default=drift.DEFAULT_STEPS)
    p.add_argument("--drift-mode", choices=("32", "bf16-mixed", "16-mixed"), default="32")
    p.add_argument(
        "--drift-threshold",
        type=float,
        default=drift.DEFAULT_THRESHOLD,
        help="max relative loss drift per step (default %(default)s)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry (``rocmtrain.__main__`` dispatches ``precision-matrix`` here)."""
    args = _parser().parse_args(argv)
    if args.threshold <= 1.0 or args.abs_floor < 0:
        print("precision-matrix: --threshold must be > 1 and --abs-floor >= 0", file=sys.stderr)
        return exit_codes.USAGE
    if args.against and not args.compare:
        print("precision-matrix: --against needs --compare BASELINE.json", file=sys.stderr)
        return exit_codes.USAGE
    # the baseline and the output paths are checked before the matrix runs, not after it
    base = _load(args.compare) if args.compare else None
    problem = _output_problem(args.out, args.png)
    if problem:
        print(f"precision-matrix: {problem}", file=sys.stderr)
        return exit_codes.USAGE
    if args.against:
        doc = _load(args.against)
    else:
        device = args.device or ("cuda" if platform.has_gpu() else "cpu")
        if device == "cuda" and not platform.has_gpu():
            print(
                "precision-matrix: --device cuda but no GPU is visible; use --device cpu",
                file=sys.stderr,
            )
            return exit_codes.USAGE
        ops = args.ops.split(",") if args.ops else None
        unknown = sorted(set(ops or []) - {op.name for op in OPS})
        if unknown:
            print(
                f"precision-matrix: unknown op(s) {unknown}; known: {[op.name for op in OPS]}",
                file=sys.stderr,
            )
            return exit_codes.USAGE
        doc = run_matrix(device=device, seed=args.seed, ops=ops)
        if args.model_drift:
            doc["model_drift"] = drift.run_model(
                device=device, steps=args.drift_steps, mode=args.drift_mode, seed=args.seed
            )
        doc["command"] = "python -m rocmtrain precision-matrix " + " ".join(argv or [])
    print(format_table(doc))
    if "model_drift" in doc:
        print(drift.format_summary(doc["model_drift"]))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    if args.png:
        write_png(doc, Path(args.png))
        print(f"wrote {args.png}")
    if base is None:
        return exit_codes.OK
    bad, ok, missing = compare(doc, base, threshold=args.threshold, abs_floor=args.abs_floor)
    bp, np_ = base["platform"], doc["platform"]
    print(
        f"\ncompare {bp.get('backend')}/{bp.get('arch')} (baseline {args.compare}) -> "
        f"{np_.get('backend')}/{np_.get('arch')}: threshold x{args.threshold}, floor {args.abs_floor} eps"
    )
    for line in missing:
        print(f"  not compared  {line}")
    drift_bad: list[str] = []
    if "model_drift" in doc and "model_drift" in base:
        drift_bad = drift.compare(
            doc["model_drift"], base["model_drift"], threshold=args.drift_threshold
        )
        for line in drift.compare_lines(doc["model_drift"], base["model_drift"]):
            print(f"  drift         {line}")
    if bad or drift_bad:
        print(
            f"FAIL: {len(bad)} op/dtype pair(s) got worse"
            + (f", model drift: {'; '.join(drift_bad)}" if drift_bad else "")
        )
        for line in bad:
            print(f"  REGRESSION    {line}")
        return exit_codes.FAILURE
    print(f"OK: {len(ok)} op/dtype pair(s) within threshold")
    return exit_codes.OK
