"""The unit tier starts no process: a test here that does fails, naming the tier it belongs in."""

import sys

import pytest

_EVENTS = ("subprocess.Popen", "os.system", "os.posix_spawn", "os.fork", "os.exec", "os.spawn", "pty.spawn")
_running: list[str] = []


def _refuse_processes(event: str, args: tuple) -> None:
    if _running and event in _EVENTS:
        raise RuntimeError(
            f"{_running[0]} starts a process ({event} {args[0]!r}): a unit test starts none; "
            "move it to tests/dist (processes) or tests/slurm (the cluster)"
        )


sys.addaudithook(_refuse_processes)


@pytest.fixture(autouse=True)
def no_processes(request):
    _running.append(request.node.nodeid)
    yield
    _running.clear()


@pytest.fixture
def one_rank():
    """A process group of this one rank (gloo, in process), for code that calls collectives."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
