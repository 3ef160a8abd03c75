"""The unit tier: pure functions and files in process; no processes, no cluster."""
