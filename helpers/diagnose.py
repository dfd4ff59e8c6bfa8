"""Reading the stacks of hung ranks: where is each rank blocked, and in which line of yours?

When ranks run past their timeout, each live rank is asked for a dump of its Python
stacks (Python's ``faulthandler``, which works even while a rank is blocked inside a C++
call such as gloo's ``recv``). This module turns those dumps into frames and into one
sentence per rank, naming the ``torch.distributed`` call it waits in and the learner's
line that made it.

Example::

    >>> dump = '''Current thread 0x00007f (most recent call first):
    ...   File "/site-packages/torch/distributed/distributed_c10d.py", line 2501 in recv
    ...   File "/tmp/ipykernel_1/123.py", line 4 in ring
    ... '''
    >>> frames = parse_dump(dump)[0]["frames"]
    >>> describe_wait(frames)["call"]
    'recv'
"""

from __future__ import annotations

import linecache
import os
import re
from typing import Any

from .errors import cell_label

__all__ = ["parse_dump", "main_stack", "describe_wait", "format_stack"]

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.I)
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def parse_dump(text: str) -> list[dict[str, Any]]:
    """Split a faulthandler dump into threads, each with frames innermost first."""
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            threads.append({"ident": int(m.group(2), 16), "current": m.group(1).startswith("Current"), "frames": []})
            continue
        m = _FRAME.match(line)
        if m and threads:
            threads[-1]["frames"].append(
                {"filename": m.group(1), "lineno": int(m.group(2)), "name": m.group(3).strip()}
            )
    return threads


def main_stack(text: str, main_ident: int | None) -> list[dict[str, Any]]:
    """The frames of a rank's main thread (innermost first) from its latest dump."""
    threads = parse_dump(text)
    if not threads:
        return []
    # A rank may have been dumped more than once; the latest dump is at the end.
    for thread in reversed(threads):
        if main_ident is not None and thread["ident"] == main_ident:
            return thread["frames"]
    return threads[-1]["frames"]


def _is_torch(filename: str) -> bool:
    return f"{os.sep}torch{os.sep}" in filename


def _is_ours(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep)


def _is_distributed(filename: str) -> bool:
    return f"{os.sep}torch{os.sep}distributed{os.sep}" in filename


def describe_wait(frames: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a rank is blocked: the torch.distributed call and the learner's frame.

    Returns a dict with ``call`` (name of the outermost torch.distributed function on the
    stack, or None), ``user`` (the innermost frame outside torch and this package, or None)
    and ``idle`` (True when the rank was waiting for the notebook, not running code).
    """
    call = None
    user = None
    for frame in frames:  # innermost first
        filename = frame["filename"]
        if _is_distributed(filename):
            name = frame["name"]
            if not name.startswith("_") and name not in ("wrapper", "inner", "<lambda>"):
                call = name  # keep the outermost public torch.distributed function
        elif user is None and not _is_torch(filename) and not _is_ours(filename):
            user = frame
            break
    idle = user is None and bool(frames) and _is_ours(frames[0]["filename"]) and frames[0]["name"] in (
        "_read_exact",
        "read_frame",
    )
    return {"call": call, "user": user, "idle": idle}


def frame_label(frame: dict[str, Any]) -> str:
    """``Cell In[3], line 4, in ring`` or ``file.py, line 4, in ring``."""
    return f"{cell_label(frame['filename'])}, line {frame['lineno']}, in {frame['name']}"


def source_line(frame: dict[str, Any]) -> str:
    return linecache.getline(frame["filename"], frame["lineno"]).strip()


def format_stack(frames: list[dict[str, Any]]) -> str:
    """A traceback-style rendering (outermost first) with source lines where known."""
    lines = []
    for frame in reversed(frames):
        lines.append(f"  {frame_label(frame)}")
        code = source_line(frame)
        if code:
            lines.append(f"    {code}")
    return "\n".join(lines)


def summarize(rank: int, frames: list[dict[str, Any]]) -> str:
    """One sentence: where this rank waits."""
    if not frames:
        return f"rank {rank}: no stack could be read (it may be stuck outside Python)"
    where = describe_wait(frames)
    user = where["user"]
    at = ""
    if user is not None:
        code = source_line(user)
        at = f" at {frame_label(user)}" + (f": {code}" if code else "")
    if where["call"]:
        return f"rank {rank} waits in torch.distributed.{where['call']}(){at}"
    if where["idle"]:
        return f"rank {rank} was idle, waiting for work"
    return f"rank {rank} is running{at}"
