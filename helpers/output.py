"""Where the ranks' output goes: labelled lines, shown live, never on the kernel's stderr.

Every rank's stdout and stderr (Python's and the C++ libraries', gloo's warnings included)
are pipes that the notebook reads while the ranks run. Each complete line is passed on as
``[rank N] text``. The ``output`` argument of :func:`helpers.launch` decides where:

- ``"live"`` (default): printed to the notebook's standard output as lines arrive. Lines a
  rank wrote to its stderr are marked ``[rank N:err]`` but still go to standard output,
  because nbgrader scores a test cell 0 when anything reaches stderr.
- ``"stderr"``: like ``"live"``, but a rank's stderr lines go to the notebook's stderr
  (handy in a terminal; do not use it in graded notebooks).
- ``"quiet"``: nothing is printed; the text is still kept on the result's ``.output``.
- a callable ``sink(rank, stream, line)``: called for each line (stream is ``"stdout"``
  or ``"stderr"``).

At most ``max_lines`` lines per rank are printed (default 1000) so that a rank that
floods output cannot freeze the browser; the rest is counted and dropped, and the last
64 KiB per rank stay on ``.output``.

Example::

    >>> router = OutputRouter("quiet")
    >>> router.feed(0, "stdout", b"hello\\nwor")
    >>> router.feed(0, "stdout", b"ld\\n")
    >>> router.text(0)
    'hello\\nworld\\n'
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Callable, Union

__all__ = ["OutputRouter", "OutputSpec"]

Sink = Callable[[int, str, str], None]
OutputSpec = Union[str, Sink]

_MODES = ("live", "stderr", "quiet")
_KEEP_BYTES = 64 * 1024


class OutputRouter:
    """Cuts each rank's byte streams into lines, labels them, and sends them on."""

    def __init__(self, output: OutputSpec = "live", max_lines: int = 1000) -> None:
        if not callable(output) and output not in _MODES:
            raise ValueError(
                f"output={output!r} is not understood; pass one of {', '.join(map(repr, _MODES))} "
                "or a function sink(rank, stream, line)"
            )
        self.output = output
        self.max_lines = max_lines
        self._partial: dict[tuple[int, str], bytearray] = {}
        self._kept: dict[int, deque[str]] = {}
        self._kept_size: dict[int, int] = {}
        self._printed: dict[int, int] = {}
        self._dropped: dict[int, int] = {}

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        """Take bytes a rank wrote; pass on every complete line."""
        buf = self._partial.setdefault((rank, stream), bytearray())
        buf += data
        if b"\n" not in data:
            return
        *lines, rest = buf.split(b"\n")
        self._partial[(rank, stream)] = bytearray(rest)
        for line in lines:
            self._line(rank, stream, line.decode("utf-8", "backslashreplace"))

    def flush(self, rank: int | None = None) -> None:
        """Pass on unfinished lines (a rank ended without a final newline)."""
        for (r, stream), buf in list(self._partial.items()):
            if buf and (rank is None or r == rank):
                self._partial[(r, stream)] = bytearray()
                self._line(r, stream, buf.decode("utf-8", "backslashreplace"))

    def note(self, text: str) -> bool:
        """A line of our own (not from a rank), shown the same way as rank output.

        Returns whether it was shown (not with ``"quiet"`` or a sink function)."""
        if self.output in ("live", "stderr"):
            _write(sys.stdout, text + "\n")
            return True
        return False

    def text(self, rank: int) -> str:
        """The output a rank produced (its last 64 KiB), both streams interleaved."""
        return "".join(self._kept.get(rank, []))

    def summary(self) -> dict[int, int]:
        """Lines dropped per rank because of ``max_lines``."""
        return dict(self._dropped)

    def _line(self, rank: int, stream: str, line: str) -> None:
        self._keep(rank, line + "\n")
        if callable(self.output):
            self.output(rank, stream, line)
            return
        if self.output == "quiet":
            return
        printed = self._printed.get(rank, 0)
        if printed >= self.max_lines:
            dropped = self._dropped.get(rank, 0)
            if dropped == 0:
                _write(
                    sys.stdout,
                    f"[rank {rank}] ... more output than {self.max_lines} lines; the rest is "
                    "not shown (see the result's .output, or pass max_lines=)\n",
                )
            self._dropped[rank] = dropped + 1
            return
        self._printed[rank] = printed + 1
        if stream == "stderr":
            target = sys.stderr if self.output == "stderr" else sys.stdout
            _write(target, f"[rank {rank}:err] {line}\n")
        else:
            _write(sys.stdout, f"[rank {rank}] {line}\n")

    def _keep(self, rank: int, line: str) -> None:
        kept = self._kept.setdefault(rank, deque())
        kept.append(line)
        size = self._kept_size.get(rank, 0) + len(line)
        while size > _KEEP_BYTES and len(kept) > 1:
            size -= len(kept.popleft())
        self._kept_size[rank] = size


def _write(stream, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):  # a closed stream must not break the launch
        pass
