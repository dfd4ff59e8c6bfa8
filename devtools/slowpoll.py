"""A slowed wait on the notebook's side, to make the ranks' output race happen on purpose.

The notebook (:class:`helpers._runtime.rankio.RankIO`) waits for any of its ranks' pipes with
``select.poll`` and then reads the ones that were ready. On a loaded machine the kernel can
be held up for milliseconds between the two, and a rank may print and reply meanwhile.
:class:`SlowPoller` widens that gap to ``delay`` seconds (and can run a function in it), so
tests and soak runs meet the race every time instead of once in hundreds of requests.

In a notebook or a test, before the ranks start::

    >>> import devtools.slowpoll as slowpoll
    >>> slowpoll.install(0.2)      # every RankGroup made from now on waits 0.2 s more
    >>> slowpoll.uninstall()

Only for the course's own tests and benchmarks.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["SlowPoller", "install", "uninstall"]


class SlowPoller:
    """A ``select.poll`` object that, whenever its wait returned something, runs ``after``
    (once) and sleeps ``delay`` seconds before handing the ready list back."""

    def __init__(self, real, delay: float = 0.0, after: Callable[[], None] | None = None) -> None:
        self.real = real
        self.delay = delay
        self.after = after

    def poll(self, timeout=None):
        ready = self.real.poll(timeout)
        if ready:
            if self.after is not None:
                after, self.after = self.after, None
                after()
            if self.delay:
                time.sleep(self.delay)
        return ready

    def register(self, fd, mask=None):
        return self.real.register(fd) if mask is None else self.real.register(fd, mask)

    def modify(self, fd, mask):
        return self.real.modify(fd, mask)

    def unregister(self, fd):
        return self.real.unregister(fd)


_original_init = None


def install(delay: float = 0.2) -> None:
    """Give every :class:`~helpers._runtime.group.RankGroup` made from now on a poller slowed by ``delay`` seconds."""
    global _original_init
    from helpers._runtime.group import RankGroup

    uninstall()
    original = RankGroup.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._poller = SlowPoller(self._poller, delay)

    _original_init = original
    RankGroup.__init__ = __init__


def uninstall() -> None:
    """Groups made from now on wait as usual again."""
    global _original_init
    from helpers._runtime.group import RankGroup

    if _original_init is not None:
        RankGroup.__init__ = _original_init
        _original_init = None
