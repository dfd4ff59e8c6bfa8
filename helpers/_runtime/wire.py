"""Length-prefixed pickled messages over pipes, the one framing every channel uses.

A message is an 8-byte little-endian length followed by a pickle. Writers on the rank
side block (a rank has nothing better to do); the notebook side reads and writes without
blocking, through :class:`FrameReader` and :class:`FrameWriter`, so that a rank that stops
reading can never stall the kernel. The kernel and the rank factory talk over a Unix
``SOCK_SEQPACKET`` socket instead: one pickle per packet, with file descriptors passed
along (:func:`send_message`).

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
import socket
import struct
from typing import Any

__all__ = ["encode", "write_frame", "read_frame", "FrameReader", "FrameWriter", "loads", "restrict", "send_message",
           "MAX_PACKET", "MAX_FDS"]

_HEADER = struct.Struct("<Q")
#: The largest message between the kernel and the rank factory (one packet), and the most
#: file descriptors one carries.
MAX_PACKET = 1 << 20
MAX_FDS = 250


def send_message(sock: socket.socket, message: Any, fds: list[int] = ()) -> None:
    """Send one message to or from the rank factory as one packet, with ``fds`` passed along."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) > MAX_PACKET:
        raise ValueError(f"factory message of {len(data)} bytes is over {MAX_PACKET}")
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


# -- unpickling what ranks send --------------------------------------------------------------
#
# Whatever a rank sends (its messages, its return values, its exceptions) is unpickled in
# the process that started it. A rank runs the learner's code, and a pickle can name any
# function to call while it is loaded, so a process that must not run the learner's code
# (the clean re-grade of autograder.grading.clean) calls restrict(): from then on only data comes
# back: the helpers' own messages, plain Python values, tensors and arrays, exceptions.

_BUILTINS = frozenset({"set", "frozenset", "slice", "range", "complex", "bytearray", "list", "dict", "tuple", "int",
                       "float", "str", "bytes", "bool"})
_ALLOWED = {
    "collections": {"OrderedDict", "defaultdict", "deque", "Counter"},
    "copyreg": {"_reconstructor"},
    "torch._tensor": {"_rebuild_from_type_v2"},
    "torch.nn.parameter": {"Parameter"},
    "numpy": {"ndarray", "dtype"},
    "numpy.core.multiarray": {"_reconstruct", "scalar"},
    "numpy._core.multiarray": {"_reconstruct", "scalar"},
    "numpy.dtypes": None,  # the dtype classes (Float64DType, ...)
}
_restricted = False


def _load_storage(data: bytes) -> Any:
    """A tensor's storage, loaded with torch's own data-only loader."""
    import io

    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


class _DataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import dataclasses
        import importlib
        from enum import Enum

        if module == "builtins":
            import builtins

            found = getattr(builtins, name, None)
            if name in _BUILTINS or (isinstance(found, type) and issubclass(found, BaseException)):
                return found
        if module == "torch.storage" and name == "_load_from_bytes":
            return _load_storage
        if module == "torch._utils" and name.startswith("_rebuild_") and "qtensor" not in name:
            return super().find_class(module, name)
        if module == "torch":
            import torch

            found = getattr(torch, name, None)
            if isinstance(found, torch.dtype) or found in (torch.Size, torch.Tensor, torch.device):
                return found
        allowed = _ALLOWED.get(module, ())
        if allowed is None or name in allowed:
            return super().find_class(module, name)
        if module.split(".")[0] in ("helpers", "autograder"):
            found = getattr(importlib.import_module(module), name, None)
            if isinstance(found, type) and (dataclasses.is_dataclass(found) or issubclass(found, (BaseException, Enum))
                                            or (issubclass(found, tuple) and hasattr(found, "_fields"))):
                return found
        raise pickle.UnpicklingError(
            f"a rank sent an object of {module}.{name}, which this process does not load (it loads only data: "
            "numbers, strings, lists, dicts, tensors, arrays and the helpers' own messages)")


def loads(data: bytes) -> Any:
    """Unpickle what a rank sent: plain ``pickle.loads``, or data only once :func:`restrict` was called.

    >>> loads(encode([1, "two"])[_HEADER.size:])
    [1, 'two']
    """
    if not _restricted:
        return pickle.loads(data)
    import io

    return _DataUnpickler(io.BytesIO(data)).load()


def restrict() -> None:
    """From now on this process loads only data from ranks: no pickled function or class runs here.

    >>> import os, pickle, subprocess, sys
    >>> class Evil:
    ...     def __reduce__(self):
    ...         return (os.system, ("echo ran",))
    >>> code = "from helpers._runtime import wire as _wire; _wire.restrict(); _wire.loads(sys.stdin.buffer.read())"
    >>> done = subprocess.run([sys.executable, "-c", "import sys; " + code], input=pickle.dumps(Evil()),
    ...                       capture_output=True)
    >>> done.stdout, b"which this process does not load" in done.stderr
    (b'', True)
    """
    global _restricted
    _restricted = True


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
    return loads(body)


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
            out.append(loads(bytes(self._buffer[_HEADER.size:end])))
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
