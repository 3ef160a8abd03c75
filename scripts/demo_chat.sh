#!/usr/bin/env bash
# The second main job: fine-tune a small Qwen3 on the shipped Shakespeare chat set (a Qwen3-style chat template on
# the demo tokenizer; loss on assistant tokens only) on 2 nodes of the local cluster at dp2 x tp2:
# prepare the data once as a Slurm job over both nodes, train with a held-out evaluation, report, and ask the
# exported model a question through its chat template.
# Needs the local cluster (scripts/demo.sh installs and starts it). JOB=name picks the job name (default chat);
# a second run of the same name reuses the prepared data and resumes the finished run. Exits non-zero when the prepare
# job, the training job or an answer of the exported model fails.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-.venv/bin/python}
JOB=${JOB:-chat}
source "${LAB:-/tmp/hpc-slurm}/env.sh"   # SLURM_CONF for the client commands
sinfo >/dev/null || { echo "demo_chat.sh: the local cluster is not up; run scripts/demo.sh (or scripts/cluster.sh up) first" >&2; exit 2; }
mkdir -p jobs
DATA="$ROOT/jobs/$JOB-data"
CONFIG=(--config train/configs/chat.yaml "data.prepared=$DATA")
echo "--- prepare: render, tokenize and pack once, over 2 nodes x 2 tasks ---"
rc=0
"$PYTHON" -m hpc.submit --site local --nodes 2 --job-name "$JOB-prepare" --wait -- -m train.prepare "${CONFIG[@]}" \
  | tee "jobs/$JOB-prepare-submit.log" | { grep -E '^\[prepare\]|^\[wait\]|^submitted|COMPLETED|FAILED' || true; } || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "demo_chat.sh: the prepare job failed (exit $rc); see jobs/$JOB-prepare-submit.log and the job's logs" >&2
  exit 1
fi
echo "--- train: dp2 x tp2 over nodes n1 and n2 ---"
"$PYTHON" -m hpc.submit --site local --nodes 2 --job-name "$JOB" --wait -- "${CONFIG[@]}" | tee "jobs/$JOB-submit.log"
job=$(sed -n 's/^submitted job \([0-9]*\).*/\1/p' "jobs/$JOB-submit.log")
"$PYTHON" -m hpc.jobs report "$job"
echo "--- the exported model answers through its chat template (jobs/$JOB/hf) ---"
for question in 'In Macbeth, who speaks the line "Is this a dagger which I see before me,"?' \
                'Which work of Shakespeare has the line "O Romeo, Romeo! wherefore art thou Romeo?"?'; do
  echo "user: $question"
  answer=$("$PYTHON" -m train.generate "jobs/$JOB/hf" --chat "$question" 2>"jobs/$JOB-generate.err") || {
    rc=$?
    cat "jobs/$JOB-generate.err" >&2
    echo "demo_chat.sh: the exported model did not answer (train.generate exit $rc)" >&2
    exit 1
  }
  echo "assistant: $answer"
done
