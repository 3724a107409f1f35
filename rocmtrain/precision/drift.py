"""Model-level drift: the same seed and batches on two platforms → per-step loss and AUC differences.

    python -m rocmtrain precision-matrix --model-drift --out cpu.json                  # on the CPU
    python -m rocmtrain precision-matrix --model-drift --out gpu.json --compare cpu.json

:func:`run_model` trains a small DLRM-like model (4 embedding tables, bottom MLP, dot interaction, top
MLP; plain torch, so it runs anywhere) for N SGD steps. Weights and batches are generated on the
CPU with fixed generators and only then moved to the device, so both platforms start from bit-equal
weights and see bit-equal batches; labels come from a fixed random "teacher", so the AUC on a fixed
evaluation set means something. Stored: per-step loss, final eval loss and AUC.

:func:`compare` fails when a step's loss differs by more than ``threshold`` relative
(``|a - b| / |b|``) or the AUC by more than ``threshold`` absolute. fp32 on two platforms typically
drifts ~1e-6..1e-4 over 30 steps (different GEMM reduction orders); bf16 autocast more.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rocmtrain.precision.matrix_ops import dot_interaction

DEFAULT_STEPS = 30
DEFAULT_THRESHOLD = 1e-3
_TABLES = (200, 150, 100, 50)
_DENSE = 8
_D = 16
_BATCH = 128
_LR = 2.0


class TinyDLRM(nn.Module):
    """``dense_arch`` → [B, D]; ``embeddings`` → F × [B, D]; ``inter_arch`` dot → ``over_arch`` logit."""

    def __init__(self) -> None:
        super().__init__()
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(n, _D, mode="sum") for n in _TABLES)
        self.dense_arch = nn.Sequential(
            nn.Linear(_DENSE, 32), nn.ReLU(), nn.Linear(32, _D), nn.ReLU()
        )
        f1 = len(_TABLES) + 1
        self.over_arch = nn.Sequential(
            nn.Linear(_D + f1 * (f1 - 1) // 2, 32), nn.ReLU(), nn.Linear(32, 1)
        )

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """``dense`` [B, 8] float, ``sparse`` [B, F, 2] indices (2 ids per bag) → logits [B]."""
        d = self.dense_arch(dense)
        embs = [emb(sparse[:, f]) for f, emb in enumerate(self.embeddings)]
        x = torch.stack([d, *embs], dim=1)  # [B, F+1, D]
        z = dot_interaction(x)
        return self.over_arch(torch.cat([d, z.to(d.dtype)], dim=1)).squeeze(-1)


def _batches(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed + 1)
    w_dense = torch.randn(_DENSE, generator=g)
    w_sparse = [torch.randn(rows, generator=g) for rows in _TABLES]
    out = []
    for _ in range(n):
        dense = torch.randn(_BATCH, _DENSE, generator=g)
        sparse = torch.stack(
            [torch.randint(0, rows, (_BATCH, 2), generator=g) for rows in _TABLES], 1
        )
        logit = dense @ w_dense + sum(w[sparse[:, f]].sum(-1) for f, w in enumerate(w_sparse))
        labels = torch.bernoulli(torch.sigmoid(logit), generator=g)
        out.append((dense, sparse, labels))
    return out


def _init(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.1 if p.dim() > 1 else 0.01))


def _sgd_step(model: nn.Module, loss_scale: float) -> bool:
    """Plain SGD on ``grad / loss_scale`` (torch.optim would import torch._dynamo: +5 s on a small
    CPU); skips the step when a gradient is not finite (fp16 overflow). Returns whether it stepped."""
    params = [p for p in model.parameters() if p.grad is not None]
    if loss_scale != 1.0 and not all(bool(torch.isfinite(p.grad).all()) for p in params):
        return False
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-_LR / loss_scale)
    return True


def _autocast(device: str, dtype: torch.dtype | None):
    return torch.autocast(device, dtype=dtype) if dtype is not None else nullcontext()


def run_model(
    *, device: str = "cpu", steps: int = DEFAULT_STEPS, mode: str = "32", seed: int = 0
) -> dict[str, Any]:
    """Train :class:`TinyDLRM` for ``steps`` SGD steps; per-step loss, eval loss and AUC."""
    if steps < 1:
        raise ValueError(f"--drift-steps={steps} must be >= 1")
    model = TinyDLRM()
    _init(model, seed)
    model.to(device)
    amp = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(mode)
    loss_scale = 2.0**10 if mode == "16-mixed" else 1.0  # static fp16 loss scaling
    data = _batches(steps + 4, seed)
    losses = []
    for dense, sparse, labels in data[:steps]:
        dense, sparse, labels = dense.to(device), sparse.to(device), labels.to(device)
        with _autocast(device, amp):
            loss = F.binary_cross_entropy_with_logits(model(dense, sparse).float(), labels)
        model.zero_grad(set_to_none=True)
        (loss * loss_scale).backward()
        _sgd_step(model, loss_scale)
        losses.append(float(loss.detach()))
    model.eval()
    with torch.no_grad(), _autocast(device, amp):
        evals = data[steps:]
        logits = torch.cat([model(d.to(device), s.to(device)).float().cpu() for d, s, _ in evals])
    labels = torch.cat([y for _, _, y in evals])
    return {
        "model": "TinyDLRM",
        "mode": mode,
        "device": device,
        "seed": seed,
        "steps": steps,
        "loss": losses,
        "eval_loss": float(F.binary_cross_entropy_with_logits(logits, labels)),
        "auc": auc(logits, labels),
    }


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC by the rank-sum (Mann-Whitney) formula, ties counted half."""
    s = scores.double().reshape(-1)
    y = labels.reshape(-1) > 0.5
    pos, neg = int(y.sum()), int((~y).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    diff = s[y][:, None] - s[~y][None, :]
    return float(((diff > 0).double().sum() + 0.5 * (diff == 0).double().sum()) / (pos * neg))


def compare(
    new: dict[str, Any], base: dict[str, Any], *, threshold: float = DEFAULT_THRESHOLD
) -> list[str]:
    """Problems (empty = within ``threshold``); see the module docstring."""
    problems = []
    if new.get("mode") != base.get("mode") or new.get("steps") != base.get("steps"):
        problems.append(
            f"runs differ in setup (mode {base.get('mode')} vs {new.get('mode')}, steps "
            f"{base.get('steps')} vs {new.get('steps')}): rerun with the same --drift-mode/--drift-steps"
        )
        return problems
    rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(new["loss"], base["loss"], strict=True)]
    worst = max(range(len(rel)), key=rel.__getitem__)
    if rel[worst] > threshold:
        problems.append(f"loss drift {rel[worst]:.2e} at step {worst} > {threshold:.0e}")
    d_auc = abs(new["auc"] - base["auc"])
    if d_auc > threshold:
        problems.append(
            f"AUC drift {d_auc:.2e} ({base['auc']:.5f} -> {new['auc']:.5f}) > {threshold:.0e}"
        )
    return problems


def compare_lines(new: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """A short report: loss at a few steps, max relative loss drift, AUC both sides."""
    if new.get("steps") != base.get("steps"):
        return [f"steps differ ({base.get('steps')} vs {new.get('steps')})"]
    n = len(base["loss"])
    picks = sorted({0, n // 4, n // 2, n - 1})
    lines = [f"step {i:>3}: loss {base['loss'][i]:.6f} -> {new['loss'][i]:.6f}" for i in picks]
    rel = max(
        abs(a - b) / max(abs(b), 1e-12) for a, b in zip(new["loss"], base["loss"], strict=True)
    )
    lines.append(f"max relative loss drift over {n} steps: {rel:.2e}")
    lines.append(
        f"AUC {base['auc']:.6f} -> {new['auc']:.6f} (|d| {abs(new['auc'] - base['auc']):.2e})"
    )
    return lines


def format_summary(run: dict[str, Any]) -> str:
    return (
        f"model drift run ({run['model']}, mode {run['mode']}, {run['steps']} steps on {run['device']}): "
        f"loss {run['loss'][0]:.4f} -> {run['loss'][-1]:.4f}, eval loss {run['eval_loss']:.4f}, AUC {run['auc']:.4f}"
    )
