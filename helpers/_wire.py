"""Length-prefixed pickled messages over pipes, the one framing every channel uses.

A message is an 8-byte little-endian length followed by a pickle. Writers on the rank
side block (a rank has nothing better to do); the notebook side reads and writes without
blocking, through :class:`FrameReader` and :class:`FrameWriter`, so that a rank that stops
reading can never stall the kernel.

Example::

    >>> import os
    >>> r, w = os.pipe()
    >>> write_frame(w, {"hello": 1})
    >>> reader = FrameReader()
    >>> reader.feed(os.read(r, 1024))
    >>> reader.messages()
    [{'hello': 1}]
"""

from __future__ import annotations

import os
import pickle
import struct
from typing import Any

__all__ = ["encode", "write_frame", "read_frame", "FrameReader", "FrameWriter"]

_HEADER = struct.Struct("<Q")


def encode(message: Any) -> bytes:
    """Return the bytes of one framed message."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def write_frame(fd: int, message: Any) -> None:
    """Write one message to a blocking file descriptor."""
    data = memoryview(encode(message))
    while data:
        written = os.write(fd, data)
        data = data[written:]


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Any:
    """Read one message from a blocking file descriptor; ``None`` at end of file."""
    header = _read_exact(fd, _HEADER.size)
    if header is None:
        return None
    body = _read_exact(fd, _HEADER.unpack(header)[0])
    if body is None:
        return None
    return pickle.loads(body)


class FrameReader:
    """Collects bytes as they arrive and cuts them into whole messages."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def messages(self) -> list[Any]:
        out = []
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            end = _HEADER.size + size
            if len(self._buffer) < end:
                break
            out.append(pickle.loads(bytes(self._buffer[_HEADER.size:end])))
            del self._buffer[:end]
        return out

    @property
    def pending(self) -> int:
        """Bytes received that do not yet make a whole message."""
        return len(self._buffer)


class FrameWriter:
    """Queues messages for a non-blocking file descriptor and writes what fits."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()

    def queue(self, message: Any) -> None:
        self._buffer += encode(message)
        self.flush()

    def flush(self) -> None:
        """Write as much as the pipe takes now; raises ``BrokenPipeError`` if the reader is gone."""
        while self._buffer:
            try:
                written = os.write(self.fd, self._buffer)
            except BlockingIOError:
                return
            del self._buffer[:written]

    @property
    def waiting(self) -> bool:
        return bool(self._buffer)
