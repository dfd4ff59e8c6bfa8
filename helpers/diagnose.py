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

__all__ = [
    "parse_dump",
    "main_stack",
    "describe_wait",
    "format_stack",
    "summarize",
    "call_text",
    "wait_for_graph",
    "find_cycle",
    "explain_hang",
]

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


is_distributed = _is_distributed


# What a rank does in _rank.py before it calls the learner's function.
_SETUP_STEPS = ("setup_process", "init_process_group")


def _is_bootstrap(frame: dict[str, Any], frames: list[dict[str, Any]]) -> bool:
    # The factory runs as `python -c "...serve(fd)"`: every rank's outermost frame is that
    # "<string>" module, which is ours, not the learner's.
    return frame is frames[-1] and frame["filename"] == "<string>"


def describe_wait(frames: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a rank is blocked: the torch.distributed call and the learner's frame.

    Returns a dict with ``call`` (name of the outermost torch.distributed function on the
    stack, or None), ``user`` (the innermost frame outside torch and this package, or None),
    ``starting`` (True when the rank was still setting up, before calling any of the
    learner's code) and ``idle`` (True when the rank was waiting for the notebook, not
    running code).
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
    starting = user is None and any(_is_ours(f["filename"]) and f["name"] in _SETUP_STEPS for f in frames)
    idle = (
        not starting
        and user is None
        and bool(frames)
        and _is_ours(frames[0]["filename"])
        and frames[0]["name"] in ("_read_exact", "read_frame")
    )
    return {"call": call, "user": user, "starting": starting, "idle": idle}


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
    if where["starting"]:
        inside = f", in torch.distributed.{where['call']}()" if where["call"] else ""
        return (
            f"rank {rank} was still starting: it had not finished joining the process group{inside}, "
            "so your function never ran there"
        )
    if where["call"]:
        return f"rank {rank} waits in torch.distributed.{where['call']}(){at}"
    if where["idle"]:
        return f"rank {rank} was idle, waiting for work"
    return f"rank {rank} is running{at}"


# --------------------------------------------------------------------------------------
# Who waits for whom: the wait-for graph of hung ranks, from the board.
# --------------------------------------------------------------------------------------

_PEER_WORD = {"recv": "src", "irecv": "src", "recv_object_list": "src", "broadcast": "src",
              "scatter": "src", "broadcast_object_list": "src", "scatter_object_list": "src"}


def call_text(record: dict[str, Any]) -> str:
    """``recv(src=1)``, ``wait() on irecv(src=1)``, ``all_reduce`` from a board record."""
    op = record.get("op")
    if op is None:
        return "?"
    peer = record.get("peer")
    if peer is not None:
        word = _PEER_WORD.get(op, "dst")
        text = f"{op}({word}={peer})"
    else:
        text = f"{op}()" if op in ("recv", "irecv") else op
    if record.get("state") == "wait":
        text = f"wait() on {text}" if op != "wait" else "wait()"
    return text


def wait_for_graph(board: list[dict[str, Any]], busy: list[int], finished: list[int]) -> dict[int, list[int]]:
    """Edges rank -> ranks it waits for, from what each busy rank is blocked in."""
    edges: dict[int, list[int]] = {}
    n = len(board)
    for r in busy:
        rec = board[r] if r < n else None
        if rec is None or rec["state"] == "idle" or rec["op"] is None:
            continue
        op, peer = rec["op"], rec["peer"]
        from ._instrument import COLLECTIVE_OPS

        if op in COLLECTIVE_OPS:
            members = rec["members"] or list(range(n))
            edges[r] = [
                m for m in members
                if m != r and not (m in busy and board[m]["op"] == op and board[m]["seq"] == rec["seq"] and board[m]["state"] != "idle")
            ]
        elif peer is not None:
            edges[r] = [peer]
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
    board: list[dict[str, Any]],
    frames: dict[int, list[dict[str, Any]]],
    busy: list[int],
    finished: list[int],
) -> tuple[dict[int, str], list[str]]:
    """Per busy rank, where it waits; and the conclusions (cycle, missing collective)."""
    lines: dict[int, str] = {}
    for r in busy:
        rec = board[r] if r < len(board) else None
        stack = frames.get(r, [])
        where = describe_wait(stack) if stack else {"user": None, "call": None, "starting": False, "idle": False}
        user = where["user"]
        at = ""
        if user is not None:
            code = source_line(user)
            at = f" at {frame_label(user)}" + (f": {code}" if code else "")
        if rec is not None and rec["state"] != "idle" and rec["op"]:
            lines[r] = f"rank {r} waits in {call_text(rec)}{at}"
        else:
            lines[r] = summarize(r, stack)
    edges = wait_for_graph(board, busy, finished) if board else {}
    notes: list[str] = []
    from ._instrument import COLLECTIVE_OPS

    # A collective some member never reached.
    for r in busy:
        rec = board[r] if board else None
        if not rec or rec["op"] not in COLLECTIVE_OPS or rec["state"] == "idle":
            continue
        for m in edges.get(r, []):
            if m in finished:
                note = f"rank {m} never reached {rec['op']}: it already returned"
            elif m < len(board) and board[m]["op"] and board[m]["state"] != "idle":
                note = f"rank {m} never reached {rec['op']}; it is in {call_text(board[m])}"
            else:
                note = f"rank {m} never reached {rec['op']}"
            m_user = describe_wait(frames.get(m, []))["user"] if frames.get(m) else None
            if m_user is not None and m not in finished:
                note += f" at {frame_label(m_user)}"
            if note not in notes:
                notes.append(note)
    cycle = find_cycle(edges)
    if cycle:
        chain = ", ".join(f"rank {a} waits for rank {b}" for a, b in zip(cycle, cycle[1:]))
        ops = {board[r]["op"] for r in cycle[:-1] if board[r]["op"]}
        if ops and ops <= {"recv", "irecv", "recv_object_list"} and not any(board[r]["state"] == "wait" and board[r]["op"] in ("isend",) for r in cycle[:-1]):
            notes.append(f"Wait-for cycle: {chain}: every rank is receiving before anyone sends.")
        else:
            notes.append(f"Wait-for cycle: {chain}: none of them can go on.")
    for r in busy:
        for m in edges.get(r, []):
            rec = board[r]
            if m in finished and rec["op"] not in COLLECTIVE_OPS:
                notes.append(f"rank {r} waits for rank {m}, which already returned: rank {m} never made the matching call.")
    return lines, notes
