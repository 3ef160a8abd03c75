#!/usr/bin/env bash
# Install everything this project needs on a Debian 12 machine (run as root):
# Debian's Slurm, munge and MariaDB for the local cluster, bubblewrap for the container
# tests, then a virtual environment in .venv with the project and its test extra.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}

need=()
for cmd in slurmctld slurmd sbatch munged slurmdbd mariadbd ip nsenter bwrap; do
  command -v "$cmd" >/dev/null 2>&1 || need+=("$cmd")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "[install] apt: Slurm, munge, MariaDB, bubblewrap (missing: ${need[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client slurmdbd munge mariadb-server iproute2 util-linux bubblewrap >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[install] creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
echo "[install] pip install -e .[test] (torch 2.13.0 CPU wheel first, so no CUDA build is pulled)"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[test]" 2>&1 | grep -v "is ignored" || true
# torchao (the [fp8] extra) prints warnings in every process that imports transformers on a CPU
# torch, so the CPU tests of FP8 get it from a folder of its own instead of the venv.
echo "[install] torchao for the FP8 tests into .extras/fp8"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --upgrade --target "$ROOT/.extras/fp8" "torchao==0.17.0" 2>&1 | grep -v "is ignored" || true
"$VENV/bin/python" -c "import torch, transformers, submitit, hpc, train; print('[install] ok: torch', torch.__version__, 'transformers', transformers.__version__)"
