#!/usr/bin/env bash
# The main job on the embedded default: install, start the local Slurm cluster,
# train a small Qwen3 with data x tensor parallelism (dp2 x tp2) across two nodes,
# then plot the run and sample from the exported model.
# The cluster stays up afterwards (scripts/cluster.sh down stops it). A second run
# of the same job name resumes the finished run; pass --job-name NAME for a new one.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
bash scripts/install.sh
bash scripts/cluster.sh up
source "${LAB:-/tmp/hpc-slurm}/env.sh"   # SLURM_CONF for the client commands
mkdir -p jobs
.venv/bin/python -m hpc.submit --site local --nodes 2 --job-name demo --wait "$@" | tee jobs/demo-submit.log
job=$(sed -n 's/^submitted job \([0-9]*\).*/\1/p' jobs/demo-submit.log)
name=$(sed -n 's/^script: *.*\/jobs\/\([^/]*\)\/[0-9]*_submission.sh$/\1/p' jobs/demo-submit.log)
.venv/bin/python -m hpc.jobs report "$job"
echo "--- sample from the exported model (jobs/$name/hf) ---"
.venv/bin/python -m train.generate "jobs/$name/hf" --prompt "ROMEO:" --tokens 60
