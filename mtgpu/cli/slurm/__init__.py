"""Slurm's commands (``sbatch``, ``squeue``, ``scancel``, ``sinfo``, ``scontrol``,
``salloc``, ``srun``) as thin front ends over MTGPU's API, printing Slurm's formats."""
