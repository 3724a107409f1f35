#!/usr/bin/env bash
# Quick start, command 1: set up .venv (first time only) and train the default recipe.
# Extra arguments are Hydra overrides or a subcommand: scripts/run.sh recipe=dlrm_mi300 dry_run=true
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m rocmtrain "$@"
