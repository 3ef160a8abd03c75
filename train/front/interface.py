"""The trainer as the login side sees it, without importing torch (its module: ``hpc.node.contract.TRAINER_MODULE``):
its shipped configs, the config keys a job sets (its run's directories, the straggler exclusion), and the fused loss's
chunk (the planner's memory model counts one chunk of logits)."""

from pathlib import Path

CONFIG_DIR = (
    Path(__file__).resolve().parent.parent / "configs"
)  # the shipped training configs, by name (a profile's training.config)
LOG_DIR_KEY = "log.dir"
CHECKPOINT_DIR_KEY = "checkpoint.dir"
RUN_DIR_KEYS = (LOG_DIR_KEY, CHECKPOINT_DIR_KEY)  # a job (each array task) sets both to directories of its own
STRAGGLER_STOP_KEY = "straggler.stop_after"  # set from the profile's preemption.exclude_stragglers_after
LOSS_CHUNK_TOKENS = 4096  # tokens per chunk of train/loss.py's fused linear cross-entropy
