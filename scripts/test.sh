#!/usr/bin/env bash
# Quick start, command 2: set up .venv (first time only) and run the test suite on the CPU.
# Triton kernels run in the interpreter; Slurm tests run when a cluster is up (.ci/run starts one).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TRITON_INTERPRET=1
exec .venv/bin/python -m pytest "$@"
