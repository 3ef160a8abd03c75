#!/usr/bin/env bash
# Install everything this project needs on a Debian 12 machine (run as root):
# Debian's Slurm, munge and MariaDB for the local cluster, bubblewrap for the container
# tests, then a virtual environment in .venv with the project and its test extra, at the dependency floors of
# pyproject.toml. A failed step stops the install (exit 1) naming what it could not install.
# SLURM_VERSION=24.11 or 26.05 also builds that Slurm's chroot (scripts/slurm_root.sh) for `cluster.sh up --slurm`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
SLURM_VERSION=${SLURM_VERSION:-22.05}

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

case "$SLURM_VERSION" in
  22.05) ;;
  24.11 | 26.05)
    echo "[install] Slurm $SLURM_VERSION's chroot (scripts/slurm_root.sh)"
    bash "$ROOT/scripts/slurm_root.sh" "$SLURM_VERSION" >/dev/null || { echo "[install] FAILED: Slurm $SLURM_VERSION" >&2; exit 1; }
    ;;
  *) echo "[install] SLURM_VERSION=$SLURM_VERSION is not known; allowed: 22.05, 24.11, 26.05" >&2; exit 2 ;;
esac

if [ ! -x "$VENV/bin/python" ]; then
  echo "[install] creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi

# pip_install WHAT ARGS...: pip install ARGS quietly (without pip's "is ignored" notes); a failure stops the install
# naming WHAT, after pip's own lines (which name the package it could not install).
pip_install() {
  local what=$1 rc=0
  shift
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 | { grep -v "is ignored" || true; } || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "[install] FAILED: pip install $what (exit $rc); see pip's lines above" >&2
    exit 1
  fi
}

# The dependency floors of pyproject.toml are what gets installed and tested: torch, transformers, accelerate and
# submitit at exactly their lowest allowed versions.
floors=$(sed -n 's/^ *"\(torch\|transformers\|accelerate\|submitit\)\(>=\|==\)\([0-9][0-9.]*\)[",].*/\1==\3/p' "$ROOT/pyproject.toml")
if [ "$(wc -l <<<"$floors")" -ne 4 ]; then
  echo "[install] pyproject.toml: expected a floor (>= or ==) for each of torch, transformers, accelerate, submitit; found: ${floors:-none}" >&2
  exit 1
fi
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "$floors" >"$constraints"
torch_floor=$(grep '^torch==' "$constraints")
echo "[install] pip install -e .[test] at the floors ($(tr '\n' ' ' <"$constraints")); the torch CPU wheel first, so no CUDA build is pulled"
pip_install "$torch_floor" "$torch_floor"
pip_install "-e .[test] (the project and its test extra)" --constraint "$constraints" -e "$ROOT[test]"
# torchao (the [fp8] extra) prints warnings in every process that imports transformers on a CPU
# torch, so the CPU tests of FP8 get it from a folder of its own instead of the venv.
echo "[install] torchao for the FP8 tests into .extras/fp8"
pip_install "torchao==0.17.0" --no-deps --upgrade --target "$ROOT/.extras/fp8" "torchao==0.17.0"
"$VENV/bin/python" -c "import torch, transformers, accelerate, submitit, train
print('[install] ok: torch', torch.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__,
      'submitit', submitit.__version__)"
