#!/usr/bin/env bash
# A TEST FAKE of NVIDIA's nvidia-smi, for the local cluster (scripts/cluster.sh), whose GPUs are fake and whose nodes
# have no NVIDIA driver. cluster.sh installs it as /usr/bin/nvidia-smi inside each GPU node's mount namespace, never
# on this host, so hpc.node.health asks it as it asks the driver's tool on a real GPU node: the project has no switch
# that skips or replaces the check.
#
#   nvidia-smi -q   prints a recorded `nvidia-smi -q` (tests/unit/data/nvidia-smi/) of the node's N fake GPUs: the
#                   first N GPUs of the healthy H100 node's; where the command FAKE_NVIDIA_SMI_FAULTY_IF (from the
#                   job's environment: a test's) succeeds on the node, the faulty recording of N GPUs instead
#                   (2: a100-faulty-r470.txt, 8: h100-faulty.txt)
#
# FAKE_NVIDIA_SMI_GPUS (N) and FAKE_NVIDIA_SMI_RECORDINGS (the recordings' folder): set by the node's wrapper.
set -euo pipefail
gpus=${FAKE_NVIDIA_SMI_GPUS:?the GPUs of the node (the wrapper sets it)}
dir=${FAKE_NVIDIA_SMI_RECORDINGS:?the folder of the recordings (the wrapper sets it)}
if [ "$*" != "-q" ]; then
  echo "nvidia-smi (test fake): only 'nvidia-smi -q' is recorded, not 'nvidia-smi $*'" >&2
  exit 2
fi
recording=h100-healthy.txt
if [ -n "${FAKE_NVIDIA_SMI_FAULTY_IF:-}" ] && (eval "$FAKE_NVIDIA_SMI_FAULTY_IF") >&2; then
  case $gpus in
    2) recording=a100-faulty-r470.txt ;;
    8) recording=h100-faulty.txt ;;
    *) echo "nvidia-smi (test fake): no faulty recording of $gpus GPUs; there are of 2 and 8" >&2; exit 9 ;;
  esac
fi
# the recording's first $gpus GPUs, and its count of them to match
awk -v n="$gpus" '/^Attached GPUs/ { sub(/[0-9]+$/, n) } /^GPU / { g++ } g <= n' "$dir/$recording"
