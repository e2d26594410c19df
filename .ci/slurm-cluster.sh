#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for the tests (tests/test_slurm.py) and
# for trying profiles/slurm by hand (docs/slurm.md, "A SLURM cluster on this machine").
#
#   .ci/slurm-cluster.sh start    install (apt, once) and start it; again: no-op
#   .ci/slurm-cluster.sh status   exit 0 when its node takes jobs
#   .ci/slurm-cluster.sh stop     stop the daemons this script started, nothing else
#
# As root, on Debian/Ubuntu, without systemd: Debian's slurm-wlm, munge, slurmdbd and
# mariadb-server; every daemon in the foreground under start-stop-daemon
# --background --make-pidfile (pid files in $STATE). Node `localhost` (the machine's
# CPUs and memory, as `slurmd -C` reads them, and 2 fake GPUs: character devices
# `c 1 3`, since slurmd drops a GPU gres without File= or with plain files), partitions
# `gpu` (default, no time limit) and `short` (MaxTime 2 minutes: a cap to test
# against), `spot` (preemptible: its jobs are cancelled, PREEMPTED, by a job of
# `urgent`, a partition of a higher PriorityTier; jobs of the other partitions are
# requeued by it), accounting through slurmdbd into mariadb (bound to 127.0.0.1), account
# `local` with user root (associations enforced: an unknown account is refused).
# A site's own /etc/slurm/slurm.conf is never overwritten: start refuses.
set -euo pipefail

STATE=${MULTIGEOM_SLURM_STATE:-/var/lib/multigeom-slurm}
CONF_DIR=/etc/slurm
MARK="# written by multigeom-workflow .ci/slurm-cluster.sh"
PACKAGES=(slurm-wlm munge slurmdbd mariadb-server)
DB_PASS=multigeom-local-test
CHANGED=0

say() { echo "slurm-cluster: $*" >&2; }
die() { say "$*"; exit 1; }

running() { # name: its pid file names a live process
  [[ -f "$STATE/$1.pid" ]] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null
}

daemon() { # name user command...: start it in the background unless running
  local name=$1 user=$2
  shift 2
  if running "$name"; then return 0; fi
  say "starting $name"
  start-stop-daemon --start --background --make-pidfile --pidfile "$STATE/$name.pid" \
    --chuid "$user" --output "$STATE/log/$name.out" --startas "$1" -- "${@:2}"
}

wait_for() { # what seconds command...: retry the command until it succeeds
  local what=$1 seconds=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      say "$what did not come up in ${seconds} s; the ends of its logs:"
      tail -n 20 "$STATE"/log/* >&2 || true
      exit 1
    fi
    sleep 0.5
  done
}

install() {
  local missing=0
  for cmd in munged mariadbd slurmdbd slurmctld slurmd sbatch start-stop-daemon; do
    command -v "$cmd" >/dev/null || missing=1
  done
  ((missing)) || return 0
  command -v apt-get >/dev/null || die "needs apt-get to install ${PACKAGES[*]}"
  say "installing ${PACKAGES[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >"$STATE/log/apt.out" 2>&1 ||
    { apt-get update -q >>"$STATE/log/apt.out" 2>&1 &&
      apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" \
        >>"$STATE/log/apt.out" 2>&1; } ||
    { tail -n 20 "$STATE/log/apt.out" >&2; die "apt-get install failed"; }
}

ours() { # the file does not exist or this script wrote it
  [[ ! -e "$1" ]] || head -n 1 "$1" | grep -qxF "$MARK"
}

write_config() {
  mkdir -p "$CONF_DIR" "$STATE"/{ctld,d,dev,log}
  for f in slurm.conf slurmdbd.conf gres.conf; do
    ours "$CONF_DIR/$f" || die "$CONF_DIR/$f is not this script's: not touching a real cluster's configuration"
  done
  for i in 0 1; do # fake GPUs: /dev/null's device numbers
    [[ -c "$STATE/dev/gpu$i" ]] || mknod -m 666 "$STATE/dev/gpu$i" c 1 3
  done
  # this machine as slurmd sees it: CPUs, sockets, cores, threads, memory
  local node
  node=$(slurmd -C | head -n 1 | sed -e 's/^NodeName=[^ ]* //')
  local before
  before=$(cat "$CONF_DIR"/{slurm,gres,slurmdbd}.conf 2>/dev/null || true)
  cat >"$CONF_DIR/slurm.conf" <<EOF
$MARK
ClusterName=local
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/ctld/slurmctld.pid
SlurmdPidFile=$STATE/d/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
# finished jobs stay in squeue 5 minutes (the plugin's squeue status query)
MinJobAge=300
# a job at its time limit: SIGTERM, then SIGKILL 5 s later (30 s by default)
KillWait=5
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageEnforce=associations
# a request above a partition's limits is refused at submission, as on most clusters
EnforcePartLimits=ALL
JobAcctGatherType=jobacct_gather/none
# sacct shows a job's --comment (the plugin's rule and wildcards)
AccountingStoreFlags=job_comment
# sacct shows the GPUs asked for (ReqTRES gres/gpu=N)
AccountingStorageTRES=gres/gpu
GresTypes=gpu
# preemption by partition priority: a job of urgent (PriorityTier=10) takes the
# resources of running jobs of the others (PriorityTier=1): spot's are cancelled
# (PREEMPTED), the others' requeued (the same job id runs again)
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName=localhost $node Gres=gpu:2 State=UNKNOWN
PartitionName=gpu Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=short Nodes=localhost MaxTime=2 State=UP
PartitionName=spot Nodes=localhost MaxTime=INFINITE State=UP PreemptMode=CANCEL
PartitionName=urgent Nodes=localhost MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
EOF
  cat >"$CONF_DIR/gres.conf" <<EOF
$MARK
NodeName=localhost Name=gpu File=$STATE/dev/gpu[0-1]
EOF
  cat >"$CONF_DIR/slurmdbd.conf" <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
PidFile=$STATE/slurmdbd.own.pid
LogFile=$STATE/log/slurmdbd.log
EOF
  chmod 600 "$CONF_DIR/slurmdbd.conf"
  [[ "$before" == "$(cat "$CONF_DIR"/{slurm,gres,slurmdbd}.conf)" ]] || CHANGED=1
}

node_ready() {
  local state
  state=$(sinfo -h -n localhost -o %T 2>/dev/null | head -n 1)
  [[ "$state" =~ ^(idle|mixed|allocated)$ ]]
}

start() {
  [[ $EUID -eq 0 ]] || die "must run as root (it installs packages and starts daemons)"
  mkdir -p "$STATE/log"
  install
  write_config
  # munge: the key the package made, its socket folder
  [[ -s /etc/munge/munge.key ]] || { mungekey -c -f -k /etc/munge/munge.key &&
    chown munge:munge /etc/munge/munge.key; }
  mkdir -p /run/munge && chown munge:munge /run/munge
  if ! (munge -n | unmunge) >/dev/null 2>&1; then
    daemon munged munge /usr/sbin/munged -F
    wait_for munged 20 sh -c 'munge -n | unmunge'
  fi
  # mariadb, for slurmdbd; the package initialised its data folder
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  if ! mariadb-admin ping >/dev/null 2>&1; then
    daemon mariadbd mysql /usr/sbin/mariadbd --bind-address=127.0.0.1
    wait_for mariadbd 60 mariadb-admin ping
  fi
  mariadb -u root <<EOF
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF
  daemon slurmdbd root /usr/sbin/slurmdbd -D
  wait_for slurmdbd 60 sacctmgr -n show cluster
  sacctmgr -i add cluster local >/dev/null 2>&1 || true
  if ((CHANGED)) && { running slurmctld || running slurmd; }; then
    # daemons of an older configuration (a change of PreemptType needs a restart)
    say "configuration changed: restarting slurmctld and slurmd"
    stop_daemon slurmd
    stop_daemon slurmctld
  fi
  daemon slurmctld root /usr/sbin/slurmctld -D
  wait_for slurmctld 60 scontrol ping
  daemon slurmd root /usr/sbin/slurmd -D -N localhost
  sacctmgr -i add account local Description=tests Organization=tests >/dev/null 2>&1 || true
  sacctmgr -i add user root Account=local DefaultAccount=local >/dev/null 2>&1 || true
  sacctmgr -n -P show assoc user=root account=local format=account | grep -qx local ||
    die "sacctmgr did not record user root in account local"
  if ! node_ready; then
    wait_for "node localhost" 60 node_ready_or_resume
  fi
  say "up: $(sinfo -h -o '%P %a %l %D %T %G' | tr '\n' ';')"
}

node_ready_or_resume() { # a node drained by an earlier configuration comes back
  node_ready && return 0
  if sinfo -h -n localhost -o %T 2>/dev/null | grep -qE 'drain|down'; then
    scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true
  fi
  return 1
}

stop_daemon() { # name: stop it if this script started it
  if [[ -f "$STATE/$1.pid" ]]; then
    say "stopping $1"
    start-stop-daemon --stop --quiet --pidfile "$STATE/$1.pid" --retry TERM/20/KILL/5 \
      --remove-pidfile || true
    rm -f "$STATE/$1.pid"
  fi
}

stop() {
  local name
  for name in slurmd slurmctld slurmdbd mariadbd munged; do
    stop_daemon "$name"
  done
}

status() { # exit 0 when this script's cluster takes jobs
  local name
  ours "$CONF_DIR/slurm.conf" && [[ -e "$CONF_DIR/slurm.conf" ]] ||
    die "no cluster of this script here ($CONF_DIR/slurm.conf)"
  for name in munged mariadbd slurmdbd slurmctld slurmd; do
    if running "$name"; then say "$name running (pid $(cat "$STATE/$name.pid"))"; fi
  done
  node_ready && say "node localhost takes jobs: $(sinfo -h -o '%P %l %T' | tr '\n' ';')"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) die "usage: $0 start|status|stop" ;;
esac
