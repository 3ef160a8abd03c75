"""What runs on the compute nodes and what the trainer shares with the login side; imports nothing else of hpc/."""
