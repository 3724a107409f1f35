#!/usr/bin/env bash
# Create .venv with the CPU stack and rocmtrain installed editable. Idempotent: a second run is fast.
#   torch 2.13.0 (CPU build, from the machine's local wheel) + fbgemm-gpu-cpu 1.8.0 + torchrec 1.8.0
#   torchrec goes in with --no-deps because its metadata asks for the GPU fbgemm-gpu; its real
#   dependencies are listed in scripts/requirements-cpu.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
stamp="$VENV/.rocmtrain-setup"
want=$(cat pyproject.toml scripts/requirements-cpu.txt scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip
pip install torch==2.13.0
pip install --no-deps fbgemm-gpu-cpu==1.8.0 torchrec==1.8.0
pip install -r scripts/requirements-cpu.txt
pip install --no-deps -e .
echo "$want" > "$stamp"
echo "rocmtrain: environment ready in $VENV"
