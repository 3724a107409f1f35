"""The recipe's dense step alone: is an fp8 GEMM or a compiled optimizer step worth building?

Times, at the recipe's shapes on one GPU (B = 65,536, DLRM-DCNv2: bottom MLP 13-512-256-128, a
3-layer low-rank (512) cross net over 27 x 128 features, top MLP 1024-1024-512-256-1):

- ``dense``: forward + backward of the three dense parts, each ``torch.compile``d as the recipe
  does (bf16 autocast, the cross net's residual stream in bf16), against the same with the GEMMs
  of the cross net and the top MLP in fp8 through torchao's float8 training
  (``tensorwise`` and ``rowwise`` recipes; the bottom MLP's 13-wide input and the 1-wide head
  stay bf16). Also the fp8 outputs' error against an fp64 reference next to bf16's.
- ``optim``: one Adagrad step over the dense parameters (fp32): ``foreach`` (the recipe's
  default), ``fused`` (where this torch has the kernel) and the step ``torch.compile``d.

Each variant's reading is the CUDA-event time of ``--steps`` back-to-back steps; ``--rounds``
rounds, in rotating order; median and min-max per variant, and per-round ratios. Needs a GPU and,
for the fp8 variants, torchao (skipped with a note when missing).

Command (H200)::

    PYTHONPATH=/tmp/site python3 scripts/bench/dense_levers.py --out $OUT/dense_levers.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torchrec.models.dlrm import DenseArch, OverArch
from torchrec.modules.crossnet import LowRankCrossNet

from rocmtrain.models.dlrm import AutocastResidualCrossNet

F, D, DENSE_IN = 26, 128, 13


class DenseStep(nn.Module):
    """Bottom MLP, concatenation with the pooled embeddings, cross net, top MLP: DLRM_DCN's
    dense work, given the pooled embeddings."""

    def __init__(self, low_rank: int = 512, layers: int = 3) -> None:
        super().__init__()
        self.dense_arch = DenseArch(DENSE_IN, [512, 256, D])
        crossnet = LowRankCrossNet((F + 1) * D, layers, low_rank)
        crossnet.__class__ = AutocastResidualCrossNet
        self.crossnet = crossnet
        self.over_arch = OverArch((F + 1) * D, [1024, 1024, 512, 256, 1])

    def parts(self) -> list[nn.Module]:
        return [self.dense_arch, self.crossnet, self.over_arch]

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        x = self.dense_arch(dense)
        x = torch.cat([x.unsqueeze(1).to(sparse.dtype), sparse], dim=1).flatten(1)
        return self.over_arch(self.crossnet(x)).squeeze(-1)


class Fp8CrossNet(AutocastResidualCrossNet):
    """The cross net with its two GEMMs per layer through torchao's float8 linear."""

    config = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        from torchao.float8.float8_linear import matmul_with_hp_or_float8_args

        dtype = torch.get_autocast_dtype(input.device.type)
        x_0 = input.to(dtype)
        x_l = x_0
        cfg, mm = self.config
        for layer in range(self._num_layers):
            v = matmul_with_hp_or_float8_args.apply(x_l, self.V_kernels[layer].t(), mm, cfg)
            w = matmul_with_hp_or_float8_args.apply(v, self.W_kernels[layer].t(), mm, cfg)
            x_l = x_0 * (w + self.bias[layer].to(dtype)) + x_l
        return x_l


def to_fp8(model: DenseStep, recipe: str) -> None:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    cfg = Float8LinearConfig.from_recipe_name(recipe)

    def big(mod: nn.Module, fqn: str) -> bool:
        return (
            isinstance(mod, nn.Linear)
            and mod.in_features % 16 == 0
            and mod.out_features % 16 == 0
        )

    convert_to_float8_training(model.over_arch, config=cfg, module_filter_fn=big)
    probe = Float8Linear.from_float(nn.Linear(16, 16), config=cfg)
    model.crossnet.__class__ = Fp8CrossNet
    model.crossnet.config = (cfg, probe.linear_mm_config)


def build(variant: str, device: torch.device) -> DenseStep:
    torch.manual_seed(0)
    model = DenseStep().to(device)
    if variant.startswith("fp8_"):
        to_fp8(model, variant.removeprefix("fp8_"))
    for part in model.parts():
        part.forward = torch.compile(part.forward, dynamic=False)
    return model


def batch(b: int, device: torch.device, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=device).manual_seed(seed)
    dense = torch.randn(b, DENSE_IN, device=device, generator=g)
    sparse = torch.randn(b, F, D, device=device, generator=g).to(torch.bfloat16)
    label = (torch.rand(b, device=device, generator=g) < 0.25).float()
    return dense, sparse.requires_grad_(), label


def dense_step(model: DenseStep, data: tuple[torch.Tensor, ...]) -> None:
    dense, sparse, label = data
    with torch.autocast("cuda", torch.bfloat16):
        logit = model(dense, sparse)
    loss = nn.functional.binary_cross_entropy_with_logits(logit.float(), label)
    loss.backward()
    for p in model.parameters():
        p.grad = None
    sparse.grad = None


def timed(fn: Callable[[], None], steps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


def rounds(fns: dict[str, Callable[[], None]], steps: int, n: int) -> dict[str, list[float]]:
    names = list(fns)
    out: dict[str, list[float]] = {k: [] for k in names}
    for r in range(n):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            out[name].append(timed(fns[name], steps))
    return out


def summary(readings: dict[str, list[float]], base: str) -> dict[str, dict]:
    res = {}
    for name, ms in readings.items():
        ratios = [b / m for b, m in zip(readings[base], ms, strict=True)]
        res[name] = {
            "ms_median": statistics.median(ms),
            "ms_min": min(ms),
            "ms_max": max(ms),
            "speedup_vs_" + base: {
                "median": statistics.median(ratios),
                "min": min(ratios),
                "max": max(ratios),
            },
            "readings_ms": ms,
        }
    return res


def output_error(models: dict[str, DenseStep], device: torch.device, b: int) -> dict[str, float]:
    """Relative L2 error of each variant's logits against the same weights in fp64."""
    dense, sparse, _ = batch(b, device, seed=7)
    ref_model = DenseStep().to(device)
    ref_model.load_state_dict(models["bf16"].state_dict())
    ref_model.crossnet.__class__ = LowRankCrossNet
    ref = ref_model.double()(dense.double(), sparse.double()).detach()
    err = {}
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        for name, model in models.items():
            out = model(dense, sparse.detach()).double()
            err[name] = float((out - ref).norm() / ref.norm())
    return err


def dense_bench(args: argparse.Namespace, device: torch.device) -> dict:
    variants = ["bf16"]
    try:
        import torchao  # noqa: F401

        variants += ["fp8_tensorwise", "fp8_rowwise"]
    except ImportError as exc:
        print(f"fp8 variants skipped: torchao missing ({exc})")
    models, fns = {}, {}
    for v in variants:
        models[v] = build(v, device)
        if v != "bf16":
            models[v].load_state_dict(models["bf16"].state_dict())
        sets = [batch(args.batch, device, seed=s) for s in range(3)]
        t0 = time.time()
        for i in range(3):
            dense_step(models[v], sets[i])
        torch.cuda.synchronize()
        print(f"{v}: compiled and warm in {time.time() - t0:.0f} s", flush=True)
        it = iter(range(10**9))
        fns[v] = lambda m=models[v], s=sets, it=it: dense_step(m, s[next(it) % len(s)])
    readings = rounds(fns, args.steps, args.rounds)
    return {
        "step": summary(readings, "bf16"),
        "rel_error_vs_fp64": output_error(models, device, 8192),
    }


def optim_bench(args: argparse.Namespace, device: torch.device) -> dict:
    params = [p.detach().clone().requires_grad_() for p in DenseStep().to(device).parameters()]
    fns = {}
    for impl in ("foreach", "fused", "compiled"):
        ps = [p.detach().clone().requires_grad_() for p in params]
        for p in ps:
            p.grad = torch.randn_like(p) * 1e-3
        kw = {"fused": True} if impl == "fused" else {"foreach": True}
        try:
            opt = torch.optim.Adagrad(ps, lr=0.005, **kw)
            step = torch.compile(opt.step) if impl == "compiled" else opt.step
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        except (RuntimeError, NotImplementedError) as exc:
            print(f"optim {impl}: skipped ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        fns[impl] = step
    n = sum(p.numel() for p in params)
    return {"params": n, "tensors": len(params), **summary(rounds(fns, 50, args.rounds), "foreach")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    device = torch.device("cuda")
    res = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "batch": args.batch,
        "optim": optim_bench(args, device),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    res["dense"] = dense_bench(args, device)
    args.out.write_text(json.dumps(res, indent=1))
    for part in ("optim", "dense"):
        rows = res[part].get("step", res[part])
        for name, r in rows.items():
            if isinstance(r, dict):
                s = next(v for k, v in r.items() if k.startswith("speedup"))
                print(
                    f"{part:6s} {name:16s} {r['ms_median']:8.3f} ms "
                    f"[{r['ms_min']:.3f}-{r['ms_max']:.3f}]  x{s['median']:.3f} "
                    f"[{s['min']:.3f}-{s['max']:.3f}]"
                )
    print("rel error vs fp64:", res["dense"]["rel_error_vs_fp64"])


if __name__ == "__main__":
    main()
