#!/bin/bash

# slurm script to train a PyTorch deep learning model on GPU Node

#SBATCH -J finbert-train-job           # Job name
#SBATCH -p slurmgpu                    # Partition (queue) to submit to
#SBATCH -c 10                          # Number of CPU cores 
#SBATCH -N 1                           # Request one node 
#SBATCH -t 1:00:00                     # Max job time: 1 day 
#SBATCH -G 1                           # Max GPUs per user: 2
#SBATCH -o finbert-train.output        # Output file

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
