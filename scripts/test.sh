#!/usr/bin/env bash
# The test suite by tier: scripts/test.sh [unit|dist|slurm] [pytest args...]; no tier runs all three.
# scripts/test.sh latest: the newest versions pyproject.toml allows (in .venv-latest and .extras/fp8-latest), the unit
# tier and the QLoRA tests against them.
# scripts/test.sh gpu [--parts ...]: the GPU suite (bench/gpu_suite.py) on a machine with one GPU, with .venv's python
# or, where there is none (a GPU machine with torch installed), python3.
# unit and dist need no cluster; slurm and the whole suite (re)start the local Slurm cluster (SLURM_VERSION: 22.05, the
# default, 24.11 or 26.05; scripts/cluster.sh up --slurm) and stop it after, and run test files on TEST_WORKERS (default
# 2) pytest-xdist workers: one file's jobs wait for Slurm while another's train.
# The unit tier and the whole suite first check the tree with ruff (format and lint, pyproject.toml's settings, seconds)
# and fail when it is dirty.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false PYTHONDONTWRITEBYTECODE=1
if [ "${1:-}" = gpu ]; then
  shift
  python=python3
  [ -x .venv/bin/python ] && python=.venv/bin/python
  exec "$python" bench/gpu_suite.py "$@"
fi
if [ "${1:-}" = latest ]; then
  # The newest allowed versions of every dependency; torch stays at the floor, whose CPU wheel this machine holds (the
  # newer ones allowed are multi-GB CUDA builds), and torchao goes beside the venv, as install.sh puts it.
  shift
  venv=.venv-latest
  [ -x $venv/bin/python ] || python3 -m venv $venv || exit 1
  floor=$(sed -n 's/^ *"torch>=\([0-9.]*\).*/\1/p' pyproject.toml)
  echo "torch==$floor" >"$venv/torch-floor.txt"
  $venv/bin/python -m pip install -q --disable-pip-version-check "torch==$floor" \
    && $venv/bin/python -m pip install -q --disable-pip-version-check --upgrade --upgrade-strategy eager \
         --constraint "$venv/torch-floor.txt" -e ".[test]" \
    && $venv/bin/python -m pip install -q --disable-pip-version-check --upgrade --no-deps --target .extras/fp8-latest \
         "$(sed -n 's/^fp8 = \["\([^"]*\)"\].*/\1/p' pyproject.toml)" || exit 1
  $venv/bin/python -m pip list 2>/dev/null | grep -iE '^(torch|transformers|accelerate|peft|trl|submitit|pydantic) '
  ls .extras/fp8-latest | sed -n 's/^\(torchao-.*\)\.dist-info$/\1 (.extras\/fp8-latest)/p'
  export HPC_TEST_TORCHAO=$ROOT/.extras/fp8-latest
  $venv/bin/python -m pytest tests/unit "$@" && exec $venv/bin/python -m pytest tests/dist/test_lora_peft.py -k qlora "$@"
fi
[ -x .venv/bin/python ] || { echo "test.sh: no .venv; run scripts/install.sh first" >&2; exit 1; }
case "${1:-}" in
  unit|dist|slurm) tier=$1; shift; paths=(tests/"$tier") ;;
  *) tier=all; paths=(tests) ;;
esac
if [ "$tier" = unit ] || [ "$tier" = all ]; then
  ruff=.venv/bin/ruff
  [ -x $ruff ] || { echo "test.sh: no $ruff; pip install -e '.[test]' (or run scripts/install.sh)" >&2; exit 1; }
  $ruff format --check . && $ruff check . || { echo "test.sh: ruff: run $ruff format . and fix what $ruff check . names" >&2; exit 1; }
fi
if [ "$tier" = unit ] || [ "$tier" = dist ]; then
  exec .venv/bin/python -m pytest "${paths[@]}" "$@"
fi
# The whole suite: the tiers one after another, each timed; the closing table (scripts/tier_times.py) puts every
# tier's wall time and every slurm file's beside the budget in docs/development.md. TIMES_DIR may hold an "install"
# line from .ci/run.
times=${TIMES_DIR:-$(mktemp -d)}
rc=0
run_tier() {  # run_tier TIER [pytest args...]: one tier on TEST_WORKERS workers, its wall time to $times/walls
  local name=$1 t0=$SECONDS
  shift
  .venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "tests/$name" \
    --junitxml="$times/$name.xml" "$@" \
    || { [ $? -eq 5 ] || rc=1; }  # 5: no test selected (a -k that matches another tier only)
  echo "$name $((SECONDS - t0))" >>"$times/walls"
}
start_cluster() {  # the local cluster on SLURM_VERSION (22.05, the default, 24.11 or 26.05), its clients for the tier
  bash scripts/cluster.sh up --slurm "${SLURM_VERSION:-22.05}" || exit 1
  source "${LAB:-/tmp/hpc-slurm}/env.sh"  # SLURM_CONF, and PATH to a newer Slurm's clients
}
if [ "$tier" = slurm ]; then
  start_cluster
  run_tier slurm "$@"
else
  run_tier unit "$@"
  run_tier dist "$@"
  start_cluster
  run_tier slurm "$@"
fi
bash scripts/cluster.sh down >/dev/null 2>&1
.venv/bin/python scripts/tier_times.py "$times"
exit $rc
