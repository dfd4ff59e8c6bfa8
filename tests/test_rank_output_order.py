"""Does every line a rank prints reach the notebook with the request it belongs to?

A rank writes its output before its reply. The notebook wakes when one of a rank's pipes is
readable and reads the pipes it was told about; if the rank prints and replies between the
wake-up and the read, the reply pipe holds the whole answer while the stdout pipe was not in
the list of ready pipes. These tests make that happen on purpose, with an emulated rank (no
process: the test writes on the rank's ends of real pipes) and then with real persistent
ranks whose notebook-side wait is slowed (:mod:`devtools.slowpoll`).
"""

from __future__ import annotations

import os
import select
from types import SimpleNamespace

import pytest

from devtools.slowpoll import SlowPoller
from helpers._runtime import wire
from helpers._runtime.protocol import FD_NAMES, RankException, Failure, Result, Started
from helpers._runtime.rankio import RankIO, RankState
from helpers.output import OutputRouter


class EmulatedGroup(RankIO):
    """The pipe half of a one-rank group, with the rank's ends kept for the test to write on."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, int]] = []  # (stream, text, events already handled)
        self.router = OutputRouter(lambda rank, stream, line: self.lines.append((stream, line, len(self.events))))
        self.ranks = [RankState(0)]
        self.events = []
        self._by_fd = {}
        self._poller = select.poll()
        self._null = os.open(os.devnull, os.O_RDONLY)
        self.board = SimpleNamespace(fd=self._null)
        self.factory = SimpleNamespace(fileno=lambda: -1)
        self.rank_ends = dict(zip(FD_NAMES, self._open_pipes(self.ranks[0])))

    def write(self, name: str, data: bytes) -> None:
        os.write(self.rank_ends[name], data)

    def reply(self, message) -> None:
        wire.write_frame(self.rank_ends["reply"], message)

    def left_in(self, name: str) -> bytes:
        """What is still unread in the notebook's end of one of the rank's pipes."""
        fd = self.ranks[0].fds[name]
        try:
            return os.read(fd, 1 << 16)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        for fd in list(self.rank_ends.values()) + [self._null]:
            os.close(fd)
        for fd in list(self._by_fd):
            self._close_fd(fd)


@pytest.fixture
def group():
    g = EmulatedGroup()
    yield g
    g.close()


def _print_then(group: EmulatedGroup, reply, stream: str = "stdout") -> None:
    """After the notebook's wait returned with only ``Started`` ready: the rank prints a
    line (Python's print writes the text and the newline apart) and sends ``reply``."""
    group.write(stream, b"hello from rank 0")
    group.write(stream, b"\n")
    group.write(stream, b"and a second line")
    group.write(stream, b"\n")
    group.reply(reply)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_line_printed_just_before_the_result_arrives_before_it(group, stream):
    """Printed and replied while the notebook was between its wait and its read: are the
    lines passed on, before the Result is handled, and nothing is left in the pipe?"""
    group.reply(Started(0, 1))
    group._poller = SlowPoller(group._poller, after=lambda: _print_then(group, Result(0, 1, None, "None"), stream))
    group.poll(1.0)
    assert [type(e).__name__ for e in group.take_events()] == ["Result"]
    assert group.lines == [(stream, "hello from rank 0", 0), (stream, "and a second line", 0)], (
        "the rank's lines must be passed on before its Result is handled"
    )
    assert group.left_in(stream) == b""


def test_a_line_printed_just_before_a_failure_arrives_before_it(group):
    """The same for a request that raised: its output comes before its error."""
    group.reply(Started(0, 1))
    failure = Failure(0, 1, RankException.capture(ValueError("bad"), __file__))
    group._poller = SlowPoller(group._poller, after=lambda: _print_then(group, failure))
    group.poll(1.0)
    assert [type(e).__name__ for e in group.take_events()] == ["Failure"]
    assert [line for _, line, _ in group.lines] == ["hello from rank 0", "and a second line"]
    assert group.left_in("stdout") == b""


def test_output_bigger_than_one_read_is_all_taken(group):
    """A rank that printed more than one read takes (64 KiB fills a pipe): is all of it
    passed on with the Result, none left for the next request?"""
    group.reply(Started(0, 1))
    line = b"x" * 1023 + b"\n"

    def flood():
        for _ in range(60):  # 60 KiB: fits the pipe, more than a few reads of 16 KiB would take
            group.write("stdout", line)
        group.reply(Result(0, 1, None, "None"))

    group._poller = SlowPoller(group._poller, after=flood)
    group.poll(1.0)
    assert len(group.lines) == 60
    assert group.left_in("stdout") == b""


def test_a_pipe_closed_by_the_rank_is_not_read_again(group):
    """A rank whose stdout reached its end (closed) and then replied: the drain does not
    touch a descriptor that was closed (and may since belong to something else)."""
    os.close(group.rank_ends.pop("stdout"))
    group.poll(0.1)  # reads the end of file: the notebook closes its end
    assert "stdout" not in {name for _, name in group._by_fd.values()}
    group.reply(Result(0, 1, None, "None"))
    group.poll(1.0)
    assert [type(e).__name__ for e in group.take_events()] == ["Result"]


# --------------------------------------------------------------------------- real persistent ranks


#: Run first on a rank, so that its Started alone wakes the notebook's wait, which is then
#: slowed while the rank prints and replies.
SETTLE = "import time; time.sleep(0.05)\n"


@pytest.fixture
def slowed():
    """Groups made in the test wait 0.2 s between their wake-up and their read: a rank
    that prints a line and replies at once does both inside that gap, every time."""
    from devtools import slowpoll

    slowpoll.install(0.2)
    try:
        yield
    finally:
        slowpoll.uninstall()


def test_five_prints_in_five_requests_each_in_its_own_request(slowed):
    """With the notebook's wait slowed, does each request's line arrive during that request,
    none in the next? Requests to one rank meet the race every time (its Started wakes the
    wait, and its line and Result both land in the gap); requests to both ranks, often."""
    from helpers import Cluster

    seen: list[tuple[int, str]] = []
    with Cluster(2, output=lambda rank, stream, line: seen.append((rank, line)), view="text") as cluster:
        for i, ranks in enumerate([[0], [1], [0, 1], [1], [0]]):
            seen.clear()
            cluster.exec(f"{SETTLE}print('request {i} on rank', rank)", ranks=ranks)
            assert sorted(seen) == [(r, f"request {i} on rank {r}") for r in ranks], (
                f"request {i} to ranks {ranks}: the lines that arrived with it were {seen}"
            )


def test_a_failed_requests_output_comes_with_its_error(slowed):
    """A rank that prints and then raises: is its line shown with that request's error,
    not with the next request?"""
    from helpers import Cluster, RankFailedError

    seen: list[tuple[int, str]] = []
    with Cluster(2, output=lambda rank, stream, line: seen.append((rank, line)), view="text") as cluster:
        with pytest.raises(RankFailedError):
            cluster.exec(f"{SETTLE}print('before the error on rank', rank)\nraise ValueError('bad')", ranks=[1])
        assert seen == [(1, "before the error on rank 1")]
        seen.clear()
        cluster.exec("x = 1")
        assert seen == []


C_PRINT = r"""
from helpers import Cluster
seen = []
with Cluster(2, output=lambda rank, stream, line: seen.append((rank, line)), view="text") as cluster:
    cluster.exec("import ctypes\nctypes.CDLL(None).printf(b'from C on rank %d\\n', rank)")
    print(sorted(seen))
"""


def test_c_library_output_arrives_before_the_reply():
    """Text printed by C code reaches the notebook with its request, not when the rank
    exits. The C library holds a pipe's output in a buffer unless Python runs unbuffered, so
    this runs in a fresh interpreter without ``PYTHONUNBUFFERED`` (a kernel has none)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, "-c", C_PRINT], env=env, capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[(0, 'from C on rank 0'), (1, 'from C on rank 1')]", done.stdout
