#!/usr/bin/env bash
# GPU benchmark machine: build NVIDIA nccl-tests against PyTorch's NCCL, then sweep protocols × algorithms
# on 1..MAX_GPUS GPUs with `python -m rocmtrain rccl-tests sweep`. Results go to OUT_DIR/gpu<N>/
# (sweep.md, sweep.json, sweep.png, h200_<N>gpu_measured.yaml: 4 files per GPU count); raw logs to
# /tmp/sweep_logs_gpu<N>. NVLink multicast stays off (shared machines).
#
#   bash scripts/rccl/gpu_sweep.sh "$OUT" 2        # device tool: kind nvidia-h200-x2, carry .nccl-tests-src
#
# SKIP_BUILD=1 TESTS_DIR=DIR reuses existing binaries (also how this script is tested on CPU with fakes).
set -uo pipefail
OUT="${1:?usage: gpu_sweep.sh OUT_DIR [MAX_GPUS]}"
MAX_GPUS="${2:-2}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

"$PYTHON" -c 'import torch; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)'
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  if ! bash scripts/rccl/build_nccl_tests.sh >/tmp/nccl_tests_build.log 2>&1; then
    echo "nccl-tests build FAILED:"; tail -n 60 /tmp/nccl_tests_build.log; exit 1
  fi
  tail -n 4 /tmp/nccl_tests_build.log
  # shellcheck disable=SC1091
  . "$ROOT/.nccl-tests-src/env.sh"  # LD_LIBRARY_PATH + RCCL_TESTS_DIR (HEAD or the v2.16.9 fallback)
fi
TESTS_DIR="${TESTS_DIR:-${RCCL_TESTS_DIR:-$ROOT/.nccl-tests-src/build}}"
echo "binaries: $TESTS_DIR"

rc=0
for g in $(seq 1 "$MAX_GPUS"); do
  if [[ "$g" == 1 ]]; then  # one rank: busbw is 0 by definition, compare times
    grid=(--protocols unset,LL,LL128,Simple --algorithms unset --metric time)
  else
    grid=(--protocols unset,LL,LL128,Simple --algorithms unset,Ring,Tree --metric busbw)
  fi
  echo "=== sweep on $g GPU(s)"
  "$PYTHON" -m rocmtrain rccl-tests sweep --tests-dir "$TESTS_DIR" --collectives all_reduce,alltoall \
    "${grid[@]}" --min-bytes 8 --max-bytes 256M --ngpus "$g" --iters 20 --warmup-iters 5 \
    --binary-timeout 60 --timeout 180 --env NCCL_NVLS_ENABLE=0 \
    --out "$OUT/gpu$g" --preset-name "h200_${g}gpu_measured" || rc=1
  rm -rf "/tmp/sweep_logs_gpu$g"
  mv "$OUT/gpu$g/logs" "/tmp/sweep_logs_gpu$g" 2>/dev/null || true  # keep OUT within 8 files
done
exit "$rc"
