#!/usr/bin/env bash
# Install and start a single-node SLURM (Debian packages) for tests/test_slurm.py.
# Idempotent: a running, responsive controller is left alone. Exits non-zero when impossible.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
  echo "install_slurm.sh: needs root (apt-get and daemons)" >&2
  exit 1
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
   || ! command -v sbatch >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge
fi

HOST=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
CONF_DIR=/etc/slurm
mkdir -p "$CONF_DIR" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge /var/lib/munge /var/log/munge
chown -R slurm:slurm /var/spool/slurmctld /var/log/slurm 2>/dev/null || true

if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 0700 /etc/munge
chmod 0400 /etc/munge/munge.key

cat > "$CONF_DIR/slurm.conf.new" <<CONF
# Minimal single-node SLURM for bertrain's tests (no cgroups).
ClusterName=bertrain
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits cred_expire seconds before it restarts (default 120); keep tests short.
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
MpiDefault=none
KillWait=30
MinJobAge=3600
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONF
if ! cmp -s "$CONF_DIR/slurm.conf.new" "$CONF_DIR/slurm.conf" 2>/dev/null; then
  mv "$CONF_DIR/slurm.conf.new" "$CONF_DIR/slurm.conf"
  changed=1
else
  rm -f "$CONF_DIR/slurm.conf.new"
  changed=0
fi

if ! pgrep -x munged >/dev/null; then
  munged --force || { echo "install_slurm.sh: munged did not start" >&2; exit 1; }
fi
if [ "$changed" = 1 ]; then
  # A new config: restart daemons we may have started before (by pid file, never by name).
  for pidfile in /run/slurmd.pid /run/slurmctld.pid; do
    if [ -s "$pidfile" ]; then
      pid=$(cat "$pidfile")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    fi
  done
fi
if ! scontrol ping 2>/dev/null | grep -q UP; then
  slurmctld -c 2>/dev/null || slurmctld
fi
if ! pgrep -x slurmd >/dev/null; then
  slurmd
fi

for _ in $(seq 1 30); do
  if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true
    echo "SLURM is up: $(sinfo -h -o '%P %D %T')"
    exit 0
  fi
  scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true
  sleep 1
done
echo "install_slurm.sh: SLURM did not become ready; see /var/log/slurm/*.log" >&2
sinfo >&2 || true
exit 1
