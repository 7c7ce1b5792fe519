#!/usr/bin/env bash
# Stop the daemons started by setup.sh, by PID (not by name). From the Slurm anchor recipe.
#  usage: stop.sh [--all]  (--all also stops munged)
L=/tmp/slurm-anchor
for f in $L/slurmd.pid $L/slurmctld.pid; do
  [ -s $f ] && p=$(cat $f) && kill -0 $p 2>/dev/null && kill $p && echo "stopped $(basename $f .pid) pid $p"
done
sleep 2
if [ "${1:-}" = --all ] && [ -s /run/munge/munged.pid ]; then
  p=$(cat /run/munge/munged.pid); kill -0 $p 2>/dev/null && kill $p && echo "stopped munged pid $p"
fi
