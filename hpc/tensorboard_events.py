"""TensorBoard's event file written without torch or numpy: TFRecord framing (length, data, each with its masked
CRC-32C) around the ``Event`` protocol buffers that the tensorboard package defines."""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)  # the Castagnoli polynomial, reflected
        table.append(crc)
    return tuple(table)


_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C of ``data``, rotated right by 15 bits plus a constant."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord: little-endian uint64 length, its masked CRC, the data, the data's masked CRC."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


def write_scalars(logdir: Path, scalars: list[tuple[int, str, float]]) -> Path:
    """A new event file in ``logdir`` (made) holding each ``(step, tag, value)`` as a scalar summary; its path."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    logdir.mkdir(parents=True, exist_ok=True)
    now = time.time()
    path = logdir / f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.0"
    events = [Event(wall_time=now, file_version="brain.Event:2")]
    for step, tag, value in scalars:
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
        events.append(Event(wall_time=now, step=step, summary=summary))
    path.write_bytes(b"".join(record(e.SerializeToString()) for e in events))
    return path
