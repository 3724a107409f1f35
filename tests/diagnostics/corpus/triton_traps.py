"""Triton kernels written for 32-lane warps (positives); strings mention tl.atomic_add(x.to(tl.float16))."""

import triton
import triton.language as tl

WARP_SIZE = 32  # expect: triton-num-warps-32


@triton.jit
def scatter_add(out_ptr, val_ptr, idx_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(val_ptr + offs, mask=offs < n)
    h = v.to(tl.bfloat16)
    tl.atomic_add(out_ptr + offs, h, mask=offs < n)  # expect: triton-atomic-half
    tl.atomic_add(out_ptr + offs, v.to(tl.float16), sem="relaxed")  # expect: triton-atomic-half
    for i in range(4):
        tl.atomic_add(out_ptr + i, v)  # expect: triton-atomic-acq-rel-loop
        tl.atomic_max(out_ptr + i, v, sem="acq_rel")  # expect: triton-atomic-acq-rel-loop
        # rocmtrain: ignore[triton-atomic-acq-rel-loop]
        tl.atomic_min(out_ptr + i, v)


def launch(x, out, BLOCK=1024):
    num_warps = BLOCK // 32  # expect: triton-num-warps-32
    threads = num_warps * 32  # expect: triton-num-warps-32
    opts = dict(num_warps=BLOCK // 32)  # expect: triton-num-warps-32
    scatter_add[(1,)](out, x, x, x.numel(), BLOCK=BLOCK, **opts)
    return threads
