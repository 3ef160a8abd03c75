"""hpc.node.standby with hpc.node.launch, real processes: a rank forked by the node's standby starts with torch
imported, runs as python would run it (its command, environment, working directory, streams, exit code), gets the
signals the launch task gets, dies with the launch task; what the standby cannot run runs as before; another user's
request is not served."""

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, slurm_task_env

from hpc.node.standby import address

RANK = """
import os, signal, sys, time
print("rank", os.environ["RANK"], "torch preloaded", "torch" in sys.modules, "cwd", os.getcwd(), "argv", sys.argv[1:],
      flush=True)
if sys.argv[1:] == ["term"]:
    signal.signal(signal.SIGTERM, lambda *_: (print("got TERM", flush=True), sys.exit(75)))
    print("ready", os.getpid(), flush=True)
    time.sleep(60)
if sys.argv[1:] == ["sleep"]:
    print("ready", os.getpid(), flush=True)
    time.sleep(60)
if sys.argv[1:] == ["kill9"]:
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(3)
"""


@pytest.fixture(scope="module")
def standby():
    """A standby of job 9<pid> on node "here" (its import of torch done), serving the launch tasks of `node_env`."""
    env = slurm_task_env(SLURM_JOB_ID=f"9{os.getpid()}", HPC_STANDBY="1")
    proc = subprocess.Popen(
        [PYTHON, "-u", "-m", "hpc.node.standby", "--preload", "torch"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    line = proc.stdout.readline()
    assert "torch imported in" in line, line
    proc.env = env
    yield proc
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture
def node_env(standby):
    """The launch task's environment."""
    return standby.env


def launch(env: dict, cwd: Path, *command: str, **kw) -> subprocess.Popen:
    argv = [PYTHON, "-m", "hpc.node.launch", "--", *command]
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def wait_for(proc: subprocess.Popen, word: str, timeout: float = 60) -> str:
    """The first line of ``proc``'s output holding ``word`` (read in a thread: the line, not a buffer, is the event)."""
    found: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            if word in line:
                found.put(line)
                return

    threading.Thread(target=read, daemon=True).start()
    try:
        return found.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no {word!r} within {timeout} s") from None


def test_a_rank_is_forked_with_torch_imported_and_runs_as_python_would(node_env, tmp_path):
    (tmp_path / "rank.py").write_text(RANK)
    p = launch(node_env, tmp_path, PYTHON, "-u", "rank.py", "a", "b")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3, err
    assert "forked by the node's standby" in out
    assert f"rank 0 torch preloaded True cwd {tmp_path} argv ['a', 'b']" in out
    p = launch({**node_env, "HPC_STANDBY": ""}, tmp_path, PYTHON, "-u", "rank.py")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3 and "forked by the node's standby" not in out and "torch preloaded False" in out, out + err


def test_a_module_has_its_working_directory_first_and_the_project_trainer_is_the_projects(node_env, tmp_path):
    (tmp_path / "sibling.py").write_text("WHO = 'sibling'\n")
    (tmp_path / "mine.py").write_text("import sibling, sys\nprint('imported', sibling.WHO)\nsys.exit(4)\n")
    (tmp_path / "train.py").write_text("print('the user train.py ran')\n")
    p = launch(node_env, tmp_path, PYTHON, "-u", "-m", "mine")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 4 and "forked by" in out and "imported sibling" in out, out + err
    p = launch(node_env, tmp_path, PYTHON, "-u", "-m", "hpc.node.project_module", "train", "--help")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and "forked by" in out, out + err
    assert "the user train.py ran" not in out and "usage: python -m train" in out, out


def test_the_launch_tasks_signals_reach_the_rank_and_a_clean_stop_is_a_stop(node_env, tmp_path):
    (tmp_path / "rank.py").write_text(RANK)
    record = tmp_path / "stop-record"
    p = launch({**node_env, "HPC_STOP_RECORD": str(record)}, tmp_path, PYTHON, "-u", "rank.py", "term")
    wait_for(p, "ready")
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and "got TERM" in out and record.exists(), out + err


def connections(where: str) -> int:
    """The sockets bound to the abstract address ``where``: its listener, and one more for each connection to it
    (from connect on, accepted or not)."""
    name = "@" + where[1:]
    return sum(line.split()[-1] == name for line in Path("/proc/net/unix").read_text().splitlines()[1:])


@contextlib.contextmanager
def held_stopped(standby: subprocess.Popen, cwd: Path):
    """The standby stopped (SIGSTOP) for the block, `RANK` written to ``cwd``/rank.py; yields the number of sockets
    on the standby's address before."""
    (cwd / "rank.py").write_text(RANK)
    before = connections(address(standby.env))
    os.kill(standby.pid, signal.SIGSTOP)
    try:
        yield before
    finally:
        os.kill(standby.pid, signal.SIGCONT)


def test_a_stop_signal_that_comes_while_the_standby_forks_the_rank_is_passed_on(standby, tmp_path):
    """The standby held stopped while the launch task's request waits for it: the SIGTERM the task gets then is
    neither lost nor fatal to the task; the rank gets it once it runs (ended by it, or caught: "got TERM")."""
    with held_stopped(standby, tmp_path) as before:
        p = launch(standby.env, tmp_path, PYTHON, "-u", "rank.py", "term")
        deadline = time.monotonic() + 60
        while connections(address(standby.env)) == before and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert connections(address(standby.env)) > before, "the launch task never asked the standby"
        p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert (p.returncode, "got TERM" in out) in ((0, True), (128 + signal.SIGTERM, False)), (p.returncode, out + err)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            pass
    return found


def test_a_standby_too_slow_to_answer_leaves_the_rank_to_the_launch_task_and_runs_no_second_copy(standby, tmp_path):
    """The standby held stopped past the launch task's wait for an answer: the task runs the rank itself; the
    standby, resumed, finds the request abandoned and forks nothing (no second rank 0), and serves on."""
    with held_stopped(standby, tmp_path) as before:
        p = launch(standby.env, tmp_path, PYTHON, "-u", "rank.py", "term")
        rank_pid = int(wait_for(p, "ready").split()[1])
    where = address(standby.env)
    deadline = time.monotonic() + 60
    while connections(where) > before and time.monotonic() < deadline:  # until the standby has dealt with it
        time.sleep(0.01)
    assert standby.poll() is None and connections(where) == before and children(standby.pid) == []
    os.kill(rank_pid, signal.SIGTERM)  # as Slurm signals every process of the step
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and "got TERM" in out and "forked by" not in out, out + err


def test_a_rank_dies_with_its_launch_task_and_a_killed_rank_is_exit_137(node_env, tmp_path):
    (tmp_path / "rank.py").write_text(RANK)
    p = launch(node_env, tmp_path, PYTHON, "-u", "rank.py", "sleep")
    rank_pid = int(wait_for(p, "ready").split()[1])
    assert Path(f"/proc/{rank_pid}").exists()
    p.kill()
    p.wait(timeout=30)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{rank_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{rank_pid}").exists()
    p = launch(node_env, tmp_path, PYTHON, "-u", "rank.py", "kill9")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 137 and "forked by" in out, out + err


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-c", "import sys; print('ran', 'torch' in sys.modules); sys.exit(5)"],
        ["/bin/sh", "-c", "echo ran False; exit 5"],
        [sys.executable, "-X", "dev", "-c", "import sys; print('ran', 'torch' in sys.modules); sys.exit(5)"],
    ],
    ids=["python-c", "another-program", "another-option"],
)
def test_what_the_standby_cannot_run_runs_as_before(node_env, tmp_path, command):
    p = launch(node_env, tmp_path, *command)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 5 and "ran False" in out and "forked by the node's standby" not in out, out + err


def ask_as(uid: int, where: str) -> bytes:
    """What the standby at ``where`` answers a request from a process of user ``uid`` (forked, then that user)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the user, ask, write the answer, end
        try:
            os.close(r)
            if uid != os.getuid():
                os.setgid(uid)
                os.setuid(uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(where)
            socket.send_fds(s, [b'{"argv": [], "env": {}, "cwd": "/", "ignored": []}\n'], [0, 1, 2])
            os.write(w, b"answer " + s.recv(100))
        except OSError as e:  # the standby closed the connection first
            os.write(w, f"closed {type(e).__name__}".encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r, "rb") as f:
        return f.read()


def test_another_users_request_is_not_served(node_env):
    """The job's user is answered (here: a command it does not run, refused); another user's connection is closed
    unanswered, though any user of the node can name the abstract address."""
    assert ask_as(os.getuid(), address(node_env)).startswith(b"answer refused")
    assert ask_as(65534, address(node_env)) in (b"answer ", b"closed BrokenPipeError", b"closed ConnectionResetError")


def test_at_the_runs_end_the_standby_removes_this_runs_snapshots_on_its_node_only(tmp_path):
    """SIGTERM (hpc.node.restart ending the run, however it ended): this job run's snapshots of this node go; another
    node's of the run, the job's next run's and another job's stay."""
    job = f"8{os.getpid()}"
    env = slurm_task_env(SLURM_JOB_ID=job, SLURM_RESTART_COUNT="0", HPC_SNAPSHOT_DIR=str(tmp_path))
    dirs = [tmp_path / f"{job}.0" / n / "step-4" for n in ("here", "n2")] + [
        tmp_path / f"{job}.1" / "here" / "step-4",
        tmp_path / "777.0" / "here" / "step-4",
    ]
    for d in dirs:
        d.mkdir(parents=True)
        (d / "rank-0.pt").write_bytes(b"state")
    standby = subprocess.Popen(
        [PYTHON, "-u", "-m", "hpc.node.standby", "--preload"], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    assert "imported in" in standby.stdout.readline()
    standby.terminate()
    assert standby.wait(timeout=30) == 0
    assert [d.exists() for d in dirs] == [False, True, True, True]


def test_a_ranks_exit_read_with_its_pid_is_its_exit(tmp_path):
    """A rank that ends before the launch task reads the standby's answer: "pid" and "exit" come in one read, and the
    exit is the rank's (it was read as the standby gone: killed, 137)."""
    from hpc.node.standby import start

    env = slurm_task_env(SLURM_JOB_ID=f"6{os.getpid()}")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address(env))
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        _, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        for fd in fds:
            os.close(fd)
        conn.sendall(b"pid 4999999\nexit 3\n")  # no such pid (above pid_max): nothing to kill
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    rank = start([PYTHON, "-u", "rank.py"], env)
    assert rank is not None and rank.pid == 4999999 and rank.wait() == 3
    server.close()
