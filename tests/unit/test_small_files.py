"""The small files the project reads (leases, markers, metadata, recordings, configs) are regular files of bounded
size, checked before they are read: a FIFO, a device or a directory is refused without blocking, a huge file without
reading it."""

from __future__ import annotations

import os

import pytest

from hpc.node.files import NotASmallFile, read_json_object, read_small, read_small_text, regular_file_problem


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
