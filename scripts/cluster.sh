#!/usr/bin/env bash
# A real Slurm cluster of several nodes on this one Debian 12 machine (run as root).
#
#   scripts/cluster.sh up [--slurm V]  start munge, MariaDB + slurmdbd, slurmctld and NNODES slurmd
#   scripts/cluster.sh down            stop all of it (by pid files), remove namespaces
#   scripts/cluster.sh status          sinfo + squeue
#
# --slurm 22.05 (default: Debian 12's packages on this host), 24.11 (Debian 13's) or 26.05 (Debian unstable's): the
#   newer ones from a debootstrap chroot (scripts/slurm_root.sh builds it), run with the chroot's loader and libraries
#   against this host's files, so munge, MariaDB 10.11 and the jobs' python stay the host's. Their clients and
#   daemons are wrappers in $LAB/bin; in each node's mount namespace they also stand in for /usr/bin/srun, ... and
#   /usr/sbin/slurmstepd, so a job's inner srun is the cluster's version whatever its PATH.
# Settings (environment): LAB=/tmp/hpc-slurm  NNODES=4  CPUS=2 (per node)
#   GPUS=2 (fake gres/gpu per node: --gpus-per-node and CUDA_VISIBLE_DEVICES behave
#   as on a GPU cluster; the devices are /dev/null clones, there is no CUDA and no NVIDIA driver)
#   NNODES8=2 (nodes after n1..nN, in partition gpu8 only, with 8 fake GPUs and 8 CPUs
#   each: the CPUs are oversubscribed, for rank wiring with stub ranks; 0: none)
#   ACCT=1 (MariaDB + slurmdbd, so sacct and submitit's state polling are real)
#   MODE=netns (default: one network + UTS namespace per node, with its own hostname
#              n1..nN and address $NET.1X on interface eth0 behind the private
#              bridge $BRIDGE, so traffic between nodes crosses a real interface)
#   MODE=multi (all slurmd in this host's namespaces, one port each; everything on loopback)
# A second cluster runs beside the first with its own LAB, NETNS (namespaces NETNS-n1..), BRIDGE, VETH (host ends
#   VETH1..), NET (/24 prefix), PORT (slurmctld; slurmd PORT+1, slurmdbd PORT+2, MODE=multi's slurmd PORT+4..) and
#   DB_PORT (its MariaDB); defaults hpcslurm, slbr0, slv, 10.250.0, 6817, 3306.
# Partitions: debug (default), low (preemptible, GraceTime 20 s), high (preempts low), cpu, all on n1..nN; only low's
# jobs are ever preempted, so a test that preempts its own low job leaves the others' jobs running. gpu8: the 8-GPU
# nodes.
# nvidia-smi on the GPU nodes is a TEST FAKE (scripts/fake_nvidia_smi.sh, copied to $LAB/nvidia-smi with the recordings
#   of tests/unit/data/nvidia-smi): each node's mount namespace has it as /usr/bin/nvidia-smi (an overlay; this host has
#   none), answering `nvidia-smi -q` with a recording of the node's GPUs, so the GPU health checks run as on a real node.
# Clients need SLURM_CONF=$LAB/etc/slurm.conf, and with --slurm 24.11/26.05 PATH=$LAB/bin:$PATH (both in $LAB/env.sh).
set -euo pipefail
# The daemons started here outlive this script: they must not inherit its caller's descriptors (a lock held around
# the call, a test runner's output pipe), which would stay open as long as the cluster runs.
for fd in /proc/$$/fd/*; do
  fd=${fd##*/}
  [ "$fd" -gt 2 ] && [ "$fd" -lt 255 ] && eval "exec $fd>&-" 2>/dev/null
done
LAB=${LAB:-/tmp/hpc-slurm}
MODE=${MODE:-netns}
NNODES=${NNODES:-4}
CPUS=${CPUS:-2}
GPUS=${GPUS:-2}
NNODES8=${NNODES8:-2}
GPUS8=8
ALL=$((NNODES + NNODES8))
ACCT=${ACCT:-1}
CRED_EXPIRE=${CRED_EXPIRE:-5}   # also the delay before a requeued job may start again
NET=${NET:-10.250.0}
NETNS=${NETNS:-hpcslurm}
BRIDGE=${BRIDGE:-slbr0}
VETH=${VETH:-slv}
PORT=${PORT:-6817}
DB_PORT=${DB_PORT:-3306}
SLURM_VERSION=22.05
SLURM_ROOT=  # the chroot of a newer Slurm; empty: the host's
CLIENTS="sacct sacctmgr salloc sattach sbatch sbcast scancel scontrol scrontab sdiag sinfo sprio squeue sreport srun sshare sstat strigger"
export SLURM_CONF=$LAB/etc/slurm.conf
T0=$(date +%s%N)
ts() { local ms=$(( ($(date +%s%N) - T0) / 1000000 )); printf '[cluster %d.%03ds] %s\n' $((ms/1000)) $((ms%1000)) "$*"; }

alive() { [ -r "/proc/$1/status" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }
pids_of() { local f; for f in "$@"; do [ -s "$f" ] && alive "$(cat "$f")" && cat "$f"; done; return 0; }
stop_pids() {  # TERM, wait up to 10 s, then KILL
  local p any
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  for _ in $(seq 1 100); do
    any=0; for p in "$@"; do alive "$p" && any=1; done
    [ $any = 0 ] && return 0; sleep 0.1
  done
  for p in "$@"; do alive "$p" && kill -KILL "$p" 2>/dev/null; done; return 0
}

use_slurm() {  # $1: the version; a chroot's: its wrappers in $LAB/bin, first on PATH
  SLURM_VERSION=$1
  case "$1" in
    22.05) SLURM_ROOT=; rm -rf "$LAB/bin" ;;
    24.11 | 26.05) SLURM_ROOT=$(bash "$(dirname "${BASH_SOURCE[0]}")/slurm_root.sh" "$1"); wrappers ;;
    *) echo "cluster.sh: --slurm $1 is not known; allowed: 22.05, 24.11, 26.05" >&2; exit 2 ;;
  esac
}

wrappers() {  # $LAB/bin: links to the chroot's programs (slurm_root.sh made them runnable on the host)
  local name path
  rm -rf "$LAB/bin"
  mkdir -p "$LAB/bin"
  for name in $CLIENTS slurmctld slurmd slurmdbd slurmstepd; do
    for path in "$SLURM_ROOT/usr/bin/$name" "$SLURM_ROOT/usr/sbin/$name-wlm" "$SLURM_ROOT/usr/sbin/$name"; do
      [ -f "$path" ] && [ ! -L "$path" ] && break
    done
    [ -f "$path" ] || { echo "cluster.sh: $name is missing from $SLURM_ROOT" >&2; exit 1; }
    ln -s "$path" "$LAB/bin/$name"
  done
  export PATH=$LAB/bin:$PATH
}

# In a node's mount namespace: the chroot's clients and slurmstepd (slurmd runs /usr/sbin/slurmstepd) over the host's.
node_mounts() {
  local name target
  [ -n "$SLURM_ROOT" ] || return 0
  for name in $CLIENTS slurmstepd; do
    target=/usr/bin/$name
    [ "$name" = slurmstepd ] && target=/usr/sbin/$name
    [ -e "$target" ] && printf 'mount --bind %q %q && ' "$LAB/bin/$name" "$target"
  done
  return 0
}

fake_smi() {  # $LAB/nvidia-smi: the test fake of nvidia-smi, its recordings, and a wrapper per node size (gpus-N/)
  local src n
  src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  rm -rf "$LAB/nvidia-smi"
  mkdir -p "$LAB/nvidia-smi"
  cp "$src/scripts/fake_nvidia_smi.sh" "$src"/tests/unit/data/nvidia-smi/*.txt "$LAB/nvidia-smi/"
  for n in $GPUS $GPUS8; do
    [ "$n" -gt 0 ] || continue
    mkdir -p "$LAB/nvidia-smi/gpus-$n"
    printf '#!/bin/sh\n# scripts/cluster.sh: nvidia-smi of a node of %s fake GPUs, a test fake\nFAKE_NVIDIA_SMI_GPUS=%s FAKE_NVIDIA_SMI_RECORDINGS=%q exec %q "$@"\n' \
      "$n" "$n" "$LAB/nvidia-smi" "$LAB/nvidia-smi/fake_nvidia_smi.sh" >"$LAB/nvidia-smi/gpus-$n/nvidia-smi"
    chmod 755 "$LAB/nvidia-smi/gpus-$n/nvidia-smi"
  done
}

smi_mount() {  # $1: the node's GPUs; a GPU node's /usr/bin with the fake nvidia-smi over it (a shell prefix, or none)
  [ "$1" -gt 0 ] && printf 'mount -t overlay fake-nvidia-smi -o lowerdir=%q:/usr/bin /usr/bin && ' "$LAB/nvidia-smi/gpus-$1"
  return 0
}

plugin_dir() {  # a chroot's Slurm loads its own plugins (a config line, or an empty one)
  [ -z "$SLURM_ROOT" ] || echo "PluginDir=$SLURM_ROOT/usr/lib/x86_64-linux-gnu/slurm-wlm"
}

down() {
  [ -d "$LAB/bin" ] && export PATH=$LAB/bin:$PATH  # the running cluster's own clients
  if [ -n "$(pids_of "$LAB/run/slurmctld.pid")" ]; then
    local jobs; jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      scancel --full $jobs 2>/dev/null || true
      for _ in $(seq 1 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
    fi
  fi
  stop_pids $(pids_of "$LAB"/run/slurmd-*.pid)
  stop_pids $(pids_of "$LAB/run/slurmctld.pid")
  stop_pids $(pids_of "$LAB/run/slurmdbd.pid")
  stop_pids $(pids_of "$LAB/mysql/mariadbd.pid")
  stop_pids $(pids_of "$LAB/munge/munged.pid")
  rm -f "$LAB"/run/*.pid "$LAB/munge/munged.pid" "$LAB/mysql/mariadbd.pid"
  for ns in $(ip netns list 2>/dev/null | awk -v p="$NETNS" '$1 ~ "^" p "-n[0-9]+$" {print $1}'); do ip netns del "$ns"; done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
  ts "down"
}

start_munge() {
  local sock=$LAB/munge/munge.socket.2
  [ -f "$LAB/munge/munge.key" ] || mungekey -c -k "$LAB/munge/munge.key"
  chmod 600 "$LAB/munge/munge.key"
  munged --key-file="$LAB/munge/munge.key" --socket="$sock" --pid-file="$LAB/munge/munged.pid" \
         --log-file="$LAB/munge/munged.log" --seed-file="$LAB/munge/munged.seed"
  for _ in $(seq 1 50); do [ -S "$sock" ] && break; sleep 0.1; done
  munge -S "$sock" -n | unmunge -S "$sock" >/dev/null
  ts "munged up"
}

start_accounting() {
  local db=$LAB/mysql sock=$LAB/munge/munge.socket.2
  mkdir -p "$db"
  if [ ! -d "$db/data/mysql" ]; then
    mariadb-install-db --no-defaults --user=root --datadir="$db/data" --skip-test-db >"$db/install.log" 2>&1
  fi
  setsid mariadbd --no-defaults --user=root --datadir="$db/data" --socket="$db/mysqld.sock" \
    --bind-address=127.0.0.1 --port="$DB_PORT" --skip-name-resolve --innodb-buffer-pool-size=64M \
    --pid-file="$db/mariadbd.pid" --log-error="$db/mariadbd.err" </dev/null >/dev/null 2>&1 &
  for _ in $(seq 1 150); do mariadb --no-defaults -S "$db/mysqld.sock" -u root -e 'select 1' >/dev/null 2>&1 && break; sleep 0.1; done
  # slurmctld starts with clean state (job ids from 1 again), so accounting starts empty too
  mariadb --no-defaults -S "$db/mysqld.sock" -u root -e \
    "DROP DATABASE IF EXISTS slurm_acct_db; CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw'; CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  ts "mariadbd up"
  cat > "$LAB/etc/slurmdbd.conf" <<CONF
$(plugin_dir)
AuthType=auth/munge
AuthInfo=socket=$sock
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$((PORT + 2))
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
PidFile=$LAB/run/slurmdbd.pid
LogFile=$LAB/log/slurmdbd.log
CONF
  chmod 600 "$LAB/etc/slurmdbd.conf"
  slurmdbd
  for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$((PORT + 2))) 2>/dev/null && break; sleep 0.1; done
  ts "slurmdbd up"
}

write_conf() {
  local host=$1 ctl=$2 nodeline=$3 nodeline8=$4 acct gres="" node_gres="" node_gres8="" sock=$LAB/munge/munge.socket.2
  acct="AccountingStorageType=accounting_storage/none"
  if [ "$ACCT" = 1 ]; then
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$((PORT + 2))
AccountingStoragePass=$sock"
  fi
  rm -f "$LAB/etc/gres.conf"
  mkdir -p "$LAB/fakedev"
  for g in $(seq 0 $((GPUS8-1))); do rm -f "$LAB/fakedev/gpu$g"; mknod "$LAB/fakedev/gpu$g" c 1 3; done
  : > "$LAB/etc/gres.conf"
  if [ "$GPUS" -gt 0 ]; then
    gres="GresTypes=gpu"; node_gres="Gres=gpu:$GPUS"
    echo "NodeName=n[1-$NNODES] Name=gpu File=$LAB/fakedev/gpu[0-$((GPUS-1))]" >> "$LAB/etc/gres.conf"
  fi
  if [ "$NNODES8" -gt 0 ]; then
    gres="GresTypes=gpu"; node_gres8="Gres=gpu:$GPUS8"
    echo "NodeName=n[$((NNODES+1))-$ALL] Name=gpu File=$LAB/fakedev/gpu[0-$((GPUS8-1))]" >> "$LAB/etc/gres.conf"
    nodeline8="$nodeline8 CPUs=$GPUS8 RealMemory=4000 $node_gres8 State=UNKNOWN
PartitionName=gpu8  Nodes=n[$((NNODES+1))-$ALL] MaxTime=02:00:00 State=UP PriorityTier=1 PreemptMode=OFF"
  else
    nodeline8=""
  fi
  cat > "$SLURM_CONF" <<CONF
ClusterName=local
$(plugin_dir)
SlurmctldHost=$ctl
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock,cred_expire=$CRED_EXPIRE
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
StateSaveLocation=$LAB/state
SlurmdSpoolDir=$LAB/spool/%n
SlurmctldPidFile=$LAB/run/slurmctld.pid
SlurmdPidFile=$LAB/run/slurmd-%n.pid
SlurmctldLogFile=$LAB/log/slurmctld.log
SlurmdLogFile=$LAB/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$acct
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=2
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
KillWait=5
MinJobAge=3600
MailProg=/bin/true
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
$gres
$nodeline CPUs=$CPUS RealMemory=4000 $node_gres State=UNKNOWN
PartitionName=debug Nodes=n[1-$NNODES] Default=YES MaxTime=02:00:00 State=UP PriorityTier=1 PreemptMode=OFF
PartitionName=low   Nodes=n[1-$NNODES] MaxTime=02:00:00 State=UP PriorityTier=1 GraceTime=20
PartitionName=high  Nodes=n[1-$NNODES] MaxTime=02:00:00 State=UP PriorityTier=10 PreemptMode=OFF
PartitionName=cpu   Nodes=n[1-$NNODES] MaxTime=02:00:00 State=UP PriorityTier=1 PreemptMode=OFF
$nodeline8
CONF
  cat > "$LAB/etc/cgroup.conf" <<CONF
CgroupPlugin=autodetect
IgnoreSystemdOnFailure=yes
CONF
}

up() {
  local version=22.05 mounts smi
  while [ $# -gt 0 ]; do
    case "$1" in
      --slurm) [ $# -ge 2 ] || { echo "cluster.sh: --slurm needs a version: 22.05, 24.11, 26.05" >&2; exit 2; }
               version=$2; shift 2 ;;
      --slurm=*) version=${1#--slurm=}; shift ;;
      *) echo "cluster.sh: up takes --slurm 22.05|24.11|26.05, not '$1'" >&2; exit 2 ;;
    esac
  done
  case "$version" in 22.05 | 24.11 | 26.05) ;; *) echo "cluster.sh: --slurm $version is not known; allowed: 22.05, 24.11, 26.05" >&2; exit 2 ;; esac
  down >/dev/null 2>&1 || true
  use_slurm "$version"
  for cmd in slurmctld slurmd munged; do
    command -v "$cmd" >/dev/null || { echo "cluster.sh: $cmd not found; run scripts/install.sh first" >&2; exit 1; }
  done
  mounts=$(node_mounts)
  local host; host=$(hostname -s)
  mkdir -p "$LAB"/{etc,state,log,run,munge}
  rm -f "$LAB"/log/*.log "$LAB/munge/munged.log"
  rm -rf "$LAB/state"/* "$LAB/spool"
  chmod 755 "$LAB" "$LAB/munge"
  for i in $(seq 1 "$ALL"); do mkdir -p "$LAB/spool/n$i"; done
  start_munge
  fake_smi
  if [ "$MODE" = netns ]; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    { cat /etc/hosts; for i in $(seq 1 "$ALL"); do echo "$NET.$((10+i)) n$i"; done; } > "$LAB/etc/hosts"
    for i in $(seq 1 "$ALL"); do
      ip netns add "$NETNS-n$i"
      ip link add "$VETH$i" type veth peer name eth0 netns "$NETNS-n$i"
      ip link set "$VETH$i" master "$BRIDGE" up
      ip -n "$NETNS-n$i" addr add "$NET.$((10+i))/24" dev eth0
      ip -n "$NETNS-n$i" link set eth0 up
      ip -n "$NETNS-n$i" link set lo up
    done
    write_conf "$host" "$host($NET.1)" "NodeName=n[1-$NNODES] NodeAddr=$NET.[11-$((10+NNODES))]" \
      "NodeName=n[$((NNODES+1))-$ALL] NodeAddr=$NET.[$((11+NNODES))-$((10+ALL))]"
  elif [ "$MODE" = multi ]; then
    # node names resolve inside jobs through a private /etc/hosts bind-mounted for each slurmd
    { cat /etc/hosts; echo "127.0.0.1 $(seq -f 'n%g' -s ' ' 1 "$ALL")"; } > "$LAB/etc/hosts"
    write_conf "$host" "$host(127.0.0.1)" \
      "NodeName=n[1-$NNODES] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$((PORT + 4))-$((PORT + 3 + NNODES))]" \
      "NodeName=n[$((NNODES+1))-$ALL] NodeHostname=$host NodeAddr=127.0.0.1 Port=[$((PORT + 4 + NNODES))-$((PORT + 3 + ALL))]"
  else
    echo "cluster.sh: MODE=$MODE is not known; allowed: multi, netns" >&2; exit 2
  fi
  if [ "$ACCT" = 1 ]; then
    command -v slurmdbd >/dev/null || { echo "cluster.sh: slurmdbd not found (ACCT=1); run scripts/install.sh" >&2; exit 1; }
    start_accounting
  fi
  {
    echo "export SLURM_CONF=$SLURM_CONF"
    [ -z "$SLURM_ROOT" ] || echo "export PATH=$LAB/bin:\$PATH  # Slurm $SLURM_VERSION's clients"
  } >"$LAB/env.sh"
  slurmctld -f "$SLURM_CONF" -c
  for _ in $(seq 1 50); do [ -s "$LAB/run/slurmctld.pid" ] && break; sleep 0.1; done
  ts "slurmctld up"
  for i in $(seq 1 "$ALL"); do
    smi=$(smi_mount "$([ "$i" -le "$NNODES" ] && echo "$GPUS" || echo "$GPUS8")")
    if [ "$MODE" = netns ]; then
      # nsenter, not "ip netns exec": that remounts /sys and slurmd loses /sys/fs/cgroup
      nsenter --net="/run/netns/$NETNS-n$i" unshare --uts --mount --propagation private sh -c \
        "hostname n$i && mount --bind '$LAB/etc/hosts' /etc/hosts && $smi $mounts exec slurmd -f '$SLURM_CONF' -N n$i"
    else
      unshare --mount --propagation private sh -c \
        "mount --bind '$LAB/etc/hosts' /etc/hosts && $smi $mounts exec slurmd -f '$SLURM_CONF' -N n$i"
    fi
  done
  for _ in $(seq 1 150); do
    [ "$(sinfo -h -N -t idle -o %N | sort -u | wc -l)" = "$ALL" ] && break; sleep 0.2
  done
  if [ "$(sinfo -h -N -t idle -o %N | sort -u | wc -l)" != "$ALL" ]; then
    sinfo >&2; echo "cluster.sh: nodes did not become idle; see $LAB/log" >&2; exit 1
  fi
  ts "up: Slurm $SLURM_VERSION, $NNODES nodes ($MODE, $GPUS fake GPUs and $CPUS CPUs each, accounting=$ACCT) +" \
    "$NNODES8 in gpu8 ($GPUS8 fake GPUs and $GPUS8 CPUs each); nvidia-smi on the nodes: the test fake. Clients:" \
    "source $LAB/env.sh"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  status) sinfo; squeue ;;
  *) echo "usage: scripts/cluster.sh up [--slurm 22.05|24.11|26.05] | down | status" >&2; exit 2 ;;
esac
