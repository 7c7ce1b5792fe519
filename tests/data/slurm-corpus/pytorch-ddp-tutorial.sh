#!/bin/bash

#SBATCH --job-name=multinode-example
#SBATCH --nodes=4
#SBATCH --ntasks=4
#SBATCH --gpus-per-task=1
#SBATCH --cpus-per-task=4

# ---- MTGPU's corpus probe: the published body is replaced by what follows ----
echo "probe: begin"
env | grep -E '^SLURMD?_' | sort | sed 's/^/env: /'
echo "env: CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"
echo "nproc: $(nproc)"
mem=unknown
while IFS=: read -r _ ctl path; do
    case ",$ctl," in
        *,memory,*) f="/sys/fs/cgroup/memory$path/memory.limit_in_bytes" ;;
        ,,) f="/sys/fs/cgroup$path/memory.max" ;;
        *) continue ;;
    esac
    if [ -r "$f" ]; then mem=$(cat "$f"); fi
done < /proc/self/cgroup
echo "memory: $mem"
echo "cputime: $(ulimit -t)"
echo "pwd: $(pwd)"
echo "probe: end"
