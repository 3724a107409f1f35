"""A chaos run against its uninterrupted reference, bit for bit (``scripts/chaos.py``).

- the final checkpoint: every tensor of the DCP shards (tables, dense parameters, the fused
  embedding optimizer state) and of each rank's own part (dense optimizer state, data position,
  RNG state, step, epoch), compared as raw bytes;
- the per-step record each rank's checkpoint carries (``DLRMModule.run_step_losses``: the loss
  and the label sum of every step of the run, each from the attempt the run continued from);
- every per-step row (loss, grad norms) any attempt wrote to ``metrics*.csv``, recomputed steps
  included: a step trained twice must give the same bits both times.
"""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path
from typing import Any

#: each rank's own part: what must be equal (Lightning's loop counters also count restarts)
PER_RANK_KEYS = ("global_step", "epoch", "optimizer_states", "RecDataModule", "rng")
#: per-step CSV columns compared (as written: the shortest repr of each float)
CSV_COLUMNS = ("loss", "grad_norm/total", "grad_norm/dense_arch", "grad_norm/over_arch")


def final_checkpoint(root: Path) -> Path:
    from rocmtrain import checkpoint as ckpt

    done = [p for p in ckpt.list_checkpoints(root) if ckpt.is_complete(p)]
    if not done:
        raise FileNotFoundError(f"no complete checkpoint under {root}")
    return done[-1]


def dcp_tensors(path: Path) -> dict[str, Any]:
    """The DCP part of checkpoint ``path`` as one flat ``{key: tensor or value}``, no process
    group needed."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "state.pt"
        dcp_to_torch_save(str(path), str(out))
        return flatten(torch.load(out, weights_only=False))


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}/"))
        return out
    if isinstance(tree, (list, tuple)):
        out = {}
        for i, v in enumerate(tree):
            out.update(flatten(v, f"{prefix}{i}/"))
        return out
    return {prefix.rstrip("/"): tree}


def same_bits(a: Any, b: Any) -> bool:
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.reshape(-1).view(torch.uint8).equal(b.reshape(-1).view(torch.uint8))
        )
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, float) and isinstance(b, float):
        return a.hex() == b.hex()
    return type(a) is type(b) and a == b


def differences(ref: dict[str, Any], got: dict[str, Any]) -> list[str]:
    keys = sorted(set(ref) | set(got))
    return [k for k in keys if k not in ref or k not in got or not same_bits(ref[k], got[k])]


def per_rank(path: Path, rank: int) -> dict[str, Any]:
    import torch

    return torch.load(path / f"rank_{rank}.pt", map_location="cpu", weights_only=False)


def step_record(part: dict[str, Any]) -> dict[str, list[float]]:
    from rocmtrain.models.module import DLRMModule

    return part.get(DLRMModule.STEP_RECORD_KEY) or {}


def csv_rows(run_dir: Path) -> list[dict[str, str]]:
    rows = []
    for f in sorted((run_dir / "logs").glob("metrics*.csv")):
        with open(f) as fh:
            rows += [r for r in csv.DictReader(fh) if r.get("loss")]
    return rows


def compare_csv(ref_dir: Path, run_dir: Path) -> dict[str, Any]:
    ref = {r["step"]: r for r in csv_rows(ref_dir)}
    rows = csv_rows(run_dir)
    bad = [
        f"step {r['step']} {c}: {r.get(c)} != {ref.get(r['step'], {}).get(c)}"
        for r in rows
        for c in CSV_COLUMNS
        if r.get(c) != ref.get(r["step"], {}).get(c)
    ]
    missing = sorted(set(ref) - {r["step"] for r in rows}, key=int)
    return dict(
        rows=len(rows),
        steps=len({r["step"] for r in rows}),
        ref_steps=len(ref),
        mismatches=bad[:20] + [f"step {s}: no row in any attempt's metrics" for s in missing[:20]],
    )


def compare_runs(ref_root: Path, run_root: Path, ref_dir: Path, run_dir: Path) -> dict[str, Any]:
    ref_ck, run_ck = final_checkpoint(ref_root), final_checkpoint(run_root)
    problems: list[str] = []
    if ref_ck.name != run_ck.name:
        problems.append(f"final checkpoints differ: {ref_ck.name} vs {run_ck.name}")
    ref_t, run_t = dcp_tensors(ref_ck), dcp_tensors(run_ck)
    problems += [f"shards: {k}" for k in differences(ref_t, run_t)]
    steps = []
    for rank in (0, 1):
        a, b = per_rank(ref_ck, rank), per_rank(run_ck, rank)
        pick = lambda d: flatten({k: d.get(k) for k in PER_RANK_KEYS})  # noqa: E731
        problems += [f"rank {rank}: {k}" for k in differences(pick(a), pick(b))]
        ra, rb = step_record(a), step_record(b)
        steps.append(len(rb.get("loss", ())))
        for series in ("loss", "label_sum"):
            x, y = ra.get(series, []), rb.get(series, [])
            if len(x) != len(y) or any(not same_bits(p, q) for p, q in zip(x, y, strict=False)):
                first = next(
                    (i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q),
                    min(len(x), len(y)),
                )
                problems.append(
                    f"rank {rank} per-step {series}: {len(y)} vs {len(x)} steps, "
                    f"first difference at step {first}"
                )
    rows = compare_csv(ref_dir, run_dir)
    problems += rows["mismatches"]
    summary = (
        f"final {run_ck.name}: {len(run_t)} shard entries, per-rank state and per-step loss of "
        f"{steps} steps (ranks 0, 1); {rows['rows']} logged loss/grad-norm rows over "
        f"{rows['steps']}/{rows['ref_steps']} steps: "
        + ("all equal bit for bit" if not problems else f"{len(problems)} DIFFERENCES")
    )
    return dict(identical=not problems, summary=summary, problems=problems[:50], csv=rows)
