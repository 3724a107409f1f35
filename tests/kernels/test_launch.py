"""rocmtrain.kernels.launch: a compiled kernel is replayed only for calls Triton would specialise
alike. On a GPU, Triton's own choice of compiled kernel for each call is the reference; on the
CPU, the specialisation key and the interpreter path."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from rocmtrain.kernels import launch as L


@triton.jit
def _axpy(x_ptr, y_ptr, out_ptr, n, a, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m).to(tl.float32)
    y = tl.load(y_ptr + i, mask=m).to(tl.float32)
    tl.store(out_ptr + i, (a * x + y).to(out_ptr.dtype.element_ty), mask=m)


def _calls(dev):
    """(x, y, out, n, BLOCK) covering what Triton specialises on: dtypes, 16-byte alignment
    (a view one element in), n == 1, n % 16 == 0 and neither, two BLOCKs."""
    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    for dtype in (torch.float32, torch.float16):
        base = torch.randn(4096 + 1, generator=g, device=dev).to(dtype)
        y = torch.randn(4096, generator=g, device=dev).to(dtype)
        for x in (base[:4096], base[1:]):  # aligned, then 2 or 4 bytes off
            for n in (1, 16, 17, 4096):
                for block in (64, 128):
                    out.append((x, y, torch.empty(4096, dtype=dtype, device=dev), n, block))
    return out


def _reference(x, y, n):
    return (2.0 * x[:n].double() + y[:n].double()).to(x.dtype)


@pytest.mark.gpu
def test_replayed_kernel_is_tritons_choice_and_computes_the_same():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU; none visible (CPU-only machine)")
    calls = _calls("cuda")
    hits = 0
    for x, y, out, n, block in calls + calls:  # second pass: every call is a replay
        grid = (triton.cdiv(n, block),)
        out.fill_(float("nan"))
        before = L.cached_kernels(_axpy)
        ran = L.launch(_axpy, grid, x, y, out, n, 2.0, BLOCK=block, num_warps=2)
        hits += L.cached_kernels(_axpy) == before
        torch.testing.assert_close(out[:n], _reference(x, y, n), rtol=1e-3, atol=1e-3)
        assert out[n:].isnan().all()  # nothing written past n
        # Triton's own path for the same call picks the same compiled kernel
        assert _axpy[grid](x, y, out, n, 2.0, BLOCK=block, num_warps=2) is ran
    assert L._FAST, f"triton {triton.__version__}: the direct launch is off"
    assert hits >= len(calls)  # the second pass never compiled or cached anything new
    # one cached kernel per distinct specialisation, at most one per call
    assert 2 <= L.cached_kernels(_axpy) <= len(calls)


def test_key_separates_what_triton_specialises_on():
    spec = L._spec
    ints = [1, 2, 16, 17, 32, -16, 2**31 - 16, 2**31, 2**40, 2**63]
    # 1 and multiples of 16 and the integer widths get keys of their own
    assert spec(1) != spec(2) and spec(16) != spec(17) and spec(2**31 - 16) != spec(2**31)
    assert spec(2**40) != spec(2**63)
    # five classes: 1 | i32 | i32 % 16 | i64 % 16 | u64
    assert len({spec(i) for i in ints}) == 5
    assert spec(True) != spec(1) and spec(True) != spec(False)
    t = torch.zeros(8)
    assert spec(t) == spec(torch.zeros(8))
    assert spec(t) != spec(t[1:])  # 4 bytes off the 16-byte alignment
    assert spec(t) != spec(torch.zeros(8, dtype=torch.float16))
    assert spec(2.0) == spec(3.5)  # floats are not specialised


def test_interpreter_path_launches_through_triton(monkeypatch):
    """CPU tensors never take the replay path (the interpreter has no compiled kernel)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x, y, out = torch.randn(100), torch.randn(100), torch.empty(100)
    before = L.cached_kernels(_axpy)
    L.launch(_axpy, (2,), x, y, out, 100, 2.0, BLOCK=64)
    torch.testing.assert_close(out, _reference(x, y, 100))
    assert L.cached_kernels(_axpy) == before


@pytest.mark.gpu
def test_module_forward_replays_its_kernel():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU; none visible (CPU-only machine)")
    from rocmtrain.kernels import TableBatchedEmbeddingBags
    from rocmtrain.kernels import tbe_forward as tf

    m = TableBatchedEmbeddingBags([(1000, 64), (500, 64)], backend="triton", device="cuda")
    idx = torch.randint(0, 500, (2 * 64 * 4,), device="cuda")
    off = torch.arange(0, 2 * 64 * 4 + 1, 4, device="cuda")
    with torch.no_grad():
        first = m(idx, off)
        n = L.cached_kernels(tf._tbe_fwd_kernel)
        again = m(idx, off)
    assert n >= 1 and L.cached_kernels(tf._tbe_fwd_kernel) == n  # replayed, nothing new
    assert torch.equal(first, again)
