#!/usr/bin/env bash
# Build NVIDIA nccl-tests (rccl-tests is its fork and prints the same format) on an NVIDIA GPU machine,
# against the NCCL that PyTorch ships (pip package nvidia-nccl-cu13: site-packages/nvidia/nccl/{include,lib}).
#
#   bash scripts/rccl/build_nccl_tests.sh            # -> .nccl-tests-src/build/*_perf + .nccl-tests-src/env.sh
#   . .nccl-tests-src/env.sh                         # LD_LIBRARY_PATH (PyTorch's libnccl.so.2), RCCL_TESTS_DIR
#   python3 -m rocmtrain rccl-tests run all_reduce --tests-dir "$RCCL_TESTS_DIR" --ngpus 2
#
# Source: NVIDIA/nccl-tests exported (git archive, never committed) into .nccl-tests-src/ (HEAD) and
# .nccl-tests-src/legacy-v2.16.9/ (fallback), listed in .git/info/exclude; pass it in the device tool's
# `carry`. Variables read by nccl-tests' Makefiles
# (src/Makefile, src/common.mk): NCCL_HOME (-I$NCCL_HOME/include -L$NCCL_HOME/lib, links -lnccl),
# CUDA_HOME (nvcc, -L$CUDA_HOME/lib64 -lcudart), NVCC_GENCODE (default: many archs; sm_90 for H100/H200),
# MPI (0: one process drives all GPUs with -g N), BUILDDIR.
# Overrides: NCCL_TESTS_SRC, CUDA_HOME, NVCC_GENCODE, PYTHON, JOBS.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
SRC="${NCCL_TESTS_SRC:-$ROOT/.nccl-tests-src}"
BUILD="$SRC/build"
PYTHON="${PYTHON:-python3}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
NVCC_GENCODE="${NVCC_GENCODE:--gencode=arch=compute_90,code=sm_90}"
JOBS="${JOBS:-$(nproc)}"

die() { echo "build_nccl_tests: error: $*" >&2; exit 1; }
[[ -f "$SRC/src/common.mk" ]] || die "no nccl-tests source in $SRC (export NVIDIA/nccl-tests there: git archive HEAD | tar -x -C $SRC)"
[[ -x "$CUDA_HOME/bin/nvcc" ]] || die "nvcc not found at $CUDA_HOME/bin/nvcc (set CUDA_HOME)"

# The NCCL PyTorch loads: the nvidia-nccl-cu* wheel (headers + libnccl.so.2).
NCCL_PKG="$("$PYTHON" - <<'PY'
import pathlib, site, sys
cands = []
try:
    import nvidia.nccl as m
    cands += [pathlib.Path(p) for p in m.__path__]
except ImportError:
    pass
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    cands += [h.parent.parent for h in pathlib.Path(sp).glob("nvidia/**/include/nccl.h")]
for c in cands:
    if (c / "include" / "nccl.h").is_file() and list((c / "lib").glob("libnccl.so*")):
        print(c)
        sys.exit(0)
sys.exit(1)
PY
)" || die "PyTorch's NCCL (pip nvidia-nccl-cu13: nvidia/nccl/include/nccl.h + lib/libnccl.so.2) not found for $PYTHON"
echo "NCCL from $NCCL_PKG: $(grep -E '^#define NCCL_(MAJOR|MINOR|PATCH)' "$NCCL_PKG/include/nccl.h" | awk '{printf "%s ", $3}')"

# The wheel has libnccl.so.2 but no libnccl.so for `-lnccl`: a small NCCL_HOME of links.
HOME_SHIM="$BUILD/nccl_home"
mkdir -p "$HOME_SHIM/lib"
ln -sfn "$NCCL_PKG/include" "$HOME_SHIM/include"
LIBNCCL="$(ls "$NCCL_PKG"/lib/libnccl.so* | head -n1)"
ln -sf "$LIBNCCL" "$HOME_SHIM/lib/libnccl.so"
ln -sf "$LIBNCCL" "$HOME_SHIM/lib/libnccl.so.2"

# Build HEAD; if that fails (e.g. a wheel without nccl_device.h for NCCL >= 2.28), fall back to
# v2.16.9 (the last release before nccl-tests used NCCL's device API), exported beside HEAD.
build() {  # build SRC_DIR BUILD_DIR
  make -C "$1" -j"$JOBS" MPI=0 BUILDDIR="$2" NCCL_HOME="$HOME_SHIM" CUDA_HOME="$CUDA_HOME" \
      NVCC_GENCODE="$NVCC_GENCODE" && ls "$2"/*_perf >/dev/null 2>&1
}
LEGACY="$SRC/legacy-v2.16.9"
if build "$SRC" "$BUILD"; then
  OK_BUILD="$BUILD"
elif [[ -f "$LEGACY/src/common.mk" ]]; then
  echo "build_nccl_tests: HEAD did not build; trying nccl-tests v2.16.9 (no device API)" >&2
  CUDA_MAJOR="$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
  if [[ "${CUDA_MAJOR:-0}" -ge 13 ]]; then  # v2.16.9 predates CUDA 13, which needs C++17
    sed -i 's/-std=c++14/-std=c++17/g' "$LEGACY/src/common.mk"
  fi
  build "$LEGACY" "$LEGACY/build" || die "nccl-tests did not build (HEAD nor v2.16.9): see the errors above"
  OK_BUILD="$LEGACY/build"
else
  die "nccl-tests HEAD did not build and no fallback tree at $LEGACY"
fi

cat > "$SRC/env.sh" <<SH
# source me before running the *_perf binaries: they load PyTorch's libnccl.so.2
export LD_LIBRARY_PATH="$NCCL_PKG/lib:$CUDA_HOME/lib64\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export RCCL_TESTS_DIR="$OK_BUILD"
SH
echo "built: $(cd "$OK_BUILD" && ls *_perf | tr '\n' ' ')"
echo "next: . $SRC/env.sh && python3 -m rocmtrain rccl-tests sweep --tests-dir \$RCCL_TESTS_DIR ..."
