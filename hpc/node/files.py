"""Reading the small files the project keeps beside a run (leases, markers, metadata, recordings, configs): each must be
a regular file of bounded size, checked before it is read, so a FIFO, a device or a directory in its place is one line
instead of a hang, and a huge file one line instead of a long read."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from hpc.node.cli import HpcError

SMALL_BYTES = 1 << 20  # a lease, a marker, an owner record
META_BYTES = 64 << 20  # metadata and configs: a checkpoint's meta.json, a config.json, a YAML config, a recording

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotASmallFile(HpcError, ValueError):
    """The path is not a regular file of at most the allowed size, or its text is not UTF-8 (a ValueError too, so code
    that treats unreadable metadata as absent does so here)."""


def _kind(mode: int) -> str | None:
    """What a file of ``mode`` is when it is not a regular file; None for a regular file."""
    return next((name for test, name in _KINDS if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def regular_file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a regular file that may be opened without blocking ("a FIFO", ...), None when it is one or
    does not exist (the caller's read says so). Nothing is opened."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        return e.strerror or "cannot be read"
    return _kind(mode)


@contextlib.contextmanager
def _regular_fd(path: str | os.PathLike) -> Iterator[tuple[int, os.stat_result]]:
    """``path`` opened for reading without blocking, with its stat: NotASmallFile (one line naming the path) when it
    is not a regular file, checked before it is opened and again on the descriptor (so a FIFO swapped in between is
    refused too). A missing file is FileNotFoundError, as for open()."""
    problem = regular_file_problem(path)
    if problem is not None:
        raise NotASmallFile(f"{path} is {problem}, not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.EISDIR):
            raise NotASmallFile(f"{path} is not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        kind = _kind(st.st_mode)
        if kind is not None:
            raise NotASmallFile(f"{path} is {kind}, not a regular file")
        yield fd, st
    finally:
        os.close(fd)


def read_small(path: str | os.PathLike, limit: int = SMALL_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes; NotASmallFile (one line naming the path) when
    it is another kind of file or larger (`_regular_fd`'s checks). A missing file is FileNotFoundError."""
    with _regular_fd(path) as (fd, st):
        if st.st_size > limit:
            raise NotASmallFile(f"{path} holds {st.st_size} bytes; at most {limit} are read")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    if len(data) > limit:
        raise NotASmallFile(f"{path} holds more than {limit} bytes; at most {limit} are read")
    return data


def read_range(path: str | os.PathLike, start: Optional[int], limit: int) -> tuple[bytes, int]:
    """At most ``limit`` bytes of the regular file ``path`` from byte ``start`` (None: its last ``limit`` bytes), and
    the offset they begin at: a log or a record file that grows without bound, read to a bound. NotASmallFile when it
    is not a regular file (`_regular_fd`'s checks)."""
    with _regular_fd(path) as (fd, st):
        offset = max(0, st.st_size - limit) if start is None else min(start, st.st_size)
        os.lseek(fd, offset, os.SEEK_SET)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit), offset


def read_small_text(path: str | os.PathLike, limit: int = SMALL_BYTES) -> str:
    """`read_small` as UTF-8 text; NotASmallFile naming the byte where it is not UTF-8."""
    data = read_small(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NotASmallFile(f"{path}: not a text file (not UTF-8 at byte {e.start})") from None


def read_json(path: str | os.PathLike, limit: int = SMALL_BYTES):
    """The JSON value of a small file (`read_small_text`); ValueError (json's, or NotASmallFile) when it is not JSON,
    nested past Python's stack or not a small regular file; FileNotFoundError when it is missing."""
    text = read_small_text(path, limit)
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply") from None


def read_json_object(path: str | os.PathLike, limit: int = SMALL_BYTES) -> dict:
    """`read_json` that must give a JSON object; ValueError naming what it is otherwise."""
    value = read_json(path, limit)
    if not isinstance(value, dict):
        raise ValueError(f"{Path(path).name} holds a JSON {json_kind(value)}, not an object")
    return value


def json_kind(value) -> str:
    """JSON's name for the kind of a parsed value: object, array, string, number, boolean, null."""
    for kind, name in ((dict, "object"), (list, "array"), (str, "string"), (bool, "boolean"), ((int, float), "number")):
        if isinstance(value, kind):
            return name
    return "null"
