#!/usr/bin/env bash
# LoRA on the local cluster: adapters (r=8 on the seven projections) on the chat demo's model (jobs/chat/hf, from
# scripts/demo_chat.sh), trained on 2 nodes at dp2 x tp2 with the base frozen; the PEFT adapter export; the base
# and the adapter (loaded with peft onto the base) answer the same questions.
# Needs the local cluster (scripts/demo.sh) and peft. JOB=name picks the job name (default chat-lora); BASE=DIR another base.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-.venv/bin/python}
JOB=${JOB:-chat-lora}
BASE=${BASE:-$ROOT/jobs/chat/hf}
source "${LAB:-/tmp/hpc-slurm}/env.sh"   # SLURM_CONF for the client commands
sinfo >/dev/null || { echo "demo_lora.sh: the local cluster is not up; run scripts/demo.sh (or scripts/cluster.sh up) first" >&2; exit 2; }
[ -f "$BASE/config.json" ] || { echo "demo_lora.sh: no base model in $BASE; run scripts/demo_chat.sh first (or set BASE=DIR)" >&2; exit 2; }
"$PYTHON" -c "import peft" 2>/dev/null || { echo "demo_lora.sh: needs peft: $PYTHON -m pip install peft" >&2; exit 2; }
mkdir -p jobs
echo "--- LoRA fine-tune: dp2 x tp2 over 2 nodes, base $BASE frozen ---"
"$PYTHON" -m hpc.submit --site local --nodes 2 --job-name "$JOB" --wait -- --config train/configs/chat.yaml \
  "model.shape=null" "model.dims={}" "model.path=$BASE" "data.prepared=$ROOT/jobs/$JOB-data" \
  lora.enabled=true lora.r=8 lora.alpha=16 optim.lr=2e-3 steps=60 checkpoint.interval=30 export=adapter | tee "jobs/$JOB-submit.log"
job=$(sed -n 's/^submitted job \([0-9]*\).*/\1/p' "jobs/$JOB-submit.log")
"$PYTHON" -m hpc.jobs report "$job"
echo "--- the adapter export (jobs/$JOB/adapter) and the last checkpoint, next to the base ---"
ls -l "jobs/$JOB/adapter"
du -sh "$(sed -n 's/.*\(saved checkpoint\|resumed from\) \([^ ]*\) .*/\2/p' "jobs/$JOB-submit.log" | tail -1)" "$BASE"
for question in 'In Macbeth, who speaks the line "Is this a dagger which I see before me,"?' \
                'Which work of Shakespeare has the line "O Romeo, Romeo! wherefore art thou Romeo?"?'; do
  echo "user: $question"
  echo "base:    $("$PYTHON" -m train.generate "$BASE" --chat "$question" 2>/dev/null)"
  echo "adapter: $("$PYTHON" -m train.generate "jobs/$JOB/adapter" --chat "$question" 2>/dev/null)"
done
