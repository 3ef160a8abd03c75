"""What the login side, the batch script, the nodes and the trainer agree on: one home for each name,
default, exit code, signal, job state and file name, and the stop-and-requeue contract's node half."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Mapping

# Exit codes of a rank program (the trainer, or a script of yours).
EXIT_DONE = 0  # the run reached its end (also a run started at or past its end)
EXIT_FAILED = 1  # an error in the run; never requeued
EXIT_BAD_INPUT = 2  # config, data or wiring; one line on stderr; never requeued
EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped by a notice with a checkpoint of the stop step saved: requeue me
EXIT_NO_RESTART = 93  # a rank program's "do not restart or requeue me" (as NVIDIA's resiliency extension has it)
EXIT_NODE_FAULT = 94  # a suspected fault of the rank's node: its GPU, driver, link or network (hpc/node/fault_table.py)

# Modules the rendered batch script runs (python -m NAME) and names, and the submit command that renders it.
SUBMIT_MODULE = "hpc.submit"  # python -m hpc.submit renders and submits the script
LAUNCH_MODULE = "hpc.node.launch"  # the first thing on every task
HEALTH_MODULE = "hpc.node.health"  # the GPU health stage (--preflight)
RESTART_MODULE = "hpc.node.restart"  # the in-job restarts on spare nodes (--spare-nodes)
BATCH_HOST_MODULE = "hpc.node.batch_host"  # beside them: requeues the job when its batch host's node fails
STANDBY_MODULE = "hpc.node.standby"  # beside them: each node's process that forks restarted ranks, imports paid
TRAINER_MODULE = "train"  # the trainer: what every rank of a trainer job runs
PROJECT_MODULE = "hpc.node.project_module"  # runs the trainer with the submit directory off sys.path

# Variables the batch script exports for the nodes (hpc/render.py writes them, the nodes read them).
JOB_NAME_VAR = "HPC_JOB_NAME"  # the exact job name: owner of the job's directories
JOB_DIR_VAR = "HPC_JOB_DIR"  # the job directory (logs, metrics.jsonl); for scripts of your own
STOP_SIGNAL_VAR = "HPC_STOP_SIGNAL"  # the pre-stop signal Slurm sends
MAX_REQUEUES_VAR = "HPC_MAX_REQUEUES"  # read by the batch script after the step
STOP_RECORD_VAR = "HPC_STOP_RECORD"  # where hpc.node.launch leaves the stop record
STOP_NOTICE_VAR = "HPC_STOP_NOTICE"  # hpc.node.launch -> rank program: a file created when the task gets a stop signal
STOP_CAUGHT_SUFFIX = ".caught"  # the rank program creates HPC_STOP_NOTICE + this once it catches stop signals
DIST_TIMEOUT_VAR = "HPC_DIST_TIMEOUT_S"  # seconds for rendezvous and every collective
BAD_NODE_MARKS_VAR = "HPC_BAD_NODE_MARKS"  # the directory of this run's bad-node marks (UNHEALTHY_MARKS)
STANDBY_VAR = "HPC_STANDBY"  # set by hpc.node.restart where each node runs hpc.node.standby: ranks fork from it
SITE_DIRS_VAR = "HPC_SITE_DIRS"  # login side: more directories of site profiles (colon-separated)
# what the login node rendered the job for; hpc.node.launch checks each node against them (hpc/node/runtime.py)
EXPECT_PYTHON_VAR = "HPC_EXPECT_PYTHON"  # python's version, e.g. 3.11.2
EXPECT_PROJECT_VAR = "HPC_EXPECT_PROJECT"  # this project's installed version
EXPECT_TORCH_VAR = "HPC_EXPECT_TORCH"  # torch's version with its build, e.g. 2.6.0+cu126
PROJECT_DIST = "hpc-train"  # the project's distribution name (its version is the installed one's)
ATTEMPT_VAR = "HPC_ATTEMPT"  # a job with spare nodes: which start of the ranks within this run of the job (0, 1, ...)
ATTEMPT_DIR_VAR = (
    "HPC_ATTEMPT_DIR"  # ... and the directory where its tasks and ranks leave their records (hpc/node/attempt.py)
)
TEST_FAULTS_VAR = "HPC_TEST_FAULTS"  # tests only: faults the trainer's ranks inject into themselves (train/faults.py)

# torch.distributed's env:// rendezvous: hpc.node.launch sets them from SLURM_* (slurm_env.py), rank programs read them.
RANK_VAR, WORLD_SIZE_VAR = "RANK", "WORLD_SIZE"
LOCAL_RANK_VAR, LOCAL_WORLD_SIZE_VAR = "LOCAL_RANK", "LOCAL_WORLD_SIZE"
NODE_RANK_VAR, GROUP_RANK_VAR = "NODE_RANK", "GROUP_RANK"
MASTER_ADDR_VAR, MASTER_PORT_VAR = "MASTER_ADDR", "MASTER_PORT"

# NCCL's and gloo's network settings: the login side sets them from the profile (hpc/network.py), each node checks
# them before the rank program starts (netcheck.py).
NCCL_SOCKET_IFNAME_VAR = "NCCL_SOCKET_IFNAME"
GLOO_SOCKET_IFNAME_VAR = "GLOO_SOCKET_IFNAME"
NCCL_IB_HCA_VAR = "NCCL_IB_HCA"
NCCL_IB_DISABLE_VAR = "NCCL_IB_DISABLE"
NCCL_IB_GID_INDEX_VAR = "NCCL_IB_GID_INDEX"
NCCL_NET_GDR_LEVEL_VAR = "NCCL_NET_GDR_LEVEL"
NCCL_NET_VAR = "NCCL_NET"  # a net by name (the libfabric plugin's): NCCL fails instead of falling back to sockets
NCCL_NET_PLUGIN_VAR = (
    "NCCL_NET_PLUGIN"  # the net plugin library: a suffix (libnccl-net-NAME.so) or a library name or path
)
FI_PROVIDER_VAR = "FI_PROVIDER"  # libfabric's provider: efa (AWS), cxi (HPE Slingshot)
FABRIC_MIN_VAR = "HPC_FABRIC_MIN"  # the plugin, libfabric and NCCL versions a job's fabric settings rely on
OFI_NET_NAME = "AWS Libfabric"  # the aws-ofi-nccl plugin's net, the name every version of it answers to
NETWORK_VAR_PREFIXES = ("NCCL_", "GLOO_", "FI_")

DEFAULT_DIST_TIMEOUT_S = 300
DEFAULT_STOP_SIGNAL = "USR2"  # NCCL may use USR1
DEFAULT_SIGNAL_LEAD_S = 120  # the signal comes this long before the time limit (Slurm may send it up to 60 s earlier)
DEFAULT_MAX_REQUEUES = 5
DEFAULT_MAX_EXCLUDED_NODES = 2  # nodes a job may exclude itself after they failed hpc.node.health
STOP_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "URG")  # allowed pre-stop signals
REQUEUE_GRACE_S = 120  # how long the batch script waits for Slurm to end a run it requeued
MAX_COUNT = 100_000  # the most nodes, requeues or restarts a flag or a profile key may ask for
MAX_GPUS_PER_NODE = 1024  # GPUs per node a partition may have (hpc.node.health, hpc.node.preflight_node)
MAX_SIGNAL_LEAD_S = 10**7  # hpc.submit --signal-lead and preemption.lead_s
DEFAULT_MAX_RESTARTS = 3  # in-job restarts on the allocation's nodes per job (a job with spare nodes)
DEFAULT_MAX_RESTARTS_PER_NODE = 1  # in-job restarts one node's failures may cause before it leaves the job

# Slurm's final job states. A job of ours that is PREEMPTED is requeued and comes back (partition
# PreemptMode=REQUEUE), so whoever follows a job waits on for one of ENDED.
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
)
ENDED_STATES = FINAL_STATES - {"PREEMPTED"}

# Files and directories of a job and its run.
# task R of job J writes J_R_log.out (as submitit names them); under torchrun/accelerate task R is node R
TASK_LOG = "%j_%t_log.out"
BATCH_LOG = "%j_0_log.out"  # the batch script's own lines go to task 0's log
ARRAY_TASK_ID = "%A_%a"  # in an array job %j above becomes this: ARRAY_TASK (e.g. 123_4), the id Slurm's clients take
STOP_RECORD = ".stop-{job_id}-{restart}"  # in the job directory, per job id and restart
METRICS_FILE = "metrics.jsonl"  # one JSON object per step, in the job directory (the trainer's log.dir)
RUN_CONFIG = "config.yaml"  # the trainer's whole config as it ran, in log.dir
OWNER_FILE = ".owner.json"  # the exact name of the job that created a job, log or checkpoint directory
CHECKPOINT_META = "meta.json"  # a checkpoint's completeness marker and manifest, written last
LEASE_FILE = ".lease.json"  # in a checkpoint directory: the one live run that may write there (hpc/node/lease.py)
SET_ASIDE = ".bad-"  # step-N.bad-<time>: a damaged checkpoint, never loaded or pruned again
FRESH_MARKER = ".fresh.json"  # in a checkpoint directory: which job started over with checkpoint.restart=fresh
PREPARED_MANIFEST = "manifest.json"  # prepared data's manifest, written when every chunk is done
UNHEALTHY_MARKS = (
    ".unhealthy-{job_id}-{restart}"  # in the job directory: one empty file per bad node (failed hpc.node.health,
)
# missing at a collective timeout, a persistent straggler); the batch script requeues the job without them
RESTART_DIR = (
    ".restarts-{job_id}-{restart}"  # in the job directory: one attempt-<N>/ per start of the ranks (spare nodes)
)
ATTEMPT_DIR = "attempt-{attempt}"  # in RESTART_DIR: the attempt's records (hpc/node/attempt.py) and marks/
RESTART_LOG = "restarts.jsonl"  # in the job directory: one record per in-job restart decision (hpc/node/restart.py)
FLIGHT_RECORDER_DIR = "nccl-trace"  # in the trainer's log.dir: NCCL flight recorder dumps, one file per rank
PREFLIGHT_RESULT = "node-{job_id}.json"  # hpc.node.preflight_node's measurements, read by hpc.preflight
SNAPSHOT_DIR_VAR = "HPC_SNAPSHOT_DIR"  # where the nodes keep the trainer's memory snapshots (checkpoint.memory_every)
SNAPSHOT_DIR_DEFAULT = "/dev/shm/hpc-snapshots"  # tmpfs: <it>/<job id>.<run>/<node>/step-N/ (train/snapshot.py)


CHECKPOINT_PREFIX = "step-"


def checkpoint_name(step: int) -> str:
    """A complete checkpoint's directory name: step-00000100 (``.tmp`` appended while it is written)."""
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def set_aside_step(name: str) -> int | None:
    """The step of a set-aside checkpoint's directory name (step-00000100.bad-<time>); None for any other name."""
    m = re.fullmatch(rf"{CHECKPOINT_PREFIX}(\d{{8}}){re.escape(SET_ASIDE)}.+", name)
    return int(m.group(1)) if m else None


def checkpoint_step(name: str) -> int | None:
    """The step of a complete checkpoint's directory name; None for any other name."""
    m = re.fullmatch(rf"{CHECKPOINT_PREFIX}(\d{{8}})", name)
    return int(m.group(1)) if m else None


def task_log(job_dir: Path, job_id: str, task: int | str) -> Path:
    """Task ``task``'s log; task 0's also holds the batch script's own output."""
    return Path(job_dir) / TASK_LOG.replace("%j", str(job_id)).replace("%t", str(task))


def prestop_signal(environ: Mapping[str, str]) -> signal.Signals:
    """The profile's pre-stop signal (default SIGUSR2)."""
    name = environ.get(STOP_SIGNAL_VAR, DEFAULT_STOP_SIGNAL).upper().removeprefix("SIG")
    return signal.Signals[f"SIG{name}"]


def stop_signals(environ: Mapping[str, str]) -> list[signal.Signals]:
    """The pre-stop signal and SIGTERM: a rank program catches them, saves with the others and exits EXIT_STOPPED."""
    return sorted({prestop_signal(environ), signal.SIGTERM})


def shield_from_stop(environ: Mapping[str, str]) -> None:
    """Keep this supervising process alive through stop signals while its child saves.

    The pre-stop signal is ignored, and an ignored signal stays ignored across exec, so a
    rank program still starting up is not killed by an early notice (it catches the signal
    once it can act on it). SIGTERM gets a handler that does nothing; a handler is reset to
    the default in the child, so SIGTERM still ends a rank program that does not catch it.
    """
    sig = prestop_signal(environ)
    if sig != signal.SIGTERM:
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)


def record_stop(environ: Mapping[str, str], note: str) -> Path | None:
    """Leave the stop record the batch script looks for after the step (None outside such a job)."""
    path = environ.get(STOP_RECORD_VAR)
    if not path:
        return None
    Path(path).write_text(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {note}\n")
    return Path(path)
