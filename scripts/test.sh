#!/usr/bin/env bash
# The test suite by tier: scripts/test.sh [unit|dist|slurm] [pytest args...]; no tier runs all three.
# scripts/test.sh gpu [--parts ...]: the GPU suite (bench/gpu_suite.py) on a machine with one GPU, with .venv's python
# or, where there is none (a GPU machine with torch installed), python3.
# unit and dist need no cluster; slurm and the whole suite (re)start the local Slurm cluster and stop it after, and run
# test files on TEST_WORKERS (default 2) pytest-xdist workers: one file's jobs wait for Slurm while another's train.
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
[ -x .venv/bin/python ] || { echo "test.sh: no .venv; run scripts/install.sh first" >&2; exit 1; }
case "${1:-}" in
  unit|dist|slurm) tier=$1; shift; paths=(tests/"$tier") ;;
  *) tier=all; paths=(tests) ;;
esac
if [ "$tier" = unit ] || [ "$tier" = dist ]; then
  exec .venv/bin/python -m pytest "${paths[@]}" "$@"
fi
bash scripts/cluster.sh up || exit 1
.venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" --dist loadfile "${paths[@]}" "$@"
rc=$?
bash scripts/cluster.sh down >/dev/null 2>&1
exit $rc
