"""Turning what went wrong in the ranks into one clear exception for the notebook."""

from __future__ import annotations

from . import diagnose
from .errors import LaunchTimeoutError, RankFailedError, relabel_traceback, signal_name

__all__ = ["rank_failure", "hang_report", "earliest", "in_distributed_call"]


def earliest(failures: list[dict]) -> dict:
    """The root cause: a rank that died, else the first failure in time.

    Later failures are usually echoes of the first. A death is the exception: its peers'
    collectives fail at once ("Connection reset by peer") and their errors can reach us
    before the factory reports the death, so a rank that died without an error of its own
    comes first.
    """
    raised = {f["rank"] for f in failures if f["ev"] == "error"}
    deaths = [f for f in failures if f["ev"] == "exit" and f["rank"] not in raised]
    return min(deaths or failures, key=lambda f: (f.get("time", float("inf")), f["rank"]))


def in_distributed_call(failure: dict) -> bool:
    """Whether an error was raised inside torch.distributed (maybe because a peer died)."""
    frames = failure.get("error", {}).get("frames") or []
    return failure["ev"] == "error" and bool(frames) and diagnose.is_distributed(frames[-1]["filename"])


def _others(stopped: list[int]) -> str:
    if not stopped:
        return ""
    names = ", ".join(map(str, stopped))
    return f"\n\nThe other rank{'s' if len(stopped) > 1 else ''} ({names}) {'were' if len(stopped) > 1 else 'was'} stopped."


def rank_failure(failure: dict, world_size: int, stopped: list[int], diag: str = "") -> RankFailedError:
    """Build the error for a rank that raised (an ``error`` reply) or died (an ``exit``)."""
    rank = failure["rank"]
    if failure["ev"] == "error":
        err = failure["error"]
        original = None
        if err.get("pickled") is not None:
            try:
                import pickle

                original = pickle.loads(err["pickled"])
            except Exception:  # noqa: BLE001 - the class may not exist in the notebook
                original = None
        phase = " while setting up its process group" if err.get("phase") == "init" else ""
        if err["type"] == "SystemExit":
            head = f"rank {rank} of {world_size} called sys.exit({err['message']}){phase}"
        else:
            head = f"rank {rank} of {world_size} raised {err['type']}{phase}: {err['message']}"
        text = relabel_traceback(err["text"]).rstrip()
        message = f"{head}\n\nTraceback from rank {rank} (most recent call last):\n" + "\n".join(
            text.splitlines()[1:] if text.startswith("Traceback") else text.splitlines()
        )
        message += _others(stopped)
        return RankFailedError(
            message,
            rank=rank,
            world_size=world_size,
            exc_type=err["type"],
            exc_message=err["message"],
            rank_traceback=err["text"],
            exitcode=None,
            original=original,
            stopped=stopped,
        )
    code = failure["code"]
    if code < 0:
        how = f"was killed by {signal_name(code)} (exit code {code})"
        hint = (
            " A SIGKILL often means the machine ran out of memory; SIGSEGV or SIGABRT point at a "
            "crash inside C++ code."
        )
    else:
        how = f"exited with code {code} before returning"
        hint = " A call to os._exit, or a crash in C code, ends a rank without a Python exception."
    message = f"rank {rank} of {world_size} {how}.{hint}"
    if diag.strip():
        threads = diagnose.parse_dump(diag)
        if threads and threads[-1]["frames"]:
            message += "\n\nIts last Python stack:\n" + diagnose.format_stack(threads[-1]["frames"])
    message += _others(stopped)
    return RankFailedError(
        message,
        rank=rank,
        world_size=world_size,
        exc_type=None,
        exc_message=how,
        rank_traceback="",
        exitcode=code,
        original=None,
        stopped=stopped,
    )


def hang_report(
    dumps: dict[int, str],
    main_threads: dict[int, int | None],
    finished: list[int],
    world_size: int,
    timeout: float,
    what: str = "the ranks",
    recovery: str = "All ranks were stopped.",
    board: list[dict] | None = None,
) -> LaunchTimeoutError:
    """Build the error for ranks still running at the timeout, from their stacks and board."""
    busy = sorted(dumps)
    frames = {r: diagnose.main_stack(dumps[r], main_threads.get(r)) for r in busy}
    stacks = {r: diagnose.format_stack(frames[r]) for r in busy}
    waiting, notes = diagnose.explain_hang(board or [], frames, busy, finished)
    if not board:  # no board (should not happen): fall back on the stacks alone
        calls = {r: diagnose.describe_wait(frames[r])["call"] if frames[r] else None for r in busy}
        if len(busy) > 1 and all(calls.get(r) in ("recv", "irecv") for r in busy):
            notes.append("Every running rank is receiving, so nobody is sending.")
    lines = [
        f"{what} did not finish within {timeout:g} s: "
        f"{len(busy)} of {world_size} rank{'s' if world_size != 1 else ''} still running. {recovery}",
        "",
    ]
    lines += [waiting[r] for r in busy]
    if finished:
        lines.append(f"finished: rank{'s' if len(finished) > 1 else ''} {', '.join(map(str, finished))}")
    if notes:
        lines += ["", *notes]
    if any("receiving before anyone sends" in n or "Every running rank is receiving" in n for n in notes):
        lines += ["Fix: let some ranks send first (for example even ranks send while odd ranks "
                  "receive), or post the receives with irecv and wait after sending."]
    lines += ["", "Each rank's full stack is on the error's .stacks. If the work is just slow, pass "
              "a larger timeout=."]
    return LaunchTimeoutError(
        "\n".join(lines), timeout=timeout, stacks=stacks, waiting=waiting, finished=finished, notes=notes
    )
