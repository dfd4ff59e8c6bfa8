"""Reading the stacks of hung ranks: where is each rank blocked, and in which line of yours?

When ranks run past their timeout, each live rank is asked for a dump of its Python
stacks (Python's ``faulthandler``, which works even while a rank is blocked inside a C++
call such as gloo's ``recv``). This module turns those dumps into frames
(:func:`parse_dump` and :func:`dump_complete`, the one place that reads faulthandler's text) and into one sentence per
rank, naming the ``torch.distributed`` call it waits in and the learner's line that made
it. Which call a rank is in comes from the board (:mod:`helpers._runtime.board`: the call,
its peer) when the rank's wrappers noted one; otherwise from the stack, as the outermost
frame in torch.distributed's files whose function is one torch.distributed offers
(:data:`~helpers._runtime.calls.PUBLIC_FUNCTIONS`). Frames are told apart by their file:
torch's, this package's, the factory's start-up line, or the learner's. The conclusions
(:func:`explain_hang`) are typed :class:`Finding` records: code asks their ``kind``, the
learner reads their ``text``.

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
from dataclasses import dataclass
from typing import Any

from .board import BoardRecord
from .calls import COLLECTIVES, DDP_CONSTRUCTOR, PUBLIC_FUNCTIONS
from .cells import cell_label

__all__ = ["parse_dump", "dump_complete", "main_stack", "describe_wait", "format_stack", "summarize", "call_text",
           "Finding", "RECEIVE_FIRST", "SEND_FIRST", "CYCLE", "PEER_RETURNED", "NEVER_REACHED", "CALLS_DISAGREE",
           "wait_for_graph", "find_cycle", "explain_hang"]

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.I)
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+)$')
#: A rank's main thread runs in the factory's loop (factory_process's ``serve``); the frames outside
#: it are how the factory started (``python -c``, or the process that forked it: factory.fork_factory).
_FACTORY_LOOP = re.compile(r'factory_process\.py", line \d+ in serve$', re.M)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # helpers/, not helpers/_runtime/


def parse_dump(text: str) -> list[dict[str, Any]]:
    """Split a faulthandler dump into threads, each with frames innermost first, up to the rank
    factory's loop (the frames outside it are how the factory started, not the rank's)."""
    threads: list[dict[str, Any]] = []
    inside = False
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            threads.append({"ident": int(m.group(2), 16), "current": m.group(1).startswith("Current"), "frames": []})
            inside = True
            continue
        if _FACTORY_LOOP.search(line):
            inside = False
        m = _FRAME.match(line)
        if m and threads and inside:
            threads[-1]["frames"].append(
                {"filename": m.group(1), "lineno": int(m.group(2)), "name": m.group(3).strip()}
            )
    return threads


def dump_complete(data: bytes) -> bool:
    """Whether faulthandler's output ``data`` holds a rank's whole main-thread stack: the line of the
    factory's loop has arrived whole (a dump comes line by line, innermost first).

    >>> dump_complete(b'  File "x.py", line 3 in f\\n')
    False
    >>> dump_complete(b'  File "/h/helpers/_runtime/factory_process.py", line 103 in serve\\n')
    True
    """
    return any(_FACTORY_LOOP.search(line) for line in data.decode("utf-8", "replace").split("\n")[:-1])


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
    # A dump cut short of the factory's loop may end in its `python -c "...serve(fd)"` module,
    # "<string>", which is ours, not the learner's.
    return frame is frames[-1] and frame["filename"] == "<string>"


def describe_wait(frames: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a rank is blocked: the torch.distributed call and the learner's frame.

    Returns a dict with ``call`` (the outermost frame in torch.distributed's files whose
    function is one of torch.distributed's own, :data:`~helpers._runtime.calls.PUBLIC_FUNCTIONS`:
    not a decorator's wrapper, a private helper or a lambda; or None) and ``user`` (the
    innermost frame outside torch and this package, or None). What the rank was doing
    overall (starting, idle, running, the call it noted) is on the board: prefer that.
    """
    call = None
    user = None
    for frame in frames:  # innermost first
        filename = frame["filename"]
        if _is_distributed(filename):
            if frame["name"] in PUBLIC_FUNCTIONS:
                call = frame["name"]  # keep the outermost one
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


def summarize(rank: int, frames: list[dict[str, Any]], record: BoardRecord | None = None) -> str:
    """One sentence: where this rank waits. ``record`` is its slot on the board, when known:
    its phase, and the call it noted (with its peer), which the stack is not asked for."""
    phase = record.phase if record is not None else None
    if phase == "starting":
        return (f"rank {rank} was still starting: it had not finished joining the process group, "
                "so your function never ran there")
    if phase == "ready":
        return f"rank {rank} was idle, waiting for work"
    where = describe_wait(frames) if frames else {"call": None, "user": None}
    at = _at(where["user"])
    if record is not None and record.in_call:
        return f"rank {rank} waits in {call_text(record)}{at}"
    if not frames:
        return f"rank {rank}: no stack could be read (it may be stuck outside Python)"
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
_SENDS = ("send", "isend", "send_object_list")

#: What a hang report can conclude: the ``kind`` of a :class:`Finding`. A wait-for cycle of
#: ranks that all receive first, that all send first (gloo moves a message only once its
#: receive is posted, so this deadlocks whatever the size), or that mix calls; a rank
#: waiting for one that already returned; a collective some member never reached; a
#: collective another rank made and left while this one still waits in it.
RECEIVE_FIRST, SEND_FIRST, CYCLE = "receive_first", "send_first", "cycle"
PEER_RETURNED, NEVER_REACHED, CALLS_DISAGREE = "peer_returned", "never_reached", "calls_disagree"
_DISAGREE_WORDS = "the two calls did not agree"


@dataclass(frozen=True)
class Finding:
    """One conclusion of a hang report: its ``kind`` (:data:`RECEIVE_FIRST`, ...) and the sentence a learner reads."""

    kind: str
    text: str

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
) -> tuple[dict[int, str], list[Finding]]:
    """Per busy rank, where it waits (:func:`summarize`); and what the report concludes
    (cycles, missing or mismatched collectives), as :class:`Finding` records.

    >>> ring = [BoardRecord(0, "call", "recv", peer=1), BoardRecord(1, "call", "recv", peer=0)]
    >>> waiting, findings = explain_hang(ring, {}, busy=[0, 1], finished=[])
    >>> waiting[0], [f.kind for f in findings]
    ('rank 0 waits in recv(src=1)', ['receive_first'])
    """
    waiting = {r: summarize(r, frames.get(r, []), board[r] if r < len(board) else None) for r in busy}
    edges = wait_for_graph(board, busy, finished) if board else {}
    findings = _collective_findings(board, frames, busy, finished, edges)
    cycle = find_cycle(edges)
    if cycle:
        chain = ", ".join(f"rank {a} waits for rank {b}" for a, b in zip(cycle, cycle[1:]))
        calls = {board[r].call for r in cycle[:-1] if board[r].call}
        if calls and calls <= set(_RECEIVES):
            findings.append(Finding(RECEIVE_FIRST, f"Wait-for cycle: {chain}: every rank is receiving before anyone sends."))
        elif calls and calls <= set(_SENDS):
            findings.append(Finding(SEND_FIRST, f"Wait-for cycle: {chain}: every rank is sending before anyone receives."))
        else:
            findings.append(Finding(CYCLE, f"Wait-for cycle: {chain}: none of them can go on."))
    for r in busy:
        for m in edges.get(r, []):
            if m in finished and board[r].call not in _GROUP_CALLS:
                findings.append(Finding(PEER_RETURNED, f"rank {r} waits for rank {m}, which already returned: "
                                                       f"rank {m} never made the matching call."))
    return waiting, findings


def _collective_findings(board: list[BoardRecord], frames: dict[int, list[dict[str, Any]]],
                         busy: list[int], finished: list[int], edges: dict[int, list[int]]) -> list[Finding]:
    """A collective some member never reached, or made without it matching: where that member is."""
    found: list[Finding] = []

    def add(kind: str, text: str) -> None:
        if all(f.text != text for f in found):
            found.append(Finding(kind, text))

    different: set[tuple[int, int]] = set()  # pairs of ranks, each waiting in another collective
    for r in busy:
        rec = board[r] if r < len(board) else None
        if rec is None or not rec.in_call or rec.call not in _GROUP_CALLS:
            continue
        for m in edges.get(r, []):
            other = board[m] if m < len(board) else None
            m_user = describe_wait(frames[m])["user"] if frames.get(m) else None
            how = _counterpart(rec, other, m in finished) if other is not None else None
            if how == "other":  # both wait, each in a different collective: one finding for the pair
                if (r, m) not in different:
                    different.add((m, r))
                    add(CALLS_DISAGREE, f"rank {m} is in {call_text(other)}{_at_frame(m_user)} and rank {r} in "
                                        f"{rec.call}, the call that pairs with it (on both, collective number "
                                        f"{rec.world_seq} on the whole group): {_DISAGREE_WORDS}, they are "
                                        "different collectives")
            elif how is not None:
                did = (f"made the call that pairs with rank {r}'s {rec.call} and returned" if how == "returned" else
                       f"made the call that pairs with rank {r}'s {rec.call} and went on to "
                       f"{call_text(other) if other.in_call else 'run your code'}{_at_frame(m_user)}")
                add(CALLS_DISAGREE, f"rank {m} {did} (on both, collective number {rec.world_seq} on the whole "
                                    f"group), but rank {r} still waits in it: {_DISAGREE_WORDS}")
            elif m in finished:
                add(NEVER_REACHED, f"rank {m} never reached {rec.call}: it already returned")
            else:
                where = f"; it is in {call_text(other)}" if other is not None and other.in_call else ""
                add(NEVER_REACHED, f"rank {m} never reached {rec.call}{where}{_at_frame(m_user)}")
    return found


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
