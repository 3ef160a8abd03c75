"""The dist tier: processes on this machine (torchrun on CPU, the command lines), no Slurm."""
