#!/usr/bin/env bash
# A real one-node Slurm on this machine, for trying and testing the Slurm launcher
# (`ctrlmem sweep CONFIG --launcher slurm`, `ctrlmem run --emit-sbatch`) without a cluster.
#
# Usage: bash scripts/slurm-local.sh start|stop|status|env
#
#   start   install Debian's slurm-wlm and munge if missing (root only), write a slurm.conf for
#           this host, start munged, slurmctld and slurmd, wait until the node is idle, and print
#           the `export SLURM_CONF=...` line that sbatch/squeue/scancel need.
#   stop    cancel every job of this local cluster, wait for them to end, shut the daemons down
#           (scontrol shutdown, then the recorded pids) and check that none is left.
#   status  say whether the daemons run; sinfo and squeue when they do. Exit 0 if up, 3 if down.
#   env     print the export line for SLURM_CONF.
#
# Everything (configuration, munge key and socket, state, spool, logs, pid files, the job
# completion log) lives in $CTRLMEM_SLURM_DIR (default ${TMPDIR:-/tmp}/ctrlmem-slurm). The
# daemons run as root with ProctrackType=proctrack/linuxproc and TaskPlugin=task/none (no
# cgroups), SelectType=select/cons_tres, jobs' end states in jobcomp/filetxt (no slurmdbd).
# Ports: 6817/6818 unless CTRLMEM_SLURM_PORTS="CTLD,SLURMD" says otherwise.
set -euo pipefail

DIR=${CTRLMEM_SLURM_DIR:-${TMPDIR:-/tmp}/ctrlmem-slurm}
CONF=$DIR/slurm.conf
PORTS=${CTRLMEM_SLURM_PORTS:-6817,6818}
CTLD_PORT=${PORTS%,*}
SLURMD_PORT=${PORTS#*,}

die() { echo "slurm-local: $*" >&2; exit 2; }

# The daemon of pid file $1 (NAME.pid) is alive: its process exists, is not a zombie, and is still
# called NAME (so a pid reused by another program is never taken for it, nor signalled).
pid_alive() {
  local pid stat
  [ -f "$1" ] || return 1
  pid=$(cat "$1" 2>/dev/null || true)
  case "$pid" in ''|*[!0-9]*) return 1 ;; esac
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$(basename "$1" .pid)" ] || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

ensure_packages() {
  if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 \
     && command -v munged >/dev/null 2>&1 && command -v sbatch >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    die "slurm-wlm and munge are not installed; install them (Debian: apt-get install slurm-wlm munge) as root"
  fi
  echo "slurm-local: installing Debian's slurm-wlm and munge..." >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_conf() {
  local host node_line
  host=$(hostname -s)
  node_line=$(slurmd -C 2>/dev/null | head -n 1)
  [ -n "$node_line" ] || node_line="NodeName=$host CPUs=$(nproc)"
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/munge"
  cat > "$CONF" <<EOF
# written by scripts/slurm-local.sh: a one-node cluster for ctrlmem's Slurm launcher
ClusterName=ctrlmem-local
SlurmctldHost=$host
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
MinJobAge=3600
KillWait=5
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munge() {
  if pid_alive "$DIR/munged.pid"; then return 0; fi
  if [ ! -s "$DIR/munge/munge.key" ]; then
    (umask 077; dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none)
  fi
  chmod 700 "$DIR/munge"
  chmod 400 "$DIR/munge/munge.key"
  munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$DIR/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munge.seed"
}

cmd_start() {
  [ "$(id -u)" = 0 ] || die "start needs root (slurmd runs each job as its user); run it as root, or use your cluster's Slurm"
  ensure_packages
  if pid_alive "$DIR/slurmctld.pid" && pid_alive "$DIR/slurmd.pid"; then
    echo "slurm-local: already running (state in $DIR)" >&2
    echo "export SLURM_CONF=$CONF"
    return 0
  fi
  mkdir -p "$DIR"
  write_conf
  start_munge
  pid_alive "$DIR/slurmctld.pid" || slurmctld -f "$CONF" -c -i
  pid_alive "$DIR/slurmd.pid" || slurmd -f "$CONF"
  export SLURM_CONF=$CONF
  local state=""
  for _ in $(seq 1 60); do
    state=$(sinfo -h -o '%T' 2>/dev/null | head -n 1 || true)
    case "$state" in idle|mixed|allocated) break ;; esac
    sleep 0.5
  done
  case "$state" in
    idle|mixed|allocated) ;;
    *) echo "slurm-local: the node did not become idle (state: ${state:-no answer}); logs in $DIR/log" >&2
       cmd_stop >&2 || true
       exit 1 ;;
  esac
  echo "slurm-local: up (node $(hostname -s), state in $DIR)" >&2
  echo "export SLURM_CONF=$CONF"
}

cmd_stop() {
  export SLURM_CONF=$CONF
  if pid_alive "$DIR/slurmctld.pid"; then
    scancel --quiet --partition=local 2>/dev/null || true  # SIGTERM, SIGKILL after KillWait
    for _ in $(seq 1 40); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
    scontrol shutdown >/dev/null 2>&1 || true
  fi
  local f
  for f in slurmd slurmctld munged; do
    if pid_alive "$DIR/$f.pid"; then
      kill "$(cat "$DIR/$f.pid")" 2>/dev/null || true
    fi
  done
  for _ in $(seq 1 40); do
    if ! pid_alive "$DIR/slurmd.pid" && ! pid_alive "$DIR/slurmctld.pid" && ! pid_alive "$DIR/munged.pid"; then
      break
    fi
    sleep 0.25
  done
  for f in slurmd slurmctld munged; do
    if pid_alive "$DIR/$f.pid"; then
      kill -9 "$(cat "$DIR/$f.pid")" 2>/dev/null || true
    fi
  done
  sleep 0.2
  local left=""
  for f in slurmd slurmctld munged; do
    if pid_alive "$DIR/$f.pid"; then left="$left $f"; fi
    rm -f "$DIR/$f.pid"
  done
  [ -z "$left" ] || die "still running:$left"
  echo "slurm-local: stopped (state kept in $DIR)" >&2
}

cmd_status() {
  local up=1 f
  for f in munged slurmctld slurmd; do
    if pid_alive "$DIR/$f.pid"; then
      echo "$f: running (pid $(cat "$DIR/$f.pid"))"
    else
      echo "$f: not running"; up=0
    fi
  done
  if [ "$up" = 1 ]; then
    export SLURM_CONF=$CONF
    sinfo || true
    squeue || true
    return 0
  fi
  return 3
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: bash scripts/slurm-local.sh start|stop|status|env" >&2; exit 2 ;;
esac
