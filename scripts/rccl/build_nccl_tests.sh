#!/usr/bin/env bash
# Build NVIDIA nccl-tests (rccl-tests is its fork and prints the same format) on an NVIDIA GPU machine,
# against the NCCL that PyTorch ships (pip package nvidia-nccl-cu13: site-packages/nvidia/nccl/{include,lib}).
#
#   bash scripts/rccl/build_nccl_tests.sh            # -> .nccl-tests-src/build/*_perf + build/env.sh
#   . .nccl-tests-src/build/env.sh                   # LD_LIBRARY_PATH for PyTorch's libnccl.so.2
#   python3 -m rocmtrain rccl-tests run all_reduce --tests-dir .nccl-tests-src/build --ngpus 2
#
# Source: NVIDIA/nccl-tests exported (git archive, never committed) into .nccl-tests-src/ (listed in
# .git/info/exclude; pass it in the device tool's `carry`). Variables read by nccl-tests' Makefiles
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

make -C "$SRC" -j"$JOBS" MPI=0 BUILDDIR="$BUILD" NCCL_HOME="$HOME_SHIM" CUDA_HOME="$CUDA_HOME" \
    NVCC_GENCODE="$NVCC_GENCODE"

cat > "$BUILD/env.sh" <<SH
# source me before running the *_perf binaries: they load PyTorch's libnccl.so.2
export LD_LIBRARY_PATH="$NCCL_PKG/lib:$CUDA_HOME/lib64\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export RCCL_TESTS_DIR="$BUILD"
SH
ls "$BUILD"/*_perf >/dev/null 2>&1 || die "make finished but no *_perf binaries in $BUILD"
echo "built: $(cd "$BUILD" && ls *_perf | tr '\n' ' ')"
echo "next: . $BUILD/env.sh && python3 -m rocmtrain rccl-tests sweep --tests-dir $BUILD ..."
