#!/usr/bin/env bash
# Run a rocmtrain recipe under the vendor GPU profiler: rocprofv3 (ROCm >= 6.2), rocprof (older ROCm)
# or nsys (NVIDIA), picked in that order from PATH. For an in-process operator/kernel trace use
# `profile=true` instead (torch.profiler; see rocmtrain/diagnostics/DIAGNOSTICS.md).
#
# usage: scripts/profile/profile_recipe.sh [--out DIR] [--tool rocprofv3|rocprof|nsys] [--dry-run] -- OVERRIDES...
#   scripts/profile/profile_recipe.sh -- recipe=dlrm_mi300 trainer.max_steps=50
#   scripts/profile/profile_recipe.sh --tool nsys --out /tmp/prof -- recipe=dlrm_h200 trainer.max_steps=50
# Output: DIR (default runs/profile-<date>) with the tool's kernel trace + statistics; the command
# used is written to DIR/COMMAND. Exit 2 when no profiler is found or the arguments are wrong.
set -euo pipefail
cd "$(dirname "$0")/../.."
out="runs/profile-$(date +%Y%m%d-%H%M%S)"
tool=""
dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --tool) tool="${2:?--tool needs rocprofv3, rocprof or nsys}"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
py="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
if [ -z "$tool" ]; then
  for t in rocprofv3 rocprof nsys; do
    if command -v "$t" >/dev/null 2>&1; then tool="$t"; break; fi
  done
fi
if [ -z "$tool" ]; then
  echo "profile_recipe.sh: no GPU profiler on PATH (looked for rocprofv3, rocprof, nsys)." >&2
  echo "  ROCm: install rocprofiler-sdk (rocprofv3) and add /opt/rocm/bin to PATH;" >&2
  echo "  NVIDIA: install Nsight Systems (nsys)." >&2
  echo "  Without them: python -m rocmtrain $* profile=true  (torch.profiler trace in the run dir)" >&2
  exit 2
fi
case "$tool" in
  rocprofv3) cmd=(rocprofv3 --kernel-trace --stats --output-format csv json -d "$out" -o run -- "$py" -m rocmtrain "$@") ;;
  rocprof) cmd=(rocprof --stats --hip-trace -o "$out/results.csv" "$py" -m rocmtrain "$@") ;;
  nsys) cmd=(nsys profile -t cuda,nvtx,osrt --stats=true --force-overwrite=true -o "$out/rocmtrain" "$py" -m rocmtrain "$@") ;;
  *) echo "profile_recipe.sh: --tool $tool: expected rocprofv3, rocprof or nsys" >&2; exit 2 ;;
esac
if [ "$dry" = 1 ]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
if ! command -v "$tool" >/dev/null 2>&1; then
  echo "profile_recipe.sh: --tool $tool is not on PATH" >&2
  exit 2
fi
mkdir -p "$out"
printf '%q ' "${cmd[@]}" > "$out/COMMAND"; echo >> "$out/COMMAND"
echo "profiling with $tool -> $out" >&2
"${cmd[@]}"
echo "profile written to $out (kernel statistics: *stats*.csv; open .json/.nsys-rep in Perfetto / Nsight)" >&2
