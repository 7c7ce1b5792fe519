#!/bin/bash -l
#SBATCH --job-name=chess_finetune  # create a short name for your job
#SBATCH --output=%x-%j_%n.out      # file to write stdout
#SBATCH --nodes=1                  # node count
#SBATCH --ntasks=1                 # total number of tasks across all nodes
#SBATCH --cpus-per-task=4          # cpu-cores per task (>1 if multi-threaded tasks)
#SBATCH --mem=256G                 # cpu memory per node
#SBATCH --gres=gpu:4               # number of gpus per node
#SBATCH --time=01:00:00            # total run time limit (HH:MM:SS)
#SBATCH --constraint=gpu80         # run job on specific node types

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
