#!/usr/bin/env bash
# A newer Slurm for the local cluster, from Debian's own packages in a debootstrap chroot (run as root):
#
#   scripts/slurm_root.sh VERSION    build $SLURM_ROOTS/VERSION unless it is there; print its path
#
# VERSION: 24.11 (Debian 13 trixie, 24.11.5) or 26.05 (Debian unstable, 26.05.5). The chroot holds slurmctld, slurmd,
# slurmdbd and the clients with their libraries; scripts/cluster.sh runs them with the chroot's loader against the
# host's files (munge, MariaDB and the jobs' python stay the host's). SLURM_ROOTS=/var/lib/hpc-slurm keeps them between
# runs; MIRROR=http://deb.debian.org/debian.
set -euo pipefail
SLURM_ROOTS=${SLURM_ROOTS:-/var/lib/hpc-slurm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

case "${1:-}" in
  24.11) suite=trixie ;;
  26.05) suite=sid ;;
  *) echo "slurm_root.sh: Slurm version '${1:-}' has no chroot; allowed: 24.11, 26.05" >&2; exit 2 ;;
esac
version=$1
root=$SLURM_ROOTS/$version
# Slurm's programs, libslurmfull and plugins, made runnable on the host: the chroot's loader as their interpreter and
# the chroot's library directories as their RPATH (which, unlike LD_LIBRARY_PATH, the jobs they start do not inherit).
# A wrapper that runs the loader would not do: slurmctld and slurmd start copies of themselves through /proc/self/exe.
host_runnable() {
  local r=$1 lib=$1/usr/lib/x86_64-linux-gnu path dirs
  dirs=$r/usr/lib/x86_64-linux-gnu/slurm-wlm:$r/usr/lib/x86_64-linux-gnu:$r/lib/x86_64-linux-gnu
  dirs=${dirs//$r/$root}  # the paths it will have once moved into place
  for path in $(chroot "$r" dpkg -L slurm-client slurmctld slurmd slurmdbd | grep -E '^/usr/s?bin/'); do
    [ -L "$r$path" ] || patchelf --set-interpreter "$root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" \
      --force-rpath --set-rpath "$dirs" "$r$path"
  done
  for path in "$lib"/slurm-wlm/*.so; do patchelf --force-rpath --set-rpath "$dirs" "$path"; done
}
installed() { chroot "$1" dpkg-query -W -f '${Version}' slurmd 2>/dev/null; }

if [ ! -x "$root/usr/sbin/slurmd-wlm" ]; then
  command -v debootstrap >/dev/null && command -v patchelf >/dev/null || {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends debootstrap patchelf >/dev/null
  }
  rm -rf "$root.tmp"
  mkdir -p "$SLURM_ROOTS"
  t0=$(date +%s)
  debootstrap --variant=minbase --include=slurmctld,slurmd,slurmdbd,slurm-client "$suite" "$root.tmp" "$MIRROR" \
    >"$SLURM_ROOTS/$version.debootstrap.log" 2>&1 || {
    echo "slurm_root.sh: debootstrap $suite failed; see $SLURM_ROOTS/$version.debootstrap.log" >&2
    exit 1
  }
  got=$(installed "$root.tmp")
  case "$got" in
    "$version".*) ;;
    *) echo "slurm_root.sh: Debian $suite has slurmd ${got:-none}, not $version.x" >&2; exit 1 ;;
  esac
  host_runnable "$root.tmp"
  mv "$root.tmp" "$root"
  echo "[slurm_root] Slurm $got from Debian $suite in $root ($(($(date +%s) - t0)) s)" >&2
fi
echo "$root"
