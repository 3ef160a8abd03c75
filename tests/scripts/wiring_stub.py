"""A stub rank (no torch): records its wiring as hpc.node.launch set it beside Slurm's own variables, and the batch
rule's answer for its place (train.run_check's layout for the trainer arguments it is given; the dp rank is the
trainer mesh's, RANK // (cp x tp)), in OUT/rank-<RANK>.json.

    python wiring_stub.py OUT --config FILE [key=value ...]"""

import json
import os
import sys
from pathlib import Path

from train.front.config import load_config, split_cli
from train.front.layout import WorldEnv
from train.front.run_check import check_run

VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "CUDA_VISIBLE_DEVICES")
SLURM = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_JOB_NODELIST", "SLURMD_NODENAME", "SLURM_STEP_GPUS")

out, (config, overrides) = Path(sys.argv[1]), split_cli(sys.argv[2:])
env = WorldEnv.from_env()
cfg = load_config(config, overrides)
dims = check_run(cfg, env)
split = dims.batch_split(cfg.global_batch, cfg.micro_batch)
record = {k: os.environ.get(k) for k in VARS + SLURM}
record |= {"dp": dims.dp, "tp": dims.tp, "share": split.share(env.rank // (dims.cp * dims.tp)), "accum": split.accum}
out.mkdir(parents=True, exist_ok=True)
(out / f"rank-{env.rank}.json").write_text(json.dumps(record))
