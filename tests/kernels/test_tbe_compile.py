"""The Triton kernels compile for NVIDIA sm_90 and AMD gfx942/gfx90a from one code base, and the
hot loads are 16-byte vectors on sm_90. Ahead-of-time compile, no GPU needed (Triton's wheel ships
ptxas and the AMDGPU LLVM backend); argument types, pointer alignment and constexprs are captured
from a real launch of each kernel, as Triton's launcher would specialise them.

The suite runs Triton in interpreter mode (TRITON_INTERPRET=1), so each case compiles in a fresh
subprocess without it: ``python tests/kernels/test_tbe_compile.py sm_90,float32,sgd ...``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rocmtrain.kernels import OptimizerSpec, TableBatchedEmbeddingBags
from rocmtrain.platform import DeviceInfo

pytestmark = pytest.mark.slow
TMAP = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int64: "i64",
        torch.int32: "i32", torch.int8: "i8"}  # fmt: skip
DEVICES = {
    "sm_90": DeviceInfo(0, "H200", "cuda", "sm_90", 32, 132, 1 << 37),
    "gfx942": DeviceInfo(0, "MI300X", "rocm", "gfx942", 64, 304, 1 << 37),
    "gfx90a": DeviceInfo(0, "MI250X", "rocm", "gfx90a", 64, 110, 1 << 36),
}


def _capture(info, *, tables, wdtype, kind):
    """Run forward + backward on CPU tensors with launches intercepted: [(kernel, args, kw)]."""
    import rocmtrain.kernels.tbe_backward as tb
    import rocmtrain.kernels.tbe_forward as tf

    calls = []
    for k in (
        tf._tbe_fwd_kernel,
        tb._keys_kernel,
        tb._bwd_tile_kernel,
        tb._bwd_hot_carry_kernel,
        tb._bwd_hot_kernel,
    ):
        k.run = lambda *a, k=k, grid, warmup, **kw: calls.append((k, a, kw))
    tf._device_info = tb._device_info = lambda idx: info
    m = TableBatchedEmbeddingBags(tables, optimizer=OptimizerSpec(kind), weights_dtype=wdtype,
                                  backend="torch")  # fmt: skip
    T = len(tables)
    idx = torch.cat([torch.randint(0, r, (64 * 32,)) for r, _ in tables])
    off = torch.arange(0, T * 64 * 32 + 1, 32)
    out = torch.zeros(64, sum(d for _, d in tables))
    tf.forward(m.layout, m.weights.data, idx, off, None, pooling="sum", output_dtype=torch.float32)
    tb.backward_update(m.layout, m.weights.data, m.states(), out, idx, off, None, pooling="mean",
                       spec=m.optimizer, step=1, stochastic_rounding=True, need_psw_grad=False,
                       deterministic=True, seed=1)  # fmt: skip
    return calls


def _compile(kernel, args, kwargs, target):
    import triton
    from triton.compiler import ASTSource

    vals = dict(zip(kernel.arg_names, args, strict=False))
    vals.update({n: kwargs[n] for n in kernel.arg_names if n in kwargs})
    opts = {n: v for n, v in kwargs.items() if n not in kernel.arg_names}
    sig, consts, attrs = {}, {}, {}
    for i, n in enumerate(kernel.arg_names):
        v = vals[n]
        if kernel.params[i].is_constexpr:
            sig[n], consts[(i,)] = "constexpr", v
        elif isinstance(v, torch.Tensor):  # torch allocations are 16-byte aligned
            sig[n], attrs[(i,)] = "*" + TMAP[v.dtype], [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[n] = "i1"
        elif isinstance(v, int):
            sig[n] = "i64" if abs(v) >= 2**31 else "i32"
            if v % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[n] = "fp32"
    src = ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=target, options=opts)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check(arch: str, dtype: str, kind: str, steps: str = "") -> None:
    """Compile every kernel of one forward+backward for ``arch``; assert vector loads on sm_90.
    ``steps``: backward tile steps per program instead of the arch table's (e.g. ``"4"``)."""
    import dataclasses

    from triton.backends.compiler import GPUTarget

    from rocmtrain.kernels import arch as arch_table

    if steps:
        p = arch_table.ARCH_TABLE[arch]
        arch_table.ARCH_TABLE[arch] = dataclasses.replace(p, bwd_steps=int(steps))
    info, wdtype = DEVICES[arch], DTYPES[dtype]
    target = (GPUTarget("cuda", 90, 32) if info.backend == "cuda"
              else GPUTarget("hip", info.arch, 64))  # fmt: skip
    calls = _capture(info, tables=[(3000, 128), (2000, 128)], wdtype=wdtype, kind=kind)
    names = [k.__name__ for k, _, _ in calls]
    assert names == ["_tbe_fwd_kernel", "_keys_kernel", "_bwd_tile_kernel",
                     "_bwd_hot_carry_kernel", "_bwd_hot_kernel"], names  # fmt: skip
    for kernel, args, kwargs in calls:
        if info.backend == "rocm" and kernel.__name__ != "_keys_kernel":
            assert kwargs.get("waves_per_eu") == 2, kernel.__name__
        c = _compile(kernel, args, kwargs, target)
        asm = c.asm["ptx" if info.backend == "cuda" else "amdgcn"]
        vec = bool(re.search(r"ld\.global(\.\w+)*\.v4\.b32", asm))
        if info.backend == "cuda" and wdtype == torch.float32 and kernel.__name__ in (
            "_tbe_fwd_kernel", "_bwd_tile_kernel"):  # fmt: skip
            assert vec, f"{kernel.__name__}: no 16-byte loads of fp32 rows on sm_90"
        print(f"compiled {kernel.__name__} for {arch} ({len(asm)} chars of asm, v4={vec})")


# one subprocess (torch import + Triton start-up once), four (arch, weights, optimizer[, steps])
# combos: the table's configs (sm_90 walks 8 steps per tile program, the AMD entries one) and the
# stepped tile loop for gfx942 too (same code on both vendors)
COMBOS = [("sm_90", "float32", "rowwise_adagrad"), ("gfx942", "bfloat16", "adam"),
          ("gfx90a", "float32", "sgd"), ("gfx942", "float32", "rowwise_adagrad", "4")]  # fmt: skip


def _compile_in_subprocess(*args: str) -> str:
    """This file's ``__main__`` with ``args``, without the interpreter; its stdout."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, __file__, *args], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def test_kernels_compile_for_nvidia_and_amd_and_vectorise():
    out = _compile_in_subprocess(*[",".join(c) for c in COMBOS])
    assert out.count("compiled ") == 5 * len(COMBOS)
    assert "compiled _tbe_fwd_kernel for sm_90" in out
    assert "compiled _bwd_tile_kernel for gfx942" in out


def check_register_cap(cap: int) -> None:
    """``ArchParams.bwd_maxnreg`` reaches ptxas: the sm_90 tile kernel (rowwise Adagrad, D=128,
    96 registers uncapped) compiles to at most ``cap`` registers per thread."""
    import dataclasses
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget

    from rocmtrain.kernels import arch

    arch.ARCH_TABLE["sm_90"] = dataclasses.replace(arch.ARCH_TABLE["sm_90"], bwd_maxnreg=cap)
    calls = _capture(DEVICES["sm_90"], tables=[(3000, 128)], wdtype=torch.float32,
                     kind="rowwise_adagrad")  # fmt: skip
    kernel, args, kwargs = next(c for c in calls if c[0].__name__ == "_bwd_tile_kernel")
    assert kwargs.get("maxnreg") == cap, kwargs
    c = _compile(kernel, args, kwargs, GPUTarget("cuda", 90, 32))
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(c.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    assert regs <= cap, usage
    print(f"register cap {cap}: tile kernel {regs} registers")


def test_register_cap_reaches_ptxas():
    assert "register cap 72: tile kernel" in _compile_in_subprocess("cap=72")


def test_register_cap_policy(monkeypatch):
    """The cap applies on NVIDIA to rows up to 128 wide and never to Adam (it would spill)
    nor on AMD (no such backend option); several steps per program likewise only up to 128."""
    import dataclasses

    from rocmtrain.kernels import arch

    shipped, _ = arch.backward_config(DEVICES["sm_90"], max_dim=128)
    assert shipped.tile_launch_kwargs("sgd")["maxnreg"] == 80 and shipped.steps == 8
    assert arch.backward_config(DEVICES["sm_90"], max_dim=256)[0].steps == 1
    assert arch.backward_config(DEVICES["gfx942"], max_dim=128)[0].steps == 1  # not measured
    # interior pieces gather 2 steps per iteration where a program has several steps
    assert shipped.piece_steps == 2
    assert arch.backward_config(DEVICES["sm_90"], max_dim=256)[0].piece_steps == 1
    assert arch.backward_config(DEVICES["gfx942"], max_dim=128)[0].piece_steps == 1
    for key in ("sm_90", "gfx942"):
        monkeypatch.setitem(arch.ARCH_TABLE, key,
                            dataclasses.replace(arch.ARCH_TABLE[key], bwd_maxnreg=72))  # fmt: skip
    cfg, _ = arch.backward_config(DEVICES["sm_90"], max_dim=128)
    assert cfg.tile_launch_kwargs("rowwise_adagrad")["maxnreg"] == 72
    assert "maxnreg" not in cfg.tile_launch_kwargs("adam")
    assert "maxnreg" not in cfg.launch_kwargs()  # the hot-row kernels keep theirs
    wide, _ = arch.backward_config(DEVICES["sm_90"], max_dim=256)
    assert "maxnreg" not in wide.tile_launch_kwargs("sgd")
    amd, _ = arch.backward_config(DEVICES["gfx942"], max_dim=128)
    assert "maxnreg" not in amd.tile_launch_kwargs("sgd")


if __name__ == "__main__":
    for combo in sys.argv[1:]:
        if combo.startswith("cap="):
            check_register_cap(int(combo[4:]))
        else:
            check(*combo.split(","))
