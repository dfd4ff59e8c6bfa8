"""What a rank's wrappers hand back for an asynchronous call, and when a call is threaded.

:class:`TracedWork` stands in for torch's ``Work`` request of an ``isend``/``irecv`` or an
``async_op=True`` collective, so that waiting on it shows on the board, in the trace and
in the rank's message counts (:mod:`helpers._runtime.instrument`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .board import FLAG_TIMED, FLAG_UNSURE
from .protocol import TraceEvent

__all__ = ["TracedWork", "threaded"]


class TracedWork:
    """Stands in for a ``Work`` request; notes the wait on the board, and in the trace.

    For an ``isend``/``irecv``, ``count`` is where in the rank's row of message counts its
    completion is counted: once, after the first ``wait()`` that returns (a second wait
    must not count the message twice: that would make a receive look unmatched).
    """

    __slots__ = ("_work", "_events", "_instrument", "_label", "_count")

    def __init__(self, work: Any, events: list[TraceEvent], instrument: Any, label: tuple,
                 count: int = -1) -> None:
        self._work = work
        self._events = events
        self._instrument = instrument
        self._label = label
        self._count = count

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        inst = self._instrument
        op, peer, nbytes = self._label
        if threaded(inst):
            inst.flags |= FLAG_UNSURE
        # A wait with a timeout of its own may return with no peer's help: say so.
        inst.post("wait", op, peer, nbytes, None, FLAG_TIMED if args or kwargs else 0)
        began = time.perf_counter()
        try:
            done = self._work.wait(*args, **kwargs)
        finally:
            ended = time.perf_counter()
            inst.running()
            for event in self._events:
                if event.wait_start is None:
                    event.wait_start = began
                event.waited = ended
        if self._count >= 0 and done is not False:
            inst.counts[self._count] += 1  # after the board says "running", never before
            self._count = -1
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)

    def __repr__(self) -> str:
        return f"<traced {self._work!r}>"


def threaded(inst: Any) -> bool:
    """Whether this call runs beside other Python threads of the rank, or in one of them.

    A rank runs its requests in its main thread and starts no other; the board shows one
    call per rank, so while other threads run, a peer may be about to get what this call
    waits for from a thread the board does not show.
    """
    try:  # threading.active_count() without its lock: a count read under the GIL is whole, and this runs on every call
        count = len(threading._active) + len(threading._limbo)
    except AttributeError:  # a Python without those (they are private)
        count = threading.active_count()
    return count > inst.threads or threading.get_ident() != inst.main_thread
