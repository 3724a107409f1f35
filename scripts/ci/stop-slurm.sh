#!/usr/bin/env bash
# stop-slurm.sh - stop what scripts/ci/start-slurm.sh started, by the pids it recorded (nothing else)
S=${SLURM_STATE:-/tmp/slurm}
export SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}   # squeue/scancel reach this cluster only
# first the marker: from now on the Slurm tests skip instead of submitting to a cluster going away
rm -f "${ROCMTRAIN_CI_SLURM_MARKER:-/run/rocmtrain-ci-slurm/cluster.json}"
if jobs=$(squeue -h -o %i 2>/dev/null) && [ -n "$jobs" ]; then   # cancel jobs first, so no slurmstepd is orphaned
  scancel $jobs
  for i in $(seq 150); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
fi
stop() {  # SIGTERM the pids in the given pid files, wait up to 30 s, then SIGKILL
  local f pids=()
  for f in "$@"; do [ -s "$f" ] && pids+=("$(cat "$f")") && rm -f "$f"; done
  [ ${#pids[@]} = 0 ] && return; kill "${pids[@]}" 2>/dev/null
  for i in $(seq 300); do kill -0 "${pids[@]}" 2>/dev/null || return 0; sleep 0.1; done
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && { echo "pid $p ignored SIGTERM: SIGKILL"; kill -9 "$p"; }; done
}
stop "$S"/slurmd-*.pid "$S/slurmctld.pid" "$S/slurmdbd.pid"
stop "$S/mariadb.pid" "$S/munged.pid"
# fake node names start-slurm.sh added to /etc/hosts (rewritten in place: /etc/hosts may be a bind mount);
# only when this cluster's start added them: a second cluster beside another one leaves them to it
if [ -e "$S/hosts-added" ] && grep -q "# rocmtrain-ci-slurm" /etc/hosts 2>/dev/null; then
  rm -f "$S/hosts-added"
  kept=$(grep -v "# rocmtrain-ci-slurm" /etc/hosts); printf '%s\n' "$kept" > /etc/hosts
fi
# full clean-up, if wanted: rm -rf "$S" /etc/slurm/slurm.conf /etc/slurm/slurmdbd.conf
#   apt-get purge -y slurmctld slurmd slurm-client slurmdbd munge mariadb-server
