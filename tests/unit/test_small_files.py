"""The small files the project reads (leases, markers, metadata, recordings, configs) are regular files of bounded
size, checked before they are read: a FIFO, a device or a directory is refused without blocking, a huge file without
reading it."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from hpc.node.files import (
    NotASmallFile,
    read_json,
    read_json_object,
    read_range,
    read_small,
    read_small_text,
    regular_file_problem,
)


@pytest.mark.parametrize(
    "kind, says",
    [
        ("fifo", "is a FIFO"),
        ("dir", "is a directory"),
        ("device", "is a character device"),
        ("link-to-fifo", "is a FIFO"),
        ("huge", "holds 2049 bytes; at most 2048"),
        ("binary", r": not a text file \(not UTF-8 at byte 0\)"),
    ],
)
def test_what_is_not_a_small_regular_file_is_refused_unread(kind, says, tmp_path):
    path = tmp_path / "f"
    if kind == "fifo":
        os.mkfifo(path)  # a reader of it would block until a writer came
    elif kind == "dir":
        path.mkdir()
    elif kind == "device":
        path = "/dev/zero"  # endless
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / "fifo")
        path.symlink_to(tmp_path / "fifo")
    elif kind == "huge":
        path.write_bytes(b"x" * 2049)
    else:
        path.write_bytes(b"\xff\xfe")
    with pytest.raises(NotASmallFile, match=says) as e:
        read_small_text(path, limit=2048)
    assert isinstance(e.value, ValueError) and str(path) in str(e.value)


def test_a_small_regular_file_is_read(tmp_path):
    (tmp_path / "f").write_text('{"a": 1}')
    assert read_small(tmp_path / "f", 8) == b'{"a": 1}'
    assert read_json_object(tmp_path / "f") == {"a": 1}
    assert regular_file_problem(tmp_path / "f") is None and regular_file_problem(tmp_path / "absent") is None
    with pytest.raises(FileNotFoundError):
        read_small(tmp_path / "absent")
    (tmp_path / "g").write_text("[1]")
    with pytest.raises(ValueError, match="holds a JSON array, not an object"):
        read_json_object(tmp_path / "g")
    (tmp_path / "h").write_text("[" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply|Expecting"):
        read_json_object(tmp_path / "h")


READERS = {  # every reader of hpc/node/files.py, as its callers use it
    "read_small": lambda p: read_small(p, 2048),
    "read_small_text": lambda p: read_small_text(p, 2048),
    "read_json": lambda p: read_json(p, 2048),
    "read_json_object": lambda p: read_json_object(p, 2048),
    "read_range-tail": lambda p: read_range(p, None, 2048),
    "read_range-from": lambda p: read_range(p, 0, 2048),
}
NOT_REGULAR = {  # every kind of file that is not a regular one, and what is said of it
    "fifo": "is a FIFO",
    "dir": "is a directory",
    "device": "is a character device",
    "link-to-fifo": "is a FIFO",
    "socket": "is a socket",
}


def make(kind: str, tmp_path):
    path = tmp_path / "f"
    if kind in ("fifo", "link-to-fifo"):
        os.mkfifo(tmp_path / "fifo")
        if kind == "fifo":
            return tmp_path / "fifo"
        path.symlink_to(tmp_path / "fifo")
    elif kind == "dir":
        path.mkdir()
    elif kind == "device":
        return "/dev/zero"
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    return path


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("kind", NOT_REGULAR)
def test_every_reader_refuses_every_file_that_is_not_regular_without_blocking(reader, kind, tmp_path):
    path, said = make(kind, tmp_path), []

    def read():
        try:
            READERS[reader](path)
        except NotASmallFile as e:
            said.append(str(e))

    thread = threading.Thread(target=read, daemon=True)  # a reader that opened a FIFO blocking would never return
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), f"{reader} blocked on a {kind}"
    assert said and str(path) in said[0] and NOT_REGULAR[kind] in said[0], said
