#!/usr/bin/env bash
# The whole test suite: (re)start the local Slurm cluster, run pytest, stop the cluster.
# Extra arguments go to pytest (e.g. scripts/test.sh -k render).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false PYTHONDONTWRITEBYTECODE=1
[ -x .venv/bin/python ] || { echo "test.sh: no .venv; run scripts/install.sh first" >&2; exit 1; }
bash scripts/cluster.sh up || exit 1
.venv/bin/python -m pytest "$@"
rc=$?
bash scripts/cluster.sh down >/dev/null 2>&1
exit $rc
