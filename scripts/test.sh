#!/usr/bin/env bash
# The test suite by tier: scripts/test.sh [unit|dist|slurm] [pytest args...]; no tier runs all three.
# scripts/test.sh latest: the newest versions pyproject.toml allows (in .venv-latest and .extras/fp8-latest), the unit
# tier and the QLoRA tests against them.
# scripts/test.sh gpu [--parts ...]: the GPU suite (bench/gpu_suite.py) on a machine with one GPU, with .venv's python
# or, where there is none (a GPU machine with torch installed), python3.
# unit and dist need no cluster; slurm and the whole suite (re)start the local Slurm cluster (SLURM_VERSION: 22.05, the
# default, 24.11 or 26.05; scripts/cluster.sh up --slurm) and stop it after, and run test files on TEST_WORKERS (default
# 2) pytest-xdist workers: one file's jobs wait for Slurm while another's train.
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
if [ "$tier" = unit ] || [ "$tier" = dist ]; then
  exec .venv/bin/python -m pytest "${paths[@]}" "$@"
fi
bash scripts/cluster.sh up --slurm "${SLURM_VERSION:-22.05}" || exit 1
source "${LAB:-/tmp/hpc-slurm}/env.sh"  # SLURM_CONF, and PATH to a newer Slurm's clients
.venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile "${paths[@]}" "$@"
rc=$?
bash scripts/cluster.sh down >/dev/null 2>&1
exit $rc
