"""Wave-size-aware Triton code: must produce NO finding. (num_warps * 32 in a docstring is fine.)"""

import triton
import triton.language as tl

from rocmtrain.platform import warp_size


@triton.jit
def scatter_add(out_ptr, val_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(val_ptr + offs, mask=offs < n).to(tl.float32)
    tl.atomic_add(out_ptr + offs, v, mask=offs < n)  # fp32, outside a loop
    for i in range(4):
        tl.atomic_add(out_ptr + i, v, sem="relaxed")


def launch(x, out, BLOCK=1024):
    lanes = warp_size()  # 64 on CDNA
    num_warps = max(1, BLOCK // lanes)
    scatter_add[(1,)](out, x, x.numel(), BLOCK=BLOCK, num_warps=num_warps)
    return num_warps * lanes
