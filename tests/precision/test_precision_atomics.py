"""fp32-intermediate atomics: stall demonstration, Triton (interpreter) and torch paths vs fp64."""

from __future__ import annotations

import logging
import os

import pytest
import torch
import torch.nn.functional as F

from rocmtrain.precision import atomics
from rocmtrain.precision.capabilities import TABLE, capabilities_for, current_capabilities
from rocmtrain.precision.matrix_ops import ulp

_FMT = {torch.float16: "fp16", torch.bfloat16: "bf16"}
needs_interp = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or atomics.triton is None,
    reason="Triton path on CPU needs TRITON_INTERPRET=1 (scripts/test.sh sets it)",
)
BACKENDS = ["torch", pytest.param("triton", marks=needs_interp)]


def _within_one_rounding(
    out: torch.Tensor, ref: torch.Tensor, abs_sum: torch.Tensor | None = None, terms: int = 0
) -> None:
    """|out - ref| <= 1 ULP of out's dtype at ref (the one final rounding), plus the fp32 summation
    bound terms * eps32 * sum|x| where sums of many terms may cancel to ~0 (abs_sum = sum of |x|)."""
    err = (out.double() - ref).abs()
    bound = ulp(ref, _FMT[out.dtype])
    if abs_sum is not None:
        bound = bound + terms * 2.0**-24 * abs_sum
    assert bool((err <= bound).all()), f"max err/ulp {float((err / bound).max()):.2f}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("dtype", "n", "stall"), [(torch.bfloat16, 100_000, 256.0), (torch.float16, 60_000, 2048.0)]
)
def test_many_adds_into_one_slot_stall_natively_but_not_in_fp32(backend, dtype, n, stall):
    # fp16 tops out at 65504, so 6e4 additions there (1e5 would correctly overflow to inf)
    index = torch.zeros(n, dtype=torch.long)
    ones = torch.ones(n, dtype=dtype)
    ref = torch.ones(n, dtype=torch.float64).sum()  # fp64 reference: exactly n

    native = atomics.index_add(torch.zeros(1, dtype=dtype), index, ones, policy="native")
    fp32 = atomics.index_add(torch.zeros(1, dtype=dtype), index, ones, backend=backend)

    assert float(native) == stall  # 16-bit accumulation: x + 1 rounds back to x
    assert abs(float(native) - float(ref)) > 0.9 * n
    # fp32 path: exact sum, rounded once into the destination dtype
    assert float(fp32) == float(ref.to(dtype))
    _within_one_rounding(fp32, ref.reshape(1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(37, 5), (11, 130), (9, 3, 7)])
def test_index_add_matches_fp64(backend, dtype, shape):
    g = torch.Generator().manual_seed(1)
    dest = torch.randn(shape, generator=g).to(dtype)
    n = 3 * shape[0] + 1
    index = torch.randint(0, shape[0], (n,), generator=g)
    source = torch.randn((n, *shape[1:]), generator=g).to(dtype)
    ref = dest.double().index_add_(0, index, source.double(), alpha=0.5)
    abs_sum = dest.double().abs().index_add_(0, index, source.double().abs(), alpha=0.5)
    out = atomics.index_add(dest.clone(), index, source, alpha=0.5, backend=backend)
    assert out.dtype == dtype
    _within_one_rounding(out, ref, abs_sum, int(torch.bincount(index).max()) + 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_add_other_dim_and_scatter_add(backend):
    g = torch.Generator().manual_seed(2)
    dest = torch.randn(4, 6, 3, generator=g).bfloat16()
    index = torch.randint(0, 6, (10,), generator=g)
    source = torch.randn(4, 10, 3, generator=g)
    ref = dest.double().index_add_(1, index, source.double())
    _within_one_rounding(
        atomics.index_add(dest.clone(), index, source, dim=1, backend=backend), ref
    )

    d2 = torch.randn(5, 7, generator=g).half()
    idx2 = torch.randint(0, 7, (5, 12), generator=g)
    src2 = torch.randn(5, 12, generator=g)
    ref2 = d2.double().scatter_add_(1, idx2, src2.double())
    _within_one_rounding(atomics.scatter_add(d2.clone(), 1, idx2, src2, backend=backend), ref2)
    idx3 = torch.randint(0, 5, (8, 7), generator=g)
    src3 = torch.randn(8, 7, generator=g)
    ref3 = d2.double().scatter_add_(0, idx3, src3.double())
    _within_one_rounding(atomics.scatter_add(d2.clone(), 0, idx3, src3, backend=backend), ref3)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_embedding_bag_grad_matches_fp64_autograd(backend, mode, weighted):
    g = torch.Generator().manual_seed(3)
    rows, d = 13, 6
    # docstring picture plus random bags, including an empty one
    indices = torch.cat([torch.tensor([3, 7, 7, 7, 1]), torch.randint(0, rows, (40,), generator=g)])
    offsets = torch.tensor([0, 2, 2, 5, 20, 45])
    grad_out = torch.randn(5, d, generator=g).bfloat16()
    psw = torch.rand(indices.numel(), generator=g) if weighted and mode == "sum" else None

    w = torch.zeros(rows, d, dtype=torch.float64, requires_grad=True)
    out = F.embedding_bag(
        indices,
        w,
        offsets[:-1],
        mode=mode,
        per_sample_weights=None if psw is None else psw.double(),
    )
    out.backward(grad_out.double())
    got = atomics.embedding_bag_grad(
        grad_out,
        indices,
        offsets,
        num_embeddings=rows,
        per_sample_weights=psw,
        mode=mode,
        backend=backend,
    )
    assert got.shape == (rows, d) and got.dtype == torch.bfloat16
    _within_one_rounding(got, w.grad)


def test_native_policy_warns_and_bad_inputs_fail(caplog):
    atomics._warned.clear()
    with caplog.at_level(logging.WARNING, logger="rocmtrain.precision.atomics"):
        atomics.index_add(
            torch.zeros(2, dtype=torch.bfloat16), torch.tensor([0]), torch.ones(1), policy="native"
        )
    assert "precision.atomics=auto" in caplog.text
    with pytest.raises(ValueError, match="policy='bf32'"):
        atomics.index_add(torch.zeros(2).half(), torch.tensor([0]), torch.ones(1), policy="bf32")
    with pytest.raises(IndexError, match=r"out of range \[0, 2\)"):
        atomics.index_add(torch.zeros(2).half(), torch.tensor([2]), torch.ones(1))
    with pytest.raises(ValueError, match="offsets"):
        atomics.embedding_bag_grad(
            torch.ones(3, 2), torch.tensor([0]), torch.tensor([0, 1]), num_embeddings=2
        )
    assert atomics.accumulation_dtype(torch.bfloat16) == torch.float32
    assert atomics.accumulation_dtype(torch.float64) == torch.float64
    assert atomics.accumulation_dtype(torch.float16, "native") == torch.float16


def test_capability_table():
    mi200 = capabilities_for("gfx90a:sramecc+:xnack-")
    assert mi200.atomic_add == {"fp32": "native", "fp16": "native", "bf16": "cas"}
    assert (
        not mi200.fine_grained_float_atomics
        and not mi200.xf32
        and mi200.fp16_mfma_flushes_denormals
    )
    mi300 = capabilities_for("gfx942")
    assert mi300.atomic_add["bf16"] == "native" and mi300.xf32 and mi300.fine_grained_float_atomics
    assert mi300.reduced_precision_reduction_flags == "unsupported"
    assert (
        capabilities_for("sm_86") is TABLE["sm_80"] and TABLE["sm_80"].atomic_add["bf16"] == "cas"
    )
    assert capabilities_for("sm_100").atomic_add["bf16"] == "native"
    unknown = capabilities_for("gfx1100")
    assert unknown.atomic_add["bf16"] == "cas" and "conservative" in unknown.notes
    with pytest.raises(RuntimeError, match=r"gfx942 needs ROCm >= 6\.0"):
        capabilities_for("gfx942", rocm_version=(5, 7))
    with pytest.raises(ValueError, match="unknown architecture"):
        capabilities_for("banana")
    if not torch.cuda.is_available():
        assert current_capabilities().arch == "cpu"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_triton_kernel_matches_fp64_and_native_atomics_lose_precision(dtype):
    g = torch.Generator().manual_seed(4)
    dest = torch.randn(1000, 130, generator=g).to(dtype)
    index = torch.randint(0, 1000, (20_000,), generator=g)
    source = torch.randn(20_000, 130, generator=g).to(dtype)
    ref = dest.double().index_add_(0, index, source.double())
    abs_sum = dest.double().abs().index_add_(0, index, source.double().abs())
    terms = int(torch.bincount(index).max()) + 1
    out = atomics.index_add(dest.cuda(), index.cuda(), source.cuda(), backend="triton")
    _within_one_rounding(out.cpu(), ref, abs_sum, terms)

    n = 60_000
    ones = torch.ones(n, dtype=dtype, device="cuda")
    zero_idx = torch.zeros(n, dtype=torch.long, device="cuda")
    fp32 = atomics.index_add(torch.zeros(1, dtype=dtype, device="cuda"), zero_idx, ones)
    native = atomics.index_add(
        torch.zeros(1, dtype=dtype, device="cuda"), zero_idx, ones, policy="native"
    )
    assert float(fp32) == float(torch.tensor(float(n)).to(dtype))
    assert float(native) < 0.5 * n  # 16-bit atomics stall (bf16: 256, fp16: 2048)


def test_pinned_host_memory_is_refused_for_the_hardware_atomics_reason():
    """The guard stays; its reason is the hardware (unsafe) float atomics, not atomicAdd(float)."""

    class PinnedHost:  # what a pinned CPU tensor reports (pinning itself needs a GPU runtime)
        device = torch.device("cpu")

        def is_pinned(self) -> bool:
            return True

    with pytest.raises(ValueError, match=r"hardware \(unsafe\) float atomics") as err:
        atomics._check_device_memory(PinnedHost())
    assert "no-op" not in str(err.value)
    atomics._check_device_memory(torch.zeros(2))  # pageable host memory: the torch path, allowed
    notes = capabilities_for("gfx90a").notes
    assert "hardware (unsafe) float atomics" in notes and "CAS loop" in notes
