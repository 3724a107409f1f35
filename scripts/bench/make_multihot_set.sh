#!/usr/bin/env bash
# Write the file sets the end-to-end benchmark trains from (python -m rocmtrain write-data):
#   DIR/multihot/  MLPerf's multi-hot layout (data=criteo_multihot): days 0 and 1 train
#                  (2 x 3,145,728 = 6,291,456 rows), day 2's first half validates (131,072 rows);
#                  MLPerf hot sizes (214 ids a sample), MLPerf tables capped at 10 M rows (what
#                  model=dlrm_dcnv2_mlperf trains: the ids fit the tables, no id is wrapped);
#   DIR/onehot/    the same row counts one-hot, TorchRec's day_N_{dense,sparse,labels}.npy
#                  (data=criteo_npy, contiguous ids).
# Both carry the planted signal of data=synthetic (seeded: the same bytes every time).
#
#   scripts/bench/make_multihot_set.sh DIR [--workers N] [--rows R0,R1,R2] [--only multihot|onehot]
#
# Then, e.g. (recipe dlrm_dcnv2_h200, 1 GPU, global batch 65536):
#   python -m rocmtrain recipe=dlrm_dcnv2_h200 data=criteo_multihot data.path=DIR/multihot \
#     data.days=[0,1,2]
#   python -m rocmtrain recipe=dlrm_dcnv2_h200 data=criteo_npy data.path=DIR/onehot \
#     data.days=[0,1,2] data.val_fraction=0.02 model.multi_hot_sizes=null
# (criteo_multihot on a GPU reads with data.read_threads threads into pinned buffers, chosen from
# the machine unless set; data.read_threads=0: loader processes as criteo_npy uses)
# Run from the repository root (PYTHONPATH=$PWD, or an installed rocmtrain); PYTHON picks the
# interpreter. Needs ~12 GB free in DIR while writing (each feature is written to its own .npy,
# then streamed into the day's .npz), ~6.5 GB after.
set -euo pipefail

if [ $# -lt 1 ] || [ "${1:0:1}" = "-" ]; then
  sed -n 2,22p "$0"
  exit 2
fi
DIR=$1
shift
WORKERS=$(nproc)
ROWS=3145728,3145728,262144
ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --workers) WORKERS=$2; shift ;;
    --rows) ROWS=$2; shift ;;
    --only) ONLY=$2; shift ;;
    -h|--help) sed -n 2,22p "$0"; exit 0 ;;
    *) echo "make_multihot_set.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

PY=${PYTHON:-python}
CAP=10000000  # model=dlrm_dcnv2_mlperf's max_rows_per_table
for layout in multihot onehot; do
  if [ -n "$ONLY" ] && [ "$ONLY" != "$layout" ]; then
    continue
  fi
  rm -rf "${DIR:?}/$layout"
  SECONDS=0
  "$PY" -m rocmtrain write-data synthetic "$DIR/$layout" --layout "$layout" --rows "$ROWS" \
    --max-rows-per-table "$CAP" --workers "$WORKERS"
  echo "make_multihot_set.sh: $layout written in ${SECONDS} s (rows $ROWS, $WORKERS workers)"
done
