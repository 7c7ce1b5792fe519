#!/usr/bin/env bash
# The same three measurements, timed the same way, for Slurm and for MTGPU.
# Driven by benchmarks/slurm_ref.py; adapted from the Slurm anchor's bench.sh.
#
#   SYSTEM=slurm  run as root on the node brought up by setup.sh
#   SYSTEM=mtgpu  run as an MTGPU tenant, in one session (ssh host bash -s < this file),
#                 so no ssh connection cost is counted
#
#   a. N sequential CLI submissions of a trivial job, each a separate process:
#        slurm:  sbatch -Q --wrap=true -o /dev/null
#        mtgpu:  CLIENT submit --parsable - < true.sh   (for each LABEL[:COUNT]=CLIENT in
#                MT_CLIENTS; COUNT submissions instead of N when given)
#      then wait until every job has ended (the jobs run during the burst on both sides).
#   b. submit->start latency on an idle node, LAT_N samples: t0 just before the submit
#      command is exec'd; the job writes `date +%s.%N` into a FIFO the script reads;
#      before each submit the node is idle and a random 0.5-1.5 s gap has passed.
#   c. an ARRAY-task array of trivial jobs, submit -> last task ended (queue polled every
#      POLL s, as the anchor does).
#
# Output: tab-separated records on stdout ("rec TEST METRIC VALUE" and
# "lat SERIES I JOBID GAP T0 TRETURN TSTART"); progress on stderr.
# Needs bash >= 5 ($EPOCHREALTIME).
set -u
SYSTEM=${SYSTEM:?slurm or mtgpu}
N=${N:-500}; LAT_N=${LAT_N:-30}; ARRAY=${ARRAY:-1000}
LAT_GAP=${LAT_GAP:-"0.5 1.0"}; POLL=${POLL:-0.2}; LAT_POLL=${LAT_POLL:-0.05}
PART=${PART:-over}                    # Slurm partition of the array (anchor: over = 32 slots)
MT_CLIENTS=${MT_CLIENTS:-python=mt-job}  # MTGPU: LABEL[:COUNT]=COMMAND of each client timed in (a)
LAT_CLIENT=${LAT_CLIENT:-mt-job}      # MTGPU: the client used in (b) and (c)
MT_DIRECTIVES=${MT_DIRECTIVES:-"cpus=1 ram=64M output=/dev/null"}
W=${WORK:-$HOME/.cli-bench}; mkdir -p "$W"; cd "$W" || exit 1
FIFO=$W/lat.fifo
DEADLINE=${DEADLINE:-600}             # give up waiting for a drain after this many seconds

say()  { echo "[$(date +%T)] $SYSTEM: $*" >&2; }
rec()  { printf 'rec\t%s\t%s\t%s\n' "$1" "$2" "$3"; say "$1 $2=$3"; }
fdiff(){ awk -v a="$1" -v b="$2" 'BEGIN{printf "%.6f", b-a}'; }
fdiv() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
rgap() { awk -v a="$1" -v b="$2" -v s="$RANDOM" 'BEGIN{srand(s); printf "%.3f", a+b*rand()}'; }

if [ "$SYSTEM" = slurm ]; then
  submit_true() { sbatch -Q --wrap=true -o /dev/null >/dev/null; }
  submit_lat()  { sbatch --parsable --wrap="date +%s.%N > $FIFO" -o /dev/null; }
  submit_array(){ sbatch --parsable -p "$PART" --array=0-$((ARRAY - 1)) --wrap=true -o /dev/null; }
  active()      { local o; o=$(squeue -h -t PD,R,CG,CF -o %i) || { echo -1; return; }
                  [ -z "$o" ] && echo 0 || wc -l <<< "$o"; }
else
  printf '#!/bin/bash\n#MTGPU %s\ntrue\n' "$MT_DIRECTIVES" > true.sh
  printf '#!/bin/bash\n#MTGPU %s\ndate +%%s.%%N > %s\n' "$MT_DIRECTIVES" "$FIFO" > lat.sh
  printf '#!/bin/bash\n#MTGPU array=0-%d %s\ntrue\n' $((ARRAY - 1)) "$MT_DIRECTIVES" > array.sh
  CLIENT=$LAT_CLIENT
  submit_true() { "$CLIENT" submit --parsable - < true.sh >/dev/null; }
  submit_lat()  { "$LAT_CLIENT" submit --parsable - < lat.sh; }
  submit_array(){ "$LAT_CLIENT" submit --parsable - < array.sh; }
  # jobs (array tasks) not ended; `mt-job list` shows only those
  active()      { local o; o=$("$LAT_CLIENT" list --json </dev/null) || { echo -1; return; }
                  grep -c '"job_id"' <<< "$o"; }
fi

drain() {   # $1 poll interval; returns 1 on timeout. A failed query (-1) is not "empty".
  local t0=$SECONDS
  while [ "$(active)" != 0 ]; do
    [ $((SECONDS - t0)) -gt "$DEADLINE" ] && { say "drain: still active after ${DEADLINE}s"; return 1; }
    sleep "${1:-$POLL}"
  done
}

burst() {   # $1 test name, $2 count; submits $2 trivial jobs in one sequential loop
  local t0 t1 t2 fails=0 i n=$2
  drain || return
  t0=$EPOCHREALTIME
  for i in $(seq 1 "$n"); do submit_true || fails=$((fails + 1)); done
  t1=$EPOCHREALTIME
  rec "$1" n "$n"
  rec "$1" submit_s "$(fdiff "$t0" "$t1")"
  rec "$1" submit_per_s "$(fdiv "$n" "$(fdiff "$t0" "$t1")")"
  rec "$1" ms_per_call "$(awk -v a="$t0" -v b="$t1" -v n="$n" 'BEGIN{printf "%.2f", (b-a)/n*1000}')"
  rec "$1" failed "$fails"
  drain; t2=$EPOCHREALTIME
  rec "$1" all_done_s "$(fdiff "$t0" "$t2")"
  rec "$1" done_per_s "$(fdiv "$n" "$(fdiff "$t0" "$t2")")"
}

# a. sequential CLI submissions
if [ "$SYSTEM" = slurm ]; then
  burst seq_sbatch "$N"
else
  for c in $MT_CLIENTS; do
    CLIENT=${c#*=}; label=${c%%=*}; n=$N
    case $label in *:*) n=${label#*:}; label=${label%%:*};; esac
    burst "seq_mtjob_$label" "$n"
  done
fi

# b. submit->start latency, one job at a time on an idle node
rm -f "$FIFO"; mkfifo "$FIFO"; exec 3<>"$FIFO"   # RW open: never blocks; the job's write wakes `read`
drain "$LAT_POLL"
for i in $(seq 1 "$LAT_N"); do
  g=$(rgap $LAT_GAP); sleep "$g"
  ts=$EPOCHREALTIME
  jid=$(submit_lat)
  tr=$EPOCHREALTIME
  if ! read -r -t 60 -u 3 st; then say "latency: job $jid did not start in 60s"; st=NaN; fi
  drain "$LAT_POLL"                                # wait until the job has fully ended
  printf 'lat\tidle\t%s\t%s\t%s\t%s\t%s\t%s\n' "$i" "$jid" "$g" "$ts" "$tr" "$st"
done
exec 3<&-; rm -f "$FIFO"
say "latency: $LAT_N samples done"

# c. an array of trivial jobs, to completion
drain
t0=$EPOCHREALTIME
jid=$(submit_array)
t1=$EPOCHREALTIME
drain; t2=$EPOCHREALTIME
rec "array$ARRAY" job_id "$jid"
rec "array$ARRAY" submit_s "$(fdiff "$t0" "$t1")"
rec "array$ARRAY" all_done_s "$(fdiff "$t0" "$t2")"
rec "array$ARRAY" done_per_s "$(fdiv "$ARRAY" "$(fdiff "$t0" "$t2")")"
