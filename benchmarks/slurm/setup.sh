#!/usr/bin/env bash
# Bring up a single-node Slurm 22.05 cluster on Debian 12 without systemd.
# Copied from the Slurm anchor recipe (measured figures in benchmarks/README.md) for
# benchmarks/slurm_ref.py; keep it in step with that recipe.
#   usage: setup.sh [CONF]   (CONF defaults to slurm.conf next to this script)
# Starts munged (if not running) + fresh slurmctld/slurmd; PIDs in /tmp/slurm-anchor/*.pid.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
CONF=${1:-$HERE/slurm.conf}
L=/tmp/slurm-anchor; mkdir -p $L
if ! command -v slurmctld >/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge
fi
# munge: key (package postinst normally creates one), runtime dirs, daemon
[ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge; chmod 0755 /run/munge
if ! { [ -s /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; }; then
  (cd /tmp && setsid -f runuser -u munge -- /usr/sbin/munged >$L/munged.out 2>&1 </dev/null)
  sleep 1
fi
munge -n | unmunge >/dev/null && echo "munged ok (pid $(cat /run/munge/munged.pid))"
# slurm.conf with this host's short name
H=$(hostname -s)
sed -E "s/^(SlurmctldHost=)vm\(/\1$H(/; s/^(NodeName=)vm /\1$H /; s/ Nodes=vm / Nodes=$H /" "$CONF" > /etc/slurm/slurm.conf
# fresh state (job ids restart at 1, no leftover job records)
rm -rf /var/spool/slurmctld /var/spool/slurmd; mkdir -p /var/spool/slurmctld /var/spool/slurmd
rm -f $L/slurmctld.log $L/slurmd.log
(cd /tmp && setsid -f /usr/sbin/slurmctld -D -i >$L/slurmctld.out 2>&1 </dev/null)
sleep 2
(cd /tmp && setsid -f /usr/sbin/slurmd -D >$L/slurmd.out 2>&1 </dev/null)
for i in $(seq 1 30); do sinfo -h -o %t 2>/dev/null | grep -q idle && break; sleep 1; done
sinfo
echo "slurmctld pid $(cat $L/slurmctld.pid)  slurmd pid $(cat $L/slurmd.pid)"
(cd /tmp && srun hostname)
