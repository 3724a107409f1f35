"""Kernel tests run the Triton kernels in the interpreter on CPU-only machines.

TRITON_INTERPRET must be set before triton decorates the kernels (scripts/test.sh exports it too);
with a GPU visible the GPU-marked tests run the compiled kernels, so it is left alone there.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
