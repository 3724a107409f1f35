#!/usr/bin/env bash
# start-slurm.sh - real single-machine Slurm for CI (Debian 12 packages, Slurm 22.05). Run as root.
# Used by .ci/run (SLURM_NODES=2) before the tests; scripts/ci/stop-slurm.sh undoes it.
# Adapted from the project's verified recipe: no systemd, no cgroups (proctrack/linuxproc, task/none),
# fast scheduling (batch_sched_delay=0, sched_interval=5) and fast requeue (cred_expire=10).
# rocmtrain addition: fake node names n1..nN are added to /etc/hosts (127.0.0.1) so that, as on a real
# cluster, the first node's name in SLURM_JOB_NODELIST resolves: Lightning's SLURMEnvironment uses
# it as MASTER_ADDR. The line carries a marker and stop-slurm.sh removes it.
#   SLURM_NODES=1  one node named $(hostname -s);  N>1: fake nodes n[1-N] (one slurmd each, Debian build has MULTIPLE_SLURMD)
#   SLURM_ACCOUNTING=1  also MariaDB + slurmdbd so that sacct works (submitit needs it to notice cancelled/killed jobs)
#   SLURM_STATE=/tmp/slurm  state, logs, pid files (wiped on every start)
#   SLURM_CONF=/etc/slurm/slurm.conf  where the config goes; another path (with SLURM_PORT=6827,
#     SLURMD_PORT_BASE=17100, SLURM_STATE elsewhere, SLURM_ACCOUNTING=0) runs a second cluster beside
#     one already running on this machine, reached by clients that have that SLURM_CONF
#   ROCMTRAIN_CI_SLURM_MARKER=/run/rocmtrain-ci-slurm/cluster.json  written once every node is idle:
#     names the cluster started here (ClusterName, controller, nodes, slurmctld pid). The Slurm tests
#     submit jobs only to the cluster it names (tests/launch/conftest.py); stop-slurm.sh removes it.
set -euo pipefail
NODES=${SLURM_NODES:-1}; ACCT=${SLURM_ACCOUNTING:-1}; S=${SLURM_STATE:-/tmp/slurm}
MARKER=${ROCMTRAIN_CI_SLURM_MARKER:-/run/rocmtrain-ci-slurm/cluster.json}
export SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}; CONF_DIR=$(dirname "$SLURM_CONF")
CTLD_PORT=${SLURM_PORT:-6817}; SLURMD_BASE=${SLURMD_PORT_BASE:-17000}
# a name of our own, so that the tests can tell this cluster from any other that answers sinfo
CLUSTER=rocmtrain_ci
export DEBIAN_FRONTEND=noninteractive
log() { echo "[start-slurm $(date +%T)] $*"; }

# 1. packages (apt never starts daemons here: no systemd, and /usr/sbin/policy-rc.d may deny it)
pkgs="munge slurmctld slurmd slurm-client"; [ "$ACCT" = 1 ] && pkgs="$pkgs slurmdbd mariadb-server"
missing=""; for p in $pkgs; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"; done
if [ -n "$missing" ]; then
  log "installing:$missing"; apt-get update -qq
  apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
fi
if [ -s "$S/slurmctld.pid" ] && kill -0 "$(cat "$S/slurmctld.pid")" 2>/dev/null; then
  log "slurmctld already running (pid $(cat "$S/slurmctld.pid")): stopping it first (fresh state)"
  bash "$(dirname "$0")/stop-slurm.sh"; fi

rm -f "$MARKER"   # a cluster being (re)started is not ready for the tests yet
H=$(hostname -s); CPUS=$(nproc); MEM=$(( $(free -m | awk '/^Mem:/{print $2}') * 9 / 10 ))
rm -rf "$S"; mkdir -p "$S/ctld" "$S/log"

# 2. munge: key is made by the package's postinst; make one if it is missing
if [ ! -s /etc/munge/munge.key ]; then mungekey -c -f -k /etc/munge/munge.key; fi
chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
mkdir -p /run/munge; chown munge:munge /run/munge; chmod 755 /run/munge  # systemd's RuntimeDirectory does this normally
if ! munge -n </dev/null >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged </dev/null >/dev/null 2>&1     # daemonizes, writes /run/munge/munged.pid
  cp /run/munge/munged.pid "$S/munged.pid"
  for i in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
fi
munge -n </dev/null | unmunge >/dev/null

# 3. slurm.conf (SlurmUser=root: no ownership problems with the state dirs under /tmp)
if [ "$NODES" = 1 ]; then
  NAMES="$H"; NODELINE="NodeName=$H NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"
else
  NAMES=$(seq -f 'n%g' 1 "$NODES")
  NODELINE="NodeName=n[1-$NODES] NodeHostname=$H NodeAddr=127.0.0.1 Port=[$((SLURMD_BASE+1))-$((SLURMD_BASE+NODES))] CPUs=$CPUS RealMemory=$((MEM/NODES)) State=UNKNOWN"
fi
if [ "$ACCT" = 1 ]; then
  ACCTCONF=$'AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\nJobAcctGatherType=jobacct_gather/linux'
else
  ACCTCONF=$'AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none'
fi
mkdir -p "$CONF_DIR"
cat > "$SLURM_CONF" <<EOF
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=5,bf_interval=5
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
$ACCTCONF
JobCompType=jobcomp/filetxt
JobCompLoc=$S/log/jobcomp.txt
StateSaveLocation=$S/ctld
SlurmdSpoolDir=$S/d-%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd-%n.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd-%n.log
$NODELINE
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

# 4. accounting: MariaDB (datadir already initialised by the package) + slurmdbd
if [ "$ACCT" = 1 ]; then
  mkdir -p /run/mysqld; chown mysql:mysql /run/mysqld
  if ! mariadb-admin ping >/dev/null 2>&1; then
    setsid /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 --pid-file=/run/mysqld/mysqld.pid \
      </dev/null >"$S/log/mariadb.log" 2>&1 &
    for i in $(seq 100); do mariadb-admin ping >/dev/null 2>&1 && break; sleep 0.2; done
    cp /run/mysqld/mysqld.pid "$S/mariadb.pid"
  fi
  mariadb -e "DROP DATABASE IF EXISTS slurm_acct_db;  -- job ids restart at 1 with the wiped state dir
              CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
              GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  cat > "$CONF_DIR/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
LogFile=$S/log/slurmdbd.log
PidFile=$S/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$CONF_DIR/slurmdbd.conf"     # slurmdbd checks: mode 600, owner = SlurmUser
  /usr/sbin/slurmdbd </dev/null >/dev/null 2>&1
  for i in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.2; done
fi

# 4b. fake node names must resolve (MASTER_ADDR = first node of the job, as on a real cluster)
HOSTS_MARK="# rocmtrain-ci-slurm"
if [ "$NODES" != 1 ]; then
  missing_names=""; for n in $NAMES; do getent hosts "$n" >/dev/null || missing_names="$missing_names $n"; done
  if [ -n "$missing_names" ]; then
    if { echo "127.0.0.1$missing_names $HOSTS_MARK" >> /etc/hosts; } 2>/dev/null; then
      log "added to /etc/hosts: 127.0.0.1$missing_names"
      touch "$S/hosts-added"   # stop-slurm.sh removes the line only when this start added it
    else
      log "WARNING: /etc/hosts not writable: node names$missing_names do not resolve; multi-node jobs need MASTER_ADDR"
    fi
  fi
fi

# the marker the Slurm tests check (written to a temp file and renamed: never seen half-written)
write_marker() {
  local nodes_json
  nodes_json=$(printf '"%s",' $NAMES); nodes_json="[${nodes_json%,}]"
  mkdir -p "$(dirname "$MARKER")"
  cat > "$MARKER.tmp" <<EOF
{"cluster": "$CLUSTER", "control_host": "localhost", "slurm_conf": "$SLURM_CONF",
 "nodes": $nodes_json, "slurmctld_pid": $(cat "$S/slurmctld.pid"), "state_dir": "$S",
 "started": "$(date -u +%FT%TZ)", "start_command": "SLURM_NODES=$NODES bash scripts/ci/start-slurm.sh"}
EOF
  mv -f "$MARKER.tmp" "$MARKER"
}

# 5. controller + node daemon(s); both daemonize and write their pid files
/usr/sbin/slurmctld -f "$SLURM_CONF" </dev/null >/dev/null 2>&1
for n in $NAMES; do /usr/sbin/slurmd -f "$SLURM_CONF" -N "$n" </dev/null >/dev/null 2>&1; done

# 6. wait until every node is idle
for i in $(seq 300); do
  st=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u || true)
  if [ "$(echo "$st" | grep -c ' idle$')" = "$NODES" ]; then
    write_marker; log "ready: $(echo $st); marker $MARKER"; exit 0
  fi
  sleep 0.2
done
log "nodes not idle after 60s: $st"; tail -n 20 "$S"/log/*.log; exit 1
