#!/bin/bash
# =============================================================================
# Nanotron Multi-Node Training Script
# =============================================================================
# This script runs distributed training for Nanotron models using SLURM.
# It supports both sbatch and salloc/srun modes of execution.
#
# Usage:
#   1. Submit as a SLURM job:
#      sbatch --nodes=N run_multinode.sh
#
#   2. Run within an interactive allocation:
#      SALLOC_JOBID=<jobid> NNODES=<N> bash run_multinode.sh
#
# All paths and settings can be customized by setting environment variables
# before running the script. See the configuration section below.
# =============================================================================

#SBATCH --job-name=smolm2-bench   # Job name
#SBATCH --time=00:02:00
#SBATCH --partition=hopper-prod
#SBATCH --qos=high
#SBATCH --nodes=2                 # Number of nodes (modify as needed)
#SBATCH --ntasks-per-node=1       # Number of tasks per node
#SBATCH --cpus-per-task=60        # CPU cores per task
#SBATCH --gres=gpu:8              # Number of GPUs per node
#SBATCH --exclusive               # Exclusive use of nodes
#SBATCH --wait-all-nodes=1        # fail if any node is not ready
#SBATCH -o /fsx/nouamane/projects/nanotron/logs/%j-%x.out  # Default log path (can't use variables in SBATCH directives)

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
