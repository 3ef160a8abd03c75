"""``python -m hpc.node.standby [--preload MODULE ...]``: a process on each node of a job with spare nodes that has
imported torch and transformers (and the trainer) ahead of a fault, so a restarted rank starts without paying for it.

It listens on a socket of its node (abstract, named by the job, the node and the user; only the job's user is
served) and, asked by `hpc.node.launch` for a rank, forks: the child takes the rank's standard streams (passed over
the socket), environment, working directory and command (``PYTHON [-u] -m MODULE ARGS`` or ``PYTHON [-u] SCRIPT
ARGS`` of this interpreter) and runs it as ``python`` would, in a process group of its own. The launch task forwards
the signals it gets to the child and takes its exit status as a child's; the child is killed when the launch task
ends first (its step killed). Whatever cannot be served so (another interpreter or option, a standby still importing
or gone, a thread or CUDA already started here) the launch task runs itself, as without a standby. At the run's end
(SIGTERM) it removes this job run's memory snapshots on its node, which a run that failed leaves behind.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import runpy
import select
import selectors
import shutil
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Mapping, Optional, Sequence

from hpc.node.clean_path import drop_working_dir, module_run
from hpc.node.contract import STANDBY_MODULE
from hpc.node.slurm_env import node_name
from hpc.node.snapshot_dir import job_dir

PROG = STANDBY_MODULE
DEFAULT_PRELOAD = ("torch", "transformers")
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
)
REQUEST_BYTES = 4 << 20  # a rank's command and environment
CONNECT_TIMEOUT_S = 5.0


def address(environ: Mapping[str, str]) -> str:
    """The node's standby socket for this job and user (abstract: nothing on disk, gone with the process)."""
    return f"\0hpc-standby-{environ.get('SLURM_JOB_ID', 'none')}-{node_name(environ)}-{os.getuid()}"


def _run_target(argv: Sequence[str]) -> Optional[tuple[bool, str, list[str], bool]]:
    """``argv`` as (is a module, module or script, its args, unbuffered) when this interpreter can run it, else None."""
    if not argv or os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
        return None
    rest, unbuffered = list(argv[1:]), False
    while rest and rest[0] == "-u":
        rest, unbuffered = rest[1:], True
    if rest[:1] == ["-m"] and len(rest) >= 2:
        return True, rest[1], rest[2:], unbuffered
    if rest and not rest[0].startswith("-"):
        return False, rest[0], rest[1:], unbuffered
    return None


# -- the standby (server) -------------------------------------------------------------------------------------------


def _why_not_fork() -> Optional[str]:
    if threading.active_count() > 1:  # Python's; torch's own native threads are fork-aware (as DataLoader's forks)
        return "threads are running in the standby"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised in the standby"
    return None


def _child(conn: socket.socket, listener: socket.socket, fds: list[int], request: dict, wake: tuple, mask: set) -> None:
    """In the forked child: become the rank and run its command as ``python`` would; never returns. It starts with
    every signal blocked, and takes ``mask`` back once its signals are the rank's: a signal sent to it at once waits
    for the rank's disposition instead of running the standby's handler."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for fd in (listener.fileno(), conn.fileno(), *wake):
            os.close(fd)
        os.setpgid(0, 0)
        ignored = set(request["ignored"])
        for sig in range(1, signal.NSIG):
            try:
                signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)
            except (OSError, ValueError):
                pass
        if signal.SIGINT not in ignored:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        is_module, what, args, unbuffered = _run_target(request["argv"])
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True, write_through=unbuffered)
        if request.get("note"):  # the launch task's line, before the rank's own
            print(f"{request['note']} (pid {os.getpid()})", flush=True)
        sys.argv = [what, *args]
        if is_module:  # as python -m: the working directory first, off again for the project's own modules
            sys.path.insert(0, os.getcwd())
            drop_working_dir(module_run(request["argv"]))
            runpy.run_module(what, run_name="__main__", alter_sys=True)
        else:  # as python SCRIPT: its folder first
            sys.path.insert(0, str(Path(what).resolve().parent))
            runpy.run_path(what, run_name="__main__")
        code = 0
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except (Exception, KeyboardInterrupt):  # the rank's own failure, reported as python reports it
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _client_gone(conn: socket.socket) -> bool:
    """Whether the client closed its end of ``conn`` (nothing more to read, ever)."""
    if not select.select([conn], [], [], 0)[0]:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class Standby:
    """The node's standby: serves one rank per connection, reaps its children, kills a child whose client ended."""

    def __init__(self, environ: Mapping[str, str]):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(address(environ))
        self.listener.listen(64)
        self.sel = selectors.DefaultSelector()
        self.children: dict[int, Optional[socket.socket]] = {}  # pid -> its client
        self.clients: dict[socket.socket, int] = {}
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.stop = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop)
        self.sel.register(self.listener, selectors.EVENT_READ, self._accept)
        self.sel.register(self.wake_r, selectors.EVENT_READ, self._reap)

    def _on_stop(self, signum, frame) -> None:
        self.stop = True

    def serve(self) -> None:
        """Until SIGTERM (the run's end: hpc.node.restart ends the standbys' step); then its children are killed and
        this job run's memory snapshots on this node (`hpc.node.snapshot_dir`) removed, whatever ended the run."""
        while not self.stop:
            for key, _ in self.sel.select(timeout=1.0):
                key.data(key.fileobj)
            self._reap(None)
        for pid in list(self.children):
            self._kill(pid)
        snapshots = job_dir(os.environ)
        if snapshots is not None:
            shutil.rmtree(snapshots / node_name(os.environ), ignore_errors=True)
            try:
                snapshots.rmdir()  # the job run's, once every node's is gone
            except OSError:
                pass

    def _accept(self, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        if _peer_uid(conn) != os.getuid():
            conn.close()
            return
        conn.settimeout(CONNECT_TIMEOUT_S)
        try:
            data, fds, _, _ = socket.recv_fds(conn, REQUEST_BYTES, 3)
            while not data.endswith(b"\n") and len(data) < REQUEST_BYTES:
                more = conn.recv(REQUEST_BYTES - len(data))
                if not more:
                    break
                data += more
            request = json.loads(data)
            why = None if len(fds) == 3 and _run_target(request["argv"]) else "not a command this standby runs"
        except (OSError, ValueError, KeyError, TypeError) as e:
            conn.close()
            print(f"[standby] a request could not be read: {e}", flush=True)
            return
        if _client_gone(conn):  # it gave up waiting (the launch task runs the rank itself)
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        why = why or _why_not_fork()
        if why:
            conn.sendall(f"refused {why}\n".encode())
            conn.close()
            for fd in fds:
                os.close(fd)
            return
        sys.stdout.flush()
        sys.stderr.flush()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        pid = os.fork()
        if pid == 0:
            _child(conn, self.listener, fds, request, (self.wake_r, self.wake_w), mask)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        try:  # the child's own group from here on, as the child makes it too: a signal sent at once reaches it
            os.setpgid(pid, pid)
        except OSError:
            pass
        for fd in fds:
            os.close(fd)
        conn.setblocking(False)
        try:
            conn.sendall(f"pid {pid}\n".encode())
        except OSError:  # the launch task gave up waiting and runs the rank itself: this copy must not run
            conn.close()
            self._kill(pid)
            self.children[pid] = None
            return
        self.children[pid], self.clients[conn] = conn, pid
        self.sel.register(conn, selectors.EVENT_READ, self._from_client)

    def _from_client(self, conn: socket.socket) -> None:
        pid = self.clients[conn]
        try:
            data = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the launch task ended first (its step was killed): so does the rank
            self._drop(conn)
            self._kill(pid)
            return
        for line in data.decode(errors="replace").splitlines():
            if line.startswith("signal ") and line[7:].isdigit():
                try:
                    os.killpg(pid, int(line[7:]))
                except ProcessLookupError:
                    pass

    def _kill(self, pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _drop(self, conn: socket.socket) -> None:
        pid = self.clients.pop(conn, None)
        if pid is not None:
            self.children[pid] = None
        self.sel.unregister(conn)
        conn.close()

    def _reap(self, _) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                try:
                    conn.setblocking(True)
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                self._drop(conn)


# -- the launch task's side (client) --------------------------------------------------------------------------------


class StandbyRank:
    """A rank forked by the node's standby, as ``subprocess.Popen`` is used for one: ``pid``, ``send_signal``,
    ``wait``; the signals this process gets (`FORWARDED`) are passed on to it."""

    def __init__(self, conn: socket.socket, pid: int, received: bytes = b""):
        self.conn, self.pid, self.returncode = conn, pid, None
        self._buffer = received
        for sig in FORWARDED:
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, self._forward)

    def _forward(self, signum, frame) -> None:
        self.send_signal(signum)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                self.conn.sendall(f"signal {int(sig)}\n".encode())
            except OSError:
                pass

    def wait(self) -> int:
        """The rank's exit status as ``Popen.wait`` gives it (a signal's: negative); the standby gone (its socket
        closed) takes the rank with it."""
        self.conn.setblocking(True)
        while self.returncode is None:
            if b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text.startswith("exit ") and text[5:].lstrip("-").isdigit():
                    self.returncode = int(text[5:])
                continue
            try:
                data = self.conn.recv(4096)
            except OSError:
                data = b""
            if not data:
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                self.returncode = -signal.SIGKILL
            self._buffer += data
        return self.returncode


def start(argv: Sequence[str], env: Mapping[str, str], note: str = "") -> Optional[StandbyRank]:
    """``argv`` forked by this node's standby with ``env``, or None where it cannot be (run it yourself then);
    ``note``: a line the rank prints first (with its pid)."""
    if _run_target(argv) is None:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(CONNECT_TIMEOUT_S)
    try:
        conn.connect(address(env))
        ignored = [int(s) for s in signal.valid_signals() if signal.getsignal(s) == signal.SIG_IGN]
        request = {"argv": list(argv), "env": dict(env), "cwd": os.getcwd(), "ignored": ignored, "note": note}
        request = json.dumps(request).encode() + b"\n"
        socket.send_fds(conn, [request], [0, 1, 2])
        answer = b""
        while not answer.endswith(b"\n"):
            more = conn.recv(256)
            if not more:
                break
            answer += more
    except OSError:
        conn.close()
        return None
    line, _, rest = answer.partition(b"\n")  # rest: the rank's exit, when it ended before this read
    words = line.decode(errors="replace").split()
    if words[:1] != ["pid"] or len(words) < 2 or not words[1].isdigit():
        conn.close()
        return None
    return StandbyRank(conn, int(words[1]), rest)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__.split("\n")[0])
    p.add_argument("--preload", nargs="*", default=list(DEFAULT_PRELOAD), metavar="MODULE")
    a = p.parse_args(argv)
    t0 = time.monotonic()
    loaded = []
    for module in a.preload:
        try:
            importlib.import_module(module)
            loaded.append(module)
        except Exception as e:  # a module the ranks may not need: the standby serves without it
            print(f"[standby] {node_name()}: {module} not imported ({type(e).__name__}: {e})", flush=True)
    try:
        standby = Standby(os.environ)
    except OSError as e:
        print(f"[standby] {node_name()}: cannot listen ({e.strerror or e}); the ranks start without it", flush=True)
        return
    print(
        f"[standby] {node_name()}: {', '.join(loaded) or 'nothing'} imported in {time.monotonic() - t0:.1f} s",
        flush=True,
    )
    standby.serve()


if __name__ == "__main__":
    main()
