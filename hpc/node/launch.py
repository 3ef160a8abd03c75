"""First thing on every Slurm task: derive the rank wiring, then run the rank command as a child.

    srun python -m hpc.node.launch [--launcher srun|torchrun|accelerate] [--gpus-per-node G] [--container ARGV] -- CMD
    ARGS...
    python -m hpc.node.launch --rank -- CMD ARGS...   (one rank under torchrun / accelerate launch)

With ``srun`` (one task per GPU) the task is rank RANK and runs CMD with RANK,
WORLD_SIZE, LOCAL_RANK, ... set. With ``torchrun`` or ``accelerate`` (one task per
node) it runs ``torchrun`` / ``accelerate launch`` with this node's rank, read here on
the node itself, and each of their processes runs CMD through ``--rank``. Whoever runs
CMD stays alive through stop signals and turns its clean stop (exit 75) into exit 0 and
a stop record (`hpc.node.contract`), so a stop never reads as a failure on any launcher.
It also passes each stop signal it gets on to CMD as the notice file (``HPC_STOP_NOTICE``),
which `hpc.node.stop_flag` reads, and says in the log when CMD does not catch the signal.
With ``--container`` (apptainer, singularity or a command prefix; `hpc.container`) this
runs on the host and starts the container's command with CMD (or torchrun / accelerate)
behind it, so the stop record and the requeue stay outside the container.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from hpc.node.attempt import record_exit, record_start
from hpc.node.cli import HpcError, Parser, fail, print_error, shown, whole
from hpc.node.contract import (
    ATTEMPT_VAR,
    DEFAULT_DIST_TIMEOUT_S,
    DIST_TIMEOUT_VAR,
    EXIT_BAD_INPUT,
    EXIT_STOPPED,
    LAUNCH_MODULE,
    STANDBY_VAR,
    STOP_CAUGHT_SUFFIX,
    STOP_NOTICE_VAR,
    record_stop,
    shield_from_stop,
    stop_signals,
)
from hpc.node.launcher import LAUNCHERS, SRUN, Launcher, get_launcher
from hpc.node.netcheck import check_node, dist_timeout_s
from hpc.node.runtime import check_runtime
from hpc.node.slurm_env import derive, node_name
from hpc.node.standby import StandbyRank
from hpc.node.standby import start as start_from_standby

PROG = LAUNCH_MODULE


def prepare(
    launcher: Launcher, command: Sequence[str], gpus_per_node: Optional[int], environ: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """argv and environment for this task; raises RankError or NodeCheckError with what to change."""
    info = derive(environ, launcher, gpus_per_node)
    env = {**environ, **launcher.rank_env(info)}
    env.setdefault(DIST_TIMEOUT_VAR, str(DEFAULT_DIST_TIMEOUT_S))
    dist_timeout_s(env)
    net = check_node(env)
    versions = check_runtime(env)
    node = node_name(environ)
    attempt = f" attempt {environ[ATTEMPT_VAR]}" if environ.get(ATTEMPT_VAR) else ""
    print(
        f"[launch] {node} job {info.job_id} restart {info.restart_count}{attempt}: "
        + (
            f"{launcher.name} x{info.local_world_size} "
            if launcher.per_node
            else f"rank {info.rank}/{info.world_size} local {info.local_rank}/{info.local_world_size} "
        )
        + f"node {info.node_rank}/{info.num_nodes} master {info.master_addr}:{info.master_port}",
        flush=True,
    )
    if info.local_rank == 0:
        print(f"[netcheck] {node}: {net}; {DIST_TIMEOUT_VAR}={env[DIST_TIMEOUT_VAR]}; {versions}", flush=True)
    return launcher.node_argv(command, info), env


def run_wrapped(argv: Sequence[str], env: Mapping[str, str], started: Callable[[int], None] = lambda pid: None) -> int:
    """Run a container runtime's command (and the rank program behind it) in a process group of its own that
    starts with the stop signals ignored, so a wrapper that does not forward signals (bwrap) lives until the rank
    program inside, which catches them, has saved; the stop signals this process gets are passed on to that group."""
    sigs = stop_signals(env)

    def ignore_stop_signals() -> None:
        for sig in sigs:
            signal.signal(sig, signal.SIG_IGN)

    def forward(signum, frame) -> None:
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:  # the group has ended already
            pass

    child = subprocess.Popen(list(argv), env=dict(env), process_group=0, preexec_fn=ignore_stop_signals)
    started(child.pid)
    for sig in sigs:
        signal.signal(sig, forward)
    return child.wait()


def catches(root: int, sig: signal.Signals) -> bool:
    """Whether process ``root`` or one below it catches ``sig`` (from /proc; True where /proc cannot tell)."""
    children: dict[int, list[int]] = {}
    try:
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    ppid = int(Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):  # ended meanwhile
                    continue
                children.setdefault(ppid, []).append(int(entry.name))
    except OSError:
        return True
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            caught = re.search(r"^SigCgt:\s*([0-9a-fA-F]+)", Path(f"/proc/{pid}/status").read_text(), re.M)
        except OSError:
            continue
        if caught and int(caught.group(1), 16) >> (sig - 1) & 1:
            return True
        todo += children.get(pid, [])
    return False


def ignored_notice_line(who: str, sig: signal.Signals) -> str:
    """What the log says when the rank program does not catch a stop signal, and the one line that would have helped."""
    fate = (
        "it ends now without a save"
        if sig == signal.SIGTERM
        else (
            "it runs on until Slurm ends it (at the time limit: TIMEOUT, the steps since its last save lost, no "
            "requeue)"
        )
    )
    return (
        f"[launch] {who}: got {sig.name}, the notice to save and stop, but the script does not catch it: {fate}. "
        "One line makes it save, stop and requeue: trainer.add_callback(RequeueCallback()) from "
        "hpc.integrations.transformers (Trainer, SFTTrainer), or hpc.integrations.accelerate.Requeue in an "
        "accelerate loop; see docs/integrations.md"
    )


def run_noticed(
    argv: Sequence[str], env: Mapping[str, str], who: str, started: Callable[[int], None] = lambda pid: None
) -> int:
    """Run the rank program itself, which starts with the pre-stop signal ignored (`shield_from_stop`); a stop signal
    that reaches this process is left in the notice file named by HPC_STOP_NOTICE, so the program learns of a notice
    that came before it caught the signals, and the log says so once when the program does not catch it (it neither
    announced that it does, as `hpc.node.stop_flag.StopFlag` does, nor has a handler of its own)."""
    told: set[int] = set()
    sigs = stop_signals(env)
    with tempfile.TemporaryDirectory(prefix="hpc-notice-") as tmp:
        notice = Path(tmp) / "notice"
        rank_env = {**env, STOP_NOTICE_VAR: str(notice)}
        note = f"[launch] {who}: forked by the node's standby"
        # A stop signal that comes while the rank starts is held, not lost, until on_stop can pass it on; the
        # rank itself starts with the mask it would have had (its dispositions are the shield's).
        signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
        try:
            child = start_from_standby(argv, rank_env, note) if env.get(STANDBY_VAR) else None
            if child is None:
                child = subprocess.Popen(
                    list(argv), env=rank_env, preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)
                )
            started(child.pid)
        except BaseException:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)
            raise
        held = set(signal.sigpending()) & set(sigs)  # came before the rank was there to get them from Slurm

        def on_stop(signum: int, frame) -> None:
            sig = signal.Signals(signum)
            if not notice.exists():
                notice.write_text(sig.name)
            caught = Path(str(notice) + STOP_CAUGHT_SUFFIX).exists() or catches(child.pid, sig)
            if isinstance(child, StandbyRank) or signum in held:  # a standby's rank is not in this step
                held.discard(signum)
                child.send_signal(signum)
            if signum not in told and not caught:
                told.add(signum)
                print(ignored_notice_line(who, sig), flush=True)

        for sig in sigs:
            signal.signal(sig, on_stop)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)
        return child.wait()


def supervise(argv: Sequence[str], env: Mapping[str, str], who: str, wrapped: bool = False, rank: bool = True) -> int:
    """Run ``argv`` as a child through stop signals; its exit code, with a clean stop turned into 0 + stop record.
    ``wrapped``: argv starts with a container runtime's command (`run_wrapped`); ``rank``: argv is the rank
    program itself (`run_noticed`), not a per-node launcher that starts the ranks. In a job with spare nodes the
    start and the end are recorded for the restart supervisor (`hpc.node.attempt`)."""
    shield_from_stop(env)
    node = node_name(env)

    def started(pid: int) -> None:
        record_start(env, who, node, pid, rank_level=rank)

    try:
        if wrapped:
            rc = run_wrapped(argv, env, started)
        elif rank:
            rc = run_noticed(argv, env, who, started)
        else:
            child = subprocess.Popen(list(argv), env=dict(env))
            started(child.pid)
            rc = child.wait()
    except OSError as e:  # a missing or non-executable program
        print_error(PROG, f"{who}: cannot run {shown(argv[0])}: {e.strerror}")
        record_exit(env, who, node, EXIT_BAD_INPUT, rank_level=rank)
        return EXIT_BAD_INPUT
    record_exit(env, who, node, rc, rank_level=rank)
    if rc == EXIT_STOPPED:
        record_stop(env, f"{who} stopped cleanly (exit {EXIT_STOPPED})")
        print(f"[launch] {who}: stopped cleanly for a requeue", flush=True)
        return 0
    return rc if rc >= 0 else 128 - rc  # killed by a signal: the shell's convention


def parser() -> Parser:
    """This module's command line (`hpc.node.restart` reads a task's options with it too)."""
    p = Parser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
    p.add_argument("--launcher", default=SRUN.name, choices=list(LAUNCHERS))
    p.add_argument("--gpus-per-node", type=whole(1, 100_000), default=None)
    p.add_argument("--rank", action="store_true", help="run CMD as one rank of torchrun / accelerate launch")
    p.add_argument("--container", metavar="ARGV", help="a container runtime's command (shell words) to run CMD behind")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    return p


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = parser()
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        p.error("no command given after --")
    try:
        container = shlex.split(a.container or "")
    except ValueError as e:
        p.error(f"--container {shown(a.container)}: not shell words ({e})")
    node = node_name()
    if a.rank and a.container:
        p.error("--container is for the task's launcher, not for one --rank")
    if a.rank:
        sys.exit(supervise(command, os.environ, f"rank {os.environ.get('RANK', '?')} on {node}"))
    launcher = get_launcher(a.launcher)
    try:
        run_argv, env = prepare(launcher, command, a.gpus_per_node, os.environ)
    except HpcError as e:
        fail(PROG, f"{node}: {e}", e.code)
    who = f"{launcher.name} on {node}" if launcher.per_node else f"rank {env['RANK']} on {node}"
    sys.exit(supervise([*container, *run_argv], env, who, wrapped=bool(container), rank=not launcher.per_node))


if __name__ == "__main__":
    main()
