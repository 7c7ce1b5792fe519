#!/bin/bash

#SBATCH --job-name=multinode
#SBATCH -D .
#SBATCH --output=O-%x.%j
#SBATCH --error=E-%x.%j
#SBATCH --nodes=4                   # number of nodes
#SBATCH --ntasks-per-node=1         # number of MP tasks
#SBATCH --gres=gpu:4                # number of GPUs per node
#SBATCH --cpus-per-task=160         # number of cores per tasks
#SBATCH --time=01:59:00             # maximum execution time (HH:MM:SS)

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
