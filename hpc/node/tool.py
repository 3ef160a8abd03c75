"""Running the tools the project asks (sbatch, squeue, sacct, scontrol, scancel, sinfo, fi_info, nvidia-smi, dcgmi, a
probe of the nodes' python, hpc.site init's srun -N1): the one place a short-lived subprocess is started, its output
read to a bound (a tool that prints without end cannot fill memory), within a timeout (a hung controller cannot hang
the command), decoded leniently (a byte that is not UTF-8 is a replacement character, never a traceback)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

OUTPUT_BYTES = 8 << 20  # of each of stdout and stderr; the rest is read and dropped
DEFAULT_TIMEOUT_S = 60.0


class ToolMissing(OSError):
    """The tool is not on PATH (a FileNotFoundError's case)."""


class ToolTimeout(OSError):
    """The tool did not finish within its timeout; it was killed."""


@dataclass(frozen=True)
class ToolResult:
    """What the tool answered: its exit code, its output as text, and whether either stream was cut at the bound."""

    returncode: int
    stdout: str
    stderr: str
    truncated: bool = False


def _drain(stream, out: list[bytes], limit: int, cut: list[bool]) -> None:
    """Read ``stream`` to its end, keeping its first ``limit`` bytes in ``out``; ``cut[0]`` set when more came."""
    kept = 0
    while chunk := stream.read(65536):
        keep = chunk[: max(0, limit - kept)]
        if keep:
            out.append(keep)
            kept += len(keep)
        if len(keep) < len(chunk):
            cut[0] = True
    stream.close()


def run_tool(
    argv: Sequence[str],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    limit: int = OUTPUT_BYTES,
    env: Optional[Mapping[str, str]] = None,
    cwd: Optional[str | os.PathLike] = None,
) -> ToolResult:
    """``argv``'s exit code and output (each stream at most ``limit`` bytes, decoded with replacement); ToolMissing
    when the tool is not found, ToolTimeout (the tool killed) after ``timeout_s``."""
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=None if env is None else dict(env),
            cwd=cwd,
            start_new_session=True,  # its own process group: a timeout ends what it started too
        )
    except FileNotFoundError:
        raise ToolMissing(f"{argv[0]} is not on PATH") from None
    parts: tuple[list[bytes], list[bytes]] = ([], [])
    cut = [False]
    readers = [
        threading.Thread(target=_drain, args=(stream, part, limit, cut), daemon=True)
        for stream, part in ((proc.stdout, parts[0]), (proc.stderr, parts[1]))
    ]
    for r in readers:
        r.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise ToolTimeout(f"{argv[0]} did not finish within {timeout_s:g} s") from None
    finally:
        for r in readers:
            r.join(timeout=5)
    out, err = (b"".join(p).decode("utf-8", errors="replace") for p in parts)
    return ToolResult(rc, out, err, cut[0])
