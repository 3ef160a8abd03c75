"""The slurm tier: jobs on the real local cluster (scripts/cluster.sh up)."""
