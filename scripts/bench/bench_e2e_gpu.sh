#!/usr/bin/env bash
# End-to-end GPU benchmark in ONE command: what a user runs, measured as shipped. The recipe
# (`python -m rocmtrain recipe=dlrm_dcnv2_h200`: DLRM-DCNv2, 26 tables D=128 MLPerf multi-hot, rows
# capped at 10 M, global batch 65536, synthetic planted-signal data made on the GPU) with only its
# length, rows cap, run dir and checkpointing set, against the tuned plain-TorchRec anchor (DCN
# cross net compiled in place) in five interleaved rounds; the user's own command verbatim and
# its convergence against the anchor on the same samples; a user's own LightningModule with the
# strategy swapped in, fed by an ordinary DataLoader, against the same module on pre-staged
# batches and plain TorchRec fed by the same DataLoader (eager and compiled, three rounds each);
# then the levers still explored (kernel=triton, no CUDA graphs, host-made data, 2 GPUs).
#
#   scripts/bench/bench_e2e_gpu.sh                 # 1 or 2 H200 (2-GPU stages skipped on 1)
#   scripts/bench/bench_e2e_gpu.sh --cpu-smoke     # tiny tables, gloo, CPU ranks: tests the logic
#
# Options: --out DIR (default $OUT or ./e2e_out; results go to DIR/e2e/), --budget-s S (default 540:
# stages that would not fit are skipped and listed), --only a,b (stage names or globs: the swap-in
# suite alone is --only 'anchor_1gpu_bf16*,swapin_*'), --work DIR (the stages' working folder,
# default a new /tmp/e2e_work.XXXX), --continue (with --work: one run over several invocations,
# e.g. device calls with a time limit: the stages DIR already ran are kept, the rest run now, and
# the summary covers them all).
# Every stage runs under `timeout`; after each stage DIR/e2e/{summary.md,results.json,
# convergence.png} are rewritten, so a partial run still reports. DIR/e2e/logs.tar.gz holds every
# stage's log and the small files of every run dir (throughput.json, monitor/step_stats.json,
# profile/top_kernels*.md).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MODE=gpu
OUT_DIR=${OUT:-$PWD/e2e_out}
BUDGET=540
ONLY=""
WORK=""
CONTINUE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-smoke) MODE=cpu ;;
    --out) OUT_DIR=$2; shift ;;
    --budget-s) BUDGET=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --work) WORK=$2; shift ;;
    --continue) CONTINUE=1 ;;
    -h|--help) sed -n 2,23p "$0"; exit 0 ;;
    *) echo "bench_e2e_gpu.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

PY=${PYTHON:-python}
E2E=$OUT_DIR/e2e
if [ "$CONTINUE" = 1 ] && [ ! -f "$WORK/stages.jsonl" ]; then
  echo "bench_e2e_gpu.sh: --continue needs --work DIR of an earlier invocation (no" \
       "${WORK:-<unset>}/stages.jsonl); start without --continue" >&2
  exit 2
fi
WORK=${WORK:-$(mktemp -d /tmp/e2e_work.XXXX)}
LOGS=$WORK/logs
mkdir -p "$E2E" "$LOGS" "$WORK/runs"
STAGES=$WORK/stages.jsonl
if [ "$CONTINUE" = 1 ]; then  # keep what ran; stages the budget skipped run now
  grep -vE '"status": ?"skipped"' "$STAGES" > "$STAGES.kept" || true
  mv "$STAGES.kept" "$STAGES"
else
  : > "$STAGES"
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# NVLink SHARP / multicast off on the lent machines (KINDS.md)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1
T_START=$(date +%s)

log() { echo "[e2e $(date -u +%H:%M:%S) +$(( $(date +%s) - T_START ))s] $*" | tee -a "$LOGS/bench.log"; }

if [ "$MODE" = gpu ]; then
  NGPU=$($PY -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  # steps are cheap (~22 ms); a stage's time is its start-up (imports, tables, compile), so each
  # stage trains one epoch: 15 warm-up steps (compile, pipeline fill, profile) + 80 timed (16
  # windows of 5; with 6 windows of 30 steps, one stage's rounds spread 0.7-0.9 %), ending
  # before DDP's 100th iteration, which it times with a host sync (see PROF_WAIT)
  GB=65536; ROWS_CAP=10000000; WARMUP=15; SYNC=5; TRAIN_BATCHES=95
  ANCHOR_STEPS=80; STAGE_T=150
  # profiled steps 12-14 (wait 10, warm-up 1, 3 recorded): DDP's reducer times its first 10
  # iterations (and every 100th) with CUDA events it synchronises at the next forward's start,
  # so a window inside them shows a host stall the timed steps (16-45) do not have
  PROF_WAIT=10; PROF_WARM=1
  ANCHOR_DEV=()
else
  NGPU=2  # two gloo ranks stand in for two GPUs
  GB=256; ROWS_CAP=2000; WARMUP=2; SYNC=2; TRAIN_BATCHES=6
  ANCHOR_STEPS=4; STAGE_T=300
  PROF_WAIT=3; PROF_WARM=2
  ANCHOR_DEV=(--cpu)
  export TRITON_INTERPRET=1  # kernel=triton stages run rocmtrain's Triton TBE in the interpreter
fi
log "mode=$MODE gpus=$NGPU out=$E2E work=$WORK budget=${BUDGET}s continue=$CONTINUE root=$ROOT"
$PY - > "$E2E/env.txt" 2>&1 <<'EOF'
import importlib.metadata as md, platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
for n in ("fbgemm_gpu", "fbgemm-gpu", "fbgemm-gpu-cpu", "torchrec", "triton", "pytorch-lightning",
          "lightning", "torchmetrics", "hydra-core"):
    try: print(n, md.version(n))
    except md.PackageNotFoundError: pass
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i); print(f"gpu{i}", p.name, round(p.total_memory / 2**30), "GiB")
EOF
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv >> "$E2E/env.txt" 2>/dev/null || true

summarise() {
  $PY "$ROOT/scripts/bench/e2e_summary.py" --stages "$STAGES" --out "$E2E" --mode "$MODE" \
    --env "$E2E/env.txt" >> "$LOGS/summary.log" 2>&1 || log "summariser failed (see logs/summary.log)"
}

selected() {  # selected NAME: NAME matches one of the comma-separated --only patterns (globs)
  local pat
  IFS=, read -ra pats <<< "$ONLY"
  for pat in "${pats[@]}"; do
    # shellcheck disable=SC2053  # the pattern is a glob on purpose
    [[ $1 == $pat ]] && return 0
  done
  return 1
}

# run_stage NAME KIND GPUS TIMEOUT CMD...   KIND=anchor (result json = $WORK/NAME.json) |
# rocmtrain | swapin (result json = $WORK/runs/NAME/throughput.json)
run_stage() {
  local name=$1 kind=$2 gpus=$3 tmo=$4; shift 4
  if [ -n "$ONLY" ] && ! selected "$name"; then return 0; fi
  if grep -qE "\"name\": ?\"$name\"" "$STAGES"; then return 0; fi  # --continue: ran before
  local left=$(( BUDGET - ($(date +%s) - T_START) - 10 ))
  if [ "$gpus" -gt "$NGPU" ]; then
    log "skip $name: needs $gpus GPUs, have $NGPU"
    echo "{\"name\":\"$name\",\"kind\":\"$kind\",\"gpus\":$gpus,\"status\":\"skipped\",\"why\":\"needs $gpus GPUs\"}" >> "$STAGES"
    return 0
  fi
  if [ "$left" -lt 45 ]; then
    log "skip $name: only ${left}s of the budget left"
    echo "{\"name\":\"$name\",\"kind\":\"$kind\",\"gpus\":$gpus,\"status\":\"skipped\",\"why\":\"budget\"}" >> "$STAGES"
    return 0
  fi
  local cut=0
  [ "$tmo" -gt "$left" ] && tmo=$left && cut=1
  log "start $name (timeout ${tmo}s): $*"
  local t0=$(date +%s) rc pid
  # own process group, so the ranks Lightning/torchrun start go with it
  setsid timeout -k 15 "$tmo" "$@" > "$LOGS/$name.log" 2>&1 &
  pid=$!
  wait "$pid"
  rc=$?
  kill -9 -- "-$pid" 2>/dev/null
  local dt=$(( $(date +%s) - t0 ))
  local status=ok
  [ $rc -ne 0 ] && status=failed
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && status=timeout
  # killed at the end of the budget, not by its own timeout: --continue runs it again
  [ "$status" = timeout ] && [ "$cut" = 1 ] && status=skipped
  log "end   $name rc=$rc ${dt}s ($status); log: logs/$name.log"
  [ $rc -ne 0 ] && tail -n 8 "$LOGS/$name.log" | sed 's/^/    | /' | tee -a "$LOGS/bench.log"
  # one JSON line per stage; the command is kept for the results table
  $PY - "$STAGES" "$name" "$kind" "$gpus" "$status" "$rc" "$dt" "$WORK" "$*" <<'EOF'
import json, sys
path, name, kind, gpus, status, rc, dt, work, cmd = sys.argv[1:]
row = dict(name=name, kind=kind, gpus=int(gpus), status=status, rc=int(rc), seconds=int(dt),
           command=cmd, log=f"logs/{name}.log",
           result=f"{work}/{name}.json" if kind == "anchor" else f"{work}/runs/{name}/throughput.json",
           run_dir=None if kind == "anchor" else f"{work}/runs/{name}")
open(path, "a").write(json.dumps(row) + "\n")
EOF
  # free the GPUs of any straggler of this stage before the next one
  sleep 1
  summarise
}

anchor() {  # anchor NAME GPUS [extra args]
  local name=$1 gpus=$2; shift 2
  run_stage "$name" anchor "$gpus" "$STAGE_T" \
    $PY -m torch.distributed.run --standalone --nproc-per-node "$gpus" \
    "$ROOT/scripts/bench/e2e_torchrec_anchor.py" "${ANCHOR_DEV[@]}" --global-batch "$GB" \
    --rows-cap "$ROWS_CAP" --warmup "$WARMUP" --steps "$ANCHOR_STEPS" --sync-every "$SYNC" \
    --out "$WORK/$name.json" "$@"
}

swapin() {  # swapin NAME GPUS [extra args]: the user-style module with strategy="torchrec"
  local name=$1 gpus=$2; shift 2
  local dev=(--batch-size "$GB" --rows-cap "$ROWS_CAP")
  [ "$MODE" = cpu ] && dev=(--cpu-smoke)
  run_stage "$name" swapin "$gpus" "$STAGE_T" \
    $PY "$ROOT/scripts/bench/swapin_user_module.py" "${dev[@]}" --warmup "$WARMUP" \
    --steps "$ANCHOR_STEPS" --sync-every "$SYNC" --out-dir "$WORK/runs/$name" "$@"
}

swapin_rounds() {  # swapin_rounds BASE GPUS ROUNDS [extra args]: the loader-fed and pre-staged
  # user module, ROUNDS interleaved rounds in one process (a new module and Trainer per fit:
  # one start-up instead of 2 x ROUNDS); each fit becomes its own row BASE_loader[_rK], BASE[_rK]
  local base=$1 gpus=$2 rounds=$3; shift 3
  local dev=(--batch-size "$GB" --rows-cap "$ROWS_CAP")
  [ "$MODE" = cpu ] && dev=(--cpu-smoke)
  local set="${base}_rounds"
  run_stage "$set" swapin-set "$gpus" $(( STAGE_T + 40 * rounds )) \
    $PY "$ROOT/scripts/bench/swapin_user_module.py" "${dev[@]}" --warmup "$WARMUP" \
    --steps "$ANCHOR_STEPS" --sync-every "$SYNC" --out-dir "$WORK/runs/$set" \
    --feeds loader,staged --rounds "$rounds" "$@"
  grep -qE "\"name\": ?\"$set\", ?\"kind\": ?\"swapin-set\".*\"status\": ?\"(ok|failed|timeout)\"" "$STAGES" || return 0
  local k feed name sfx
  for k in $(seq 1 "$rounds"); do
    sfx=$([ "$k" = 1 ] || echo "_r$k")
    for feed in loader staged; do
      name=$base$([ "$feed" = loader ] && echo _loader)$sfx
      grep -qE "\"name\": ?\"$name\"" "$STAGES" && continue
      local res="$WORK/runs/$set/${feed}_r$k/throughput.json"
      local st=ok; [ -f "$res" ] || st=failed
      echo "{\"name\": \"$name\", \"kind\": \"swapin\", \"gpus\": $gpus, \"status\": \"$st\", \"rc\": 0, \"seconds\": 0, \"command\": \"(round $k of $set)\", \"log\": \"logs/$set.log\", \"result\": \"$res\", \"run_dir\": \"$WORK/runs/$set/${feed}_r$k\"}" >> "$STAGES"
    done
  done
  summarise
}

rocm() {  # rocm NAME GPUS [overrides]: the recipe AS SHIPPED; only the run's length, the rows
  # cap, the run dir, checkpointing and measurement switches are set here (CPU smoke: small shapes)
  # RT_TIMEOUT=S rocm ...: a longer timeout than STAGE_T (a stage that compiles for minutes)
  local name=$1 gpus=$2; shift 2
  run_stage "$name" rocmtrain "$gpus" "${RT_TIMEOUT:-$STAGE_T}" \
    $PY -m rocmtrain recipe=dlrm_dcnv2_h200 "${RT_CPU[@]}" trainer.devices="$gpus" \
    model.max_rows_per_table="$ROWS_CAP" data.num_train_batches="$TRAIN_BATCHES" \
    trainer.max_epochs=1 checkpoint=off run_dir="$WORK/runs/$name" \
    monitor.throughput_warmup_steps="$WARMUP" monitor.throughput_window_steps="$SYNC" "$@"
}

PROF=(profile=true "monitor.profiler_wait_steps=$PROF_WAIT" "monitor.profiler_warmup_steps=$PROF_WARM"
      monitor.profiler_active_steps=3 monitor.profiler_top_k=30)
SYNCS=(monitor.sync_report_steps=4 monitor.sync_report_start_step=9)
if [ "$MODE" = cpu ]; then
  # the recipe on 2 gloo CPU ranks with tiny shapes: tests the stages' logic, not speed
  RT_CPU=(trainer=cpu strategy.backend=gloo "data.batch_size=\${per_rank_batch:$GB}"
          model.embedding_dim=16 model.dense_arch_layer_sizes=[32,16] model.over_arch_layer_sizes=[32,16,1]
          model.dcn_low_rank_dim=16 model.auc_num_thresholds=200 strategy.pipeline=sparse_dist
          model.compile_interaction=false model.compile_dense=false model.compile_mode=default
          precision=fp32
          data.num_val_batches=1)
  ANCHOR_SMALL=(--dim 16 --small-dense)
else
  RT_CPU=(); ANCHOR_SMALL=()
fi
# the throughput stages skip validation; the user's command and the convergence pair validate
NOVAL=(trainer.limit_val_batches=0)
# the recipe's step levers undone: the kernel's id check on, the dense Adagrad step eager
BEFORE=(model.embedding_bounds_check=on model.dense_optimizer_impl=foreach)
# file sets for the data=criteo_multihot / criteo_npy stages, written once per --work folder
SETS=$WORK/sets
write_sets() {
  [ -f "$SETS/done" ] && return 0
  if [ -n "$ONLY" ] && ! selected rt_1gpu_fbgemm_bf16_multihot && ! selected rt_1gpu_fbgemm_bf16_onehot; then
    return 0
  fi
  local rows=3145728,3145728,262144
  [ "$MODE" = cpu ] && rows=2048,2048,512
  log "writing the multi-hot and one-hot file sets ($rows rows) to $SETS"
  PYTHON=$PY bash "$ROOT/scripts/bench/make_multihot_set.sh" "$SETS" --rows "$rows" \
    > "$LOGS/write_sets.log" 2>&1 && touch "$SETS/done"
  log "sets: $(grep -h 'written in' "$LOGS/write_sets.log" | tr '\n' ' ')"
}
MULTIHOT=(data=criteo_multihot "data.path=$SETS/multihot" "data.days=[0,1,2]")
ONEHOT=(data=criteo_npy "data.path=$SETS/onehot" "data.days=[0,1,2]" data.val_fraction=0.02
        model.multi_hot_sizes=null)
A1=(--bf16 "${ANCHOR_SMALL[@]}")
# Stages in priority order (the budget cuts from the end):
#   rt_1gpu_fbgemm_bf16[_rK]: the recipe as shipped (data made on the GPU, new every step), five
#            rounds interleaved with the tuned anchor anchor_1gpu_bf16_compiled[_rK] (the DCN
#            cross net compiled in place, a few pinned batches cycled: no data cost at all)
#   rt_1gpu_fbgemm_bf16_fresh: the user's command, verbatim but for run_dir: `python -m rocmtrain
#            recipe=dlrm_dcnv2_h200 trainer.max_epochs=1 data.num_train_batches=200` (validation
#            included); anchor_1gpu_bf16_compiled_fresh: the plain TorchRec anchor trained on the
#            same samples (the recipe's generator on the GPU, same seed) and validated on the same
#            batches: the convergence pair
#   swapin_*: a user's own LightningModule (torchrec's DLRMTrain) with strategy="torchrec";
#            _loader: fed by an ordinary DataLoader(pin_memory=True) of new CPU batches every step;
#            without: pre-staged pinned batches; anchor_*_loader: plain TorchRec fed by the same
#            DataLoader; _compiled: the cross net compiled in __init__ (both sides)
#   rt_1gpu_fbgemm_bf16_multihot[_rK]: the recipe trained from MLPerf's multi-hot file layout
#            (data=criteo_multihot, 6.3 M rows written by make_multihot_set.sh), rounds 1-3;
#            _onehot: the same rows one-hot (data=criteo_npy)
#   rt_1gpu_fbgemm_bf16_semi[_rK]: the recipe with strategy.pipeline=semi_sync (the embedding
#            work on a side stream under the dense work, one step stale), rounds 1-3
#   rt_1gpu_fbgemm_bf16_before[_rK]: the recipe with its step levers undone (BEFORE), rounds
#            1-3, profiled in round 1; _boundson / _optforeach: one lever undone each
#            (model.embedding_bounds_check=on / model.dense_optimizer_impl=foreach); _embfp16:
#            the tables in fp16 (a memory lever), rounds 1-3
#   rt_1gpu_fbgemm_bf16_maxat[_rK]: model.compile_mode=max-autotune (Inductor's Triton GEMMs with
#            fused epilogues timed against cuBLAS per shape), rounds 1-3, profiled in round 1;
#            its first round autotunes for minutes (a longer timeout; later rounds hit the cache)
#   rt_1gpu_fbgemm_bf16_ddpopt[_rK]: model.compile_ddp_optimizer=true (each compiled part split
#            into one graph per DDP bucket, torch.compile's default under DDP), rounds 1-3,
#            profiled in round 1
convergence_pair() {  # convergence_pair SFX SEED: the user's command verbatim (200 batches, its
  # validation) and plain TorchRec on the same samples (the recipe's generator on the GPU)
  local sfx=$1 seed=$2 batches val saved extra=()
  batches=$([ "$MODE" = cpu ] && echo 8 || echo 200)
  val=$([ "$MODE" = cpu ] && echo 1 || echo 20)
  [ "$seed" = 1234 ] || extra=("seed=$seed")
  saved=$TRAIN_BATCHES; TRAIN_BATCHES=$batches
  rocm "rt_1gpu_fbgemm_bf16_fresh$sfx" 1 "${extra[@]}"
  TRAIN_BATCHES=$saved
  anchor "anchor_1gpu_bf16_compiled_fresh$sfx" 1 "${A1[@]}" --compile --fresh-epochs 1 \
    --steps "$batches" --val-batches "$val" --generate-on device --seed "$seed"
}

for rep in 1 2 3 4 5; do
  sfx=$([ "$rep" = 1 ] || echo "_r$rep")
  if [ "$rep" = 1 ]; then
    anchor anchor_1gpu_bf16_compiled 1 "${A1[@]}" --compile \
      --profile-dir "$WORK/runs/anchor_1gpu_bf16_compiled/profile" --profile-wait "$PROF_WAIT" \
      --profile-warmup "$PROF_WARM"
    rocm rt_1gpu_fbgemm_bf16 1 "${NOVAL[@]}" "${PROF[@]}" "${SYNCS[@]}"
  else
    anchor "anchor_1gpu_bf16_compiled$sfx" 1 "${A1[@]}" --compile
    rocm "rt_1gpu_fbgemm_bf16$sfx" 1 "${NOVAL[@]}"
  fi
  if [ "$rep" -le 3 ]; then  # lever: the embedding work on a side stream (one step stale)
    prof=(); [ "$rep" = 1 ] && prof=("${PROF[@]}")
    rocm "rt_1gpu_fbgemm_bf16_semi$sfx" 1 strategy.pipeline=semi_sync "${NOVAL[@]}" "${prof[@]}"
  fi
  if [ "$rep" -le 3 ]; then  # the recipe without its step levers (before), each lever undone
    prof=(); [ "$rep" = 1 ] && prof=("${PROF[@]}")
    rocm "rt_1gpu_fbgemm_bf16_before$sfx" 1 "${BEFORE[@]}" "${NOVAL[@]}" "${prof[@]}"
    rocm "rt_1gpu_fbgemm_bf16_boundson$sfx" 1 model.embedding_bounds_check=on "${NOVAL[@]}"
    rocm "rt_1gpu_fbgemm_bf16_optforeach$sfx" 1 model.dense_optimizer_impl=foreach "${NOVAL[@]}"
    rocm "rt_1gpu_fbgemm_bf16_embfp16$sfx" 1 model.embedding_weight_dtype=fp16 "${NOVAL[@]}"
  fi
  if [ "$rep" -le 3 ] && [ "$MODE" = gpu ]; then  # lever: Inductor's autotuned GEMMs (the CPU
    # smoke compiles nothing)
    prof=(); tmo=$STAGE_T; [ "$rep" = 1 ] && prof=("${PROF[@]}") && tmo=$(( STAGE_T + 210 ))
    RT_TIMEOUT=$tmo rocm "rt_1gpu_fbgemm_bf16_maxat$sfx" 1 model.compile_mode=max-autotune \
      "${NOVAL[@]}" "${prof[@]}"
  fi
  if [ "$rep" -le 3 ] && [ "$MODE" = gpu ]; then  # lever undone: Dynamo's DDP optimizer splits
    # each compiled part at DDP's buckets (torch.compile's default; the CPU smoke compiles nothing)
    prof=(); [ "$rep" = 1 ] && prof=("${PROF[@]}")
    rocm "rt_1gpu_fbgemm_bf16_ddpopt$sfx" 1 model.compile_ddp_optimizer=true "${NOVAL[@]}" \
      "${prof[@]}"
  fi
  [ "$rep" = 1 ] && convergence_pair "" 1234
  if [ "$rep" -le 3 ]; then  # the recipe trained from MLPerf-layout multi-hot files
    write_sets
    rocm "rt_1gpu_fbgemm_bf16_multihot$sfx" 1 "${MULTIHOT[@]}" "${NOVAL[@]}"
  fi
  if [ "$rep" = 1 ]; then  # a user's module: loader-fed vs pre-staged, 3 rounds in one process
    swapin_rounds swapin_1gpu_bf16_compiled 1 3 --compile
    swapin_rounds swapin_1gpu_bf16 1 3
  fi
  if [ "$rep" -le 3 ]; then  # plain TorchRec fed by the same DataLoader
    anchor "anchor_1gpu_bf16_compiled_loader$sfx" 1 "${A1[@]}" --compile --feed loader
    anchor "anchor_1gpu_bf16_loader$sfx" 1 "${A1[@]}" --feed loader
  fi
done
convergence_pair _r2 4321  # the convergence pair again with another seed: its spread
# the one-hot files (the recipe's shapes one-hot: a speed reading, no target)
rocm rt_1gpu_fbgemm_bf16_onehot 1 "${ONEHOT[@]}" "${NOVAL[@]}"
# levers the benchmark still explores, each on top of the recipe as shipped
rocm rt_1gpu_triton_bf16 1 kernel=triton "${NOVAL[@]}"
# the multi-hot reader's thread count around its auto value (at most 4)
write_sets
rocm rt_1gpu_fbgemm_bf16_multihot_t8 1 "${MULTIHOT[@]}" data.read_threads=8 "${NOVAL[@]}"
rocm rt_1gpu_fbgemm_bf16_multihot_t2 1 "${MULTIHOT[@]}" data.read_threads=2 "${NOVAL[@]}"
# the tables in fp16 (rounds above): its convergence, the user's command with the lever, to hold
# against anchor_1gpu_bf16_compiled_fresh
saved=$TRAIN_BATCHES; TRAIN_BATCHES=$([ "$MODE" = cpu ] && echo 8 || echo 200)
rocm rt_1gpu_fbgemm_bf16_embfp16_fresh 1 model.embedding_weight_dtype=fp16
TRAIN_BATCHES=$saved
rocm rt_1gpu_fbgemm_bf16_nocg 1 model.compile_mode=default "${NOVAL[@]}"
rocm rt_1gpu_fbgemm_bf16_cpugen 1 data.generate_on=cpu "${NOVAL[@]}"
rocm rt_2gpu_fbgemm_bf16 2 "${NOVAL[@]}"
anchor anchor_2gpu_bf16_compiled 2 "${A1[@]}" --compile

# Small files of every run dir + all logs -> one archive.
( cd "$WORK" && find runs -maxdepth 4 \( -name throughput.json -o -name step_stats.json \
    -o -name 'top_kernels*.md' -o -name 'top_kernels*.txt' -o -name '*.csv' \
    -o -name 'step_timeline*.json' -o -name 'op_counts*.json' -o -name 'syncs_rank*' \) -size -2M -print0 \
    | tar --null -czf "$E2E/logs.tar.gz" logs stages.jsonl -T - ) 2>/dev/null \
  || tar -czf "$E2E/logs.tar.gz" -C "$WORK" logs stages.jsonl
summarise
log "done in $(( $(date +%s) - T_START ))s: $E2E/summary.md"
cat "$E2E/summary.md" 2>/dev/null
exit 0
