"""Embedding tests: the Triton kernels run in the interpreter on CPU-only machines (set before
triton decorates the kernels; spawned DMP ranks inherit it)."""

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))  # emb_workers (also importable by spawned ranks)
