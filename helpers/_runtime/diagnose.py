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

from ..errors import cell_label
from .board import BoardRecord
from .calls import COLLECTIVES, DDP_CONSTRUCTOR

__all__ = [
    "parse_dump",
    "main_stack",
    "describe_wait",
    "format_stack",
    "summarize",
    "call_text",
    "RECEIVE_FIRST",
    "SEND_FIRST",
    "CALLS_DISAGREE",
    "wait_for_graph",
    "find_cycle",
    "explain_hang",
]

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.I)
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # helpers/, not helpers/_runtime/


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


is_distributed = _is_distributed


def _is_bootstrap(frame: dict[str, Any], frames: list[dict[str, Any]]) -> bool:
    # The factory runs as `python -c "...serve(fd)"`: every rank's outermost frame is that
    # "<string>" module, which is ours, not the learner's.
    return frame is frames[-1] and frame["filename"] == "<string>"


def describe_wait(frames: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a rank is blocked: the torch.distributed call and the learner's frame.

    Returns a dict with ``call`` (name of the outermost torch.distributed function on the
    stack, or None) and ``user`` (the innermost frame outside torch and this package, or
    None). What the rank was doing overall (starting, idle, running) is on the board.
    """
    call = None
    user = None
    for frame in frames:  # innermost first
        filename = frame["filename"]
        if _is_distributed(filename):
            name = frame["name"]
            if not name.startswith("_") and name not in ("wrapper", "inner", "<lambda>"):
                call = name  # keep the outermost public torch.distributed function
        elif user is None and not _is_torch(filename) and not _is_ours(filename) and not _is_bootstrap(frame, frames):
            user = frame
            break
    return {"call": call, "user": user}


def frame_label(frame: dict[str, Any]) -> str:
    """``Cell In[3], line 4, in ring`` or ``file.py, line 4, in ring``."""
    return f"{cell_label(frame['filename'])}, line {frame['lineno']}, in {frame['name']}"


def source_line(frame: dict[str, Any]) -> str:
    return linecache.getline(frame["filename"], frame["lineno"]).strip()


def format_stack(frames: list[dict[str, Any]]) -> str:
    """A traceback-style rendering (outermost first) with source lines where known.

    The outer frames that belong to the launcher (the factory's start-up line and this
    package's rank loop) are left out: the stack starts at the learner's code.
    """
    lines = []
    outer = list(reversed(frames))
    while outer and (outer[0]["filename"] == "<string>" or _is_ours(outer[0]["filename"])):
        outer.pop(0)
    for frame in outer or list(reversed(frames)):
        lines.append(f"  {frame_label(frame)}")
        code = source_line(frame)
        if code:
            lines.append(f"    {code}")
    return "\n".join(lines)


def summarize(rank: int, frames: list[dict[str, Any]], phase: str | None = None) -> str:
    """One sentence: where this rank waits. ``phase`` is its board phase, when known."""
    if phase == "starting":
        return (f"rank {rank} was still starting: it had not finished joining the process group, "
                "so your function never ran there")
    if phase == "ready":
        return f"rank {rank} was idle, waiting for work"
    if not frames:
        return f"rank {rank}: no stack could be read (it may be stuck outside Python)"
    where = describe_wait(frames)
    at = _at(where["user"])
    if where["call"]:
        return f"rank {rank} waits in torch.distributed.{where['call']}(){at}"
    return f"rank {rank} is running{at}"


def _at(user: dict[str, Any] | None) -> str:
    """`` at Cell In[3], line 4, in ring: dist.recv(t, 1)`` for the learner's frame."""
    if user is None:
        return ""
    code = source_line(user)
    return f" at {frame_label(user)}" + (f": {code}" if code else "")


# --------------------------------------------------------------------------------------
# Who waits for whom: the wait-for graph of hung ranks, from the board.
# --------------------------------------------------------------------------------------

_PEER_WORD = {"recv": "src", "irecv": "src", "recv_object_list": "src", "broadcast": "src",
              "scatter": "src", "broadcast_object_list": "src", "scatter_object_list": "src"}
_RECEIVES = ("recv", "irecv", "recv_object_list")
#: The words a hang report uses for a cycle of ranks that all receive first.
RECEIVE_FIRST = "every rank is receiving before anyone sends"
_SENDS = ("send", "isend", "send_object_list")
#: The words a hang report uses for a cycle of ranks that all send first (gloo moves a
#: message only once its receive is posted, so this deadlocks whatever the size).
SEND_FIRST = "every rank is sending before anyone receives"
#: The words a hang report uses when a rank made a collective that another still waits in.
CALLS_DISAGREE = "the two calls did not agree"
# Calls every member of the group must make: DDP's constructor broadcasts from C++.
_GROUP_CALLS = COLLECTIVES + (DDP_CONSTRUCTOR,)


def call_text(record: BoardRecord) -> str:
    """``recv(src=1)``, ``wait() on irecv(src=1)``, ``all_reduce`` from a board record."""
    op = record.call
    if op is None:
        return "?"
    if record.peer is not None:
        text = f"{op}({_PEER_WORD.get(op, 'dst')}={record.peer})"
    else:
        text = f"{op}()" if op in _RECEIVES else op
    if record.phase == "wait":
        text = f"wait() on {text}" if op != "wait" else "wait()"
    return text


def _in_same_collective(a: BoardRecord, b: BoardRecord) -> bool:
    return b.in_call and b.call == a.call and b.seq == a.seq


def wait_for_graph(board: list[BoardRecord], busy: list[int], finished: list[int]) -> dict[int, list[int]]:
    """Edges rank -> ranks it waits for, from what each busy rank is blocked in."""
    edges: dict[int, list[int]] = {}
    n = len(board)
    for r in busy:
        rec = board[r] if r < n else None
        if rec is None or not rec.in_call:
            continue
        if rec.call in _GROUP_CALLS:
            members = rec.members or list(range(n))
            edges[r] = [m for m in members if m != r and not (m in busy and _in_same_collective(rec, board[m]))]
        elif rec.peer is not None:
            edges[r] = [rec.peer]
    return edges


def find_cycle(edges: dict[int, list[int]]) -> list[int] | None:
    """A cycle in the wait-for graph, as a list of ranks (first repeated at the end)."""
    color: dict[int, int] = {}
    stack: list[int] = []

    def visit(node: int) -> list[int] | None:
        color[node] = 1
        stack.append(node)
        for nxt in edges.get(node, []):
            if color.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in color:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        color[node] = 2
        return None

    for start in sorted(edges):
        if start not in color:
            found = visit(start)
            if found:
                return found
    return None


def explain_hang(
    board: list[BoardRecord],
    frames: dict[int, list[dict[str, Any]]],
    busy: list[int],
    finished: list[int],
) -> tuple[dict[int, str], list[str]]:
    """Per busy rank, where it waits; and the conclusions (cycle, missing collective)."""
    records = {r: board[r] for r in busy if r < len(board)}
    lines: dict[int, str] = {}
    for r in busy:
        rec, stack = records.get(r), frames.get(r, [])
        if rec is not None and rec.in_call:
            lines[r] = f"rank {r} waits in {call_text(rec)}{_at(describe_wait(stack)['user'] if stack else None)}"
        else:
            lines[r] = summarize(r, stack, rec.phase if rec is not None else None)
    edges = wait_for_graph(board, busy, finished) if board else {}
    notes = _missing_collective_notes(board, frames, busy, finished, edges)
    cycle = find_cycle(edges)
    if cycle:
        chain = ", ".join(f"rank {a} waits for rank {b}" for a, b in zip(cycle, cycle[1:]))
        calls = {board[r].call for r in cycle[:-1] if board[r].call}
        if calls and calls <= set(_RECEIVES):
            notes.append(f"Wait-for cycle: {chain}: {RECEIVE_FIRST}.")
        elif calls and calls <= set(_SENDS):
            notes.append(f"Wait-for cycle: {chain}: {SEND_FIRST}.")
        else:
            notes.append(f"Wait-for cycle: {chain}: none of them can go on.")
    for r in busy:
        for m in edges.get(r, []):
            if m in finished and board[r].call not in _GROUP_CALLS:
                notes.append(f"rank {r} waits for rank {m}, which already returned: rank {m} never made the matching call.")
    return lines, notes


def _missing_collective_notes(board: list[BoardRecord], frames: dict[int, list[dict[str, Any]]],
                              busy: list[int], finished: list[int], edges: dict[int, list[int]]) -> list[str]:
    """A collective some member never reached, or made without it matching: where that member is."""
    notes: list[str] = []
    different: set[tuple[int, int]] = set()  # pairs of ranks, each waiting in another collective
    for r in busy:
        rec = board[r] if r < len(board) else None
        if rec is None or not rec.in_call or rec.call not in _GROUP_CALLS:
            continue
        for m in edges.get(r, []):
            other = board[m] if m < len(board) else None
            m_user = describe_wait(frames[m])["user"] if frames.get(m) else None
            how = _counterpart(rec, other, m in finished) if other is not None else None
            if how is not None:
                if how == "returned":
                    did = f"made the call that pairs with rank {r}'s {rec.call} and returned"
                elif how == "left":
                    did = (f"made the call that pairs with rank {r}'s {rec.call} and went on to "
                           f"{call_text(other) if other.in_call else 'run your code'}{_at_frame(m_user)}")
                else:  # both wait, each in a different collective: one note for the pair
                    if (r, m) in different:
                        continue
                    different.add((m, r))
                    notes.append(f"rank {m} is in {call_text(other)}{_at_frame(m_user)} and rank {r} in "
                                 f"{rec.call}, the call that pairs with it (on both, collective number "
                                 f"{rec.world_seq} on the whole group): {CALLS_DISAGREE}, they are different "
                                 "collectives")
                    continue
                note = (f"rank {m} {did} (on both, collective number {rec.world_seq} on the whole group), "
                        f"but rank {r} still waits in it: {CALLS_DISAGREE}")
                if note not in notes:
                    notes.append(note)
                continue
            if m in finished:
                note = f"rank {m} never reached {rec.call}: it already returned"
            elif other is not None and other.in_call:
                note = f"rank {m} never reached {rec.call}; it is in {call_text(other)}"
            else:
                note = f"rank {m} never reached {rec.call}"
            if m not in finished:
                note += _at_frame(m_user)
            if note not in notes:
                notes.append(note)
    return notes


def _at_frame(frame: dict[str, Any] | None) -> str:
    return f" at {frame_label(frame)}" if frame is not None else ""


def _counterpart(rec: BoardRecord, other: BoardRecord, returned: bool) -> str | None:
    """What the other rank did with its counterpart of the collective ``rec`` waits in.

    Only the default group's collectives are counted alike on every rank (``world_seq``).
    ``"returned"``: the other rank made at least as many of them and finished; ``"left"``:
    it made the call and is now further on; ``"other"``: it waits in a different collective
    with the same count. In each case gloo paired the two calls, and that one rank still
    waits means they did not agree (sizes, dtypes, or two different collectives). ``None``:
    it never reached the call, or the counts cannot tell (a subgroup's collective).

    >>> waiting = BoardRecord(rank=1, phase="call", call="all_reduce", world_seq=1)
    >>> _counterpart(waiting, BoardRecord(rank=0, phase="ready", world_seq=1), returned=True)
    'returned'
    >>> print(_counterpart(waiting, BoardRecord(rank=0, phase="ready", world_seq=0), returned=True))
    None
    >>> _counterpart(waiting, BoardRecord(rank=0, phase="call", call="recv", peer=1, world_seq=1), returned=False)
    'left'
    >>> _counterpart(waiting, BoardRecord(rank=0, phase="call", call="broadcast", world_seq=1), returned=False)
    'other'
    >>> print(_counterpart(waiting, BoardRecord(rank=0, phase="call", call="recv", peer=1, world_seq=0), returned=False))
    None
    """
    if rec.members is not None or rec.world_seq == 0:
        return None  # a subgroup's collective: the counts do not line up across ranks
    if returned:
        return "returned" if other.world_seq >= rec.world_seq else None
    if other.phase in ("starting", "ready"):
        return None
    if other.world_seq > rec.world_seq:
        return "left"
    if other.world_seq == rec.world_seq:
        in_world_collective = other.in_call and other.call in _GROUP_CALLS and other.members is None
        if not in_world_collective:
            return "left"
        if other.call != rec.call:
            return "other"
    return None
