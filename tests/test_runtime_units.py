"""The rank machinery's pure logic, without ranks: the board's records and message counts
(helpers._runtime.board), the reading of hung ranks' stacks and the wait-for analysis
(helpers._runtime.diagnose), the deadlock watch (helpers._runtime.deadlock) and the hang
reports and errors built from them (helpers._runtime.report).

Boards are made in this process; stacks are faulthandler dumps written by hand, pointing at
a small learner's file so that reports can quote its lines. No rank is started: the whole
file runs in about a second (tests/test_deadlock.py and tests/test_launch.py check the same
reports on real gloo ranks).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

import helpers
from helpers import DeadlockError, LaunchTimeoutError
from helpers._runtime import diagnose
from helpers._runtime.board import (
    FLAG_TIMED,
    FLAG_UNSURE,
    RECVS_DONE,
    SENDS_POSTED,
    Board,
    BoardRecord,
    P2PCounts,
)
from helpers._runtime.deadlock import STABLE, Deadlock, DeadlockWatch
from helpers._runtime.report import (
    Outcome,
    hang_report,
    interrupted_cell,
    kept_ranks_error,
    outcome_error,
    unusable_rank_error,
)

HELPERS = os.path.dirname(os.path.abspath(helpers.__file__))
TORCH = os.path.join(os.sep, "venv", "lib", "site-packages", "torch", "distributed")
LEARNER = '''import torch.distributed as dist
def ring(rank, t):
    dist.recv(t, (rank - 1) % 3)
def setup():
    dist.init_process_group("gloo")
def late(t):
    dist.all_reduce(t)
'''


@pytest.fixture
def learner(tmp_path: Path) -> str:
    """A learner's file whose lines the reports quote."""
    path = tmp_path / "learner.py"
    path.write_text(LEARNER)
    return str(path)


#: The outer frames of a rank's main thread: the factory's loop, then how the factory started, a `python -c`
#: module or (forked from the grader's clean re-grade: helpers._runtime.factory.fork_factory) that process's frames.
FACTORY_LOOP = (f"{HELPERS}/_runtime/factory_process.py", 103, "serve"), (f"{HELPERS}/_runtime/factory_process.py", 357, "serve")
STARTED_FRESH = (("<string>", 1, "<module>"),)
STARTED_FORKED = ((f"{HELPERS}/_runtime/factory.py", 268, "__init__"), (f"{HELPERS}/_runtime/factory.py", 341, "fork_factory"),
                  ("/course/autograder/grading/clean.py", 330, "main"), ("<frozen runpy>", 88, "_run_code"))


def dump(*frames: tuple[str, int, str], ident: str = "0x00007f0000000001", started=STARTED_FRESH) -> str:
    """A faulthandler dump of one thread, innermost frame first, ending in the factory's loop and start."""
    lines = [f"Current thread {ident} (most recent call first):"]
    lines += [f'  File "{filename}", line {line} in {name}' for filename, line, name in (*frames, *FACTORY_LOOP, *started)]
    return "\n".join(lines) + "\n"


def in_recv(learner: str) -> str:
    """A rank blocked in dist.recv called from the learner's ring(), through torch's logger and our wrapper."""
    return dump((f"{TORCH}/distributed_c10d.py", 2501, "recv"), (f"{TORCH}/c10d_logger.py", 81, "wrapper"),
                (f"{HELPERS}/_runtime/instrument.py", 260, "wrapper"), (learner, 3, "ring"),
                (f"{HELPERS}/_runtime/rank.py", 200, "_run"))


def frames_of(text: str) -> list[dict]:
    return diagnose.main_stack(text, None)


# --------------------------------------------------------------------------- the board


@pytest.fixture
def board():
    made = Board.create(3)
    yield made
    made.close()


def test_a_new_board_says_every_rank_is_starting_with_no_messages(board):
    """Does a fresh board read 'starting' in every slot, no call, and zero message counts?"""
    records = board.read()
    assert [(r.rank, r.phase, r.call, r.peer, r.in_call) for r in records] == [
        (0, "starting", None, None, False), (1, "starting", None, None, False), (2, "starting", None, None, False)]
    assert board.read_counts() == P2PCounts.zero(3)


def test_a_slot_holds_the_call_its_peer_size_group_counts_and_flags(board):
    """Does a posted slot read back as written (members as ranks, flags as properties), and does a rank that left
    its call read 'running' with no call and a later time stamp?"""
    board.post(1, "call", "all_reduce", seq=4, nbytes=64, members=0b101, world_seq=2, flags=FLAG_TIMED)
    rec = board.read()[1]
    assert (rec.phase, rec.call, rec.peer, rec.seq, rec.nbytes, rec.members, rec.world_seq) == (
        "call", "all_reduce", None, 4, 64, [0, 2], 2)
    assert rec.in_call and rec.timed and not rec.unsure
    board.post(2, "wait", "irecv", peer=0, flags=FLAG_UNSURE)
    assert (board.read()[2].call, board.read()[2].peer, board.read()[2].unsure) == ("irecv", 0, True)
    board.post(1, "running", "all_reduce")
    left = board.read()[1]
    assert (left.phase, left.call, left.in_call) == ("running", None, False) and left.start > rec.start
    assert diagnose.call_text(board.read()[2]) == "wait() on irecv(src=0)"


def test_the_running_writer_writes_what_posting_running_writes(board):
    """Does the short writer every wrapped call ends with leave the slot as writer(rank)("running", ...) would, with
    the sequence numbers and flags it is given?"""
    board.writer(0)("running", None, None, 7, None, None, 3, FLAG_UNSURE)
    board.running_writer(1)(7, 3, FLAG_UNSURE)
    first, second = board.read()[:2]
    fields = ("phase", "call", "peer", "seq", "nbytes", "members", "world_seq", "unsure", "timed")
    assert [getattr(second, f) for f in fields] == [getattr(first, f) for f in fields]
    assert (second.phase, second.seq, second.world_seq, second.unsure) == ("running", 7, 3, True)


def test_a_rank_attached_to_the_board_writes_what_the_notebook_reads(board):
    """Does a board attached by its file descriptor (as a rank does) know the world size, and are its slot and
    message counts what the creator reads, each rank's row apart?"""
    rank_side = Board.attach(board.fd)
    try:
        assert rank_side.world_size == 3
        row = rank_side.counter(2)
        row[0 * 4 + SENDS_POSTED] += 2
        row[0 * 4 + RECVS_DONE] += 1
        rank_side.writer(2)("call", "send", 0, 0, 8)
    finally:
        rank_side.close()
    counts = board.read_counts()
    assert counts.pair(2, 0) == (2, 0, 0, 1) and counts.get(2, 0, SENDS_POSTED) == 2
    assert counts.pair(0, 2) == (0, 0, 0, 0) and counts.pair(2, 1) == (0, 0, 0, 0)
    assert (board.read()[2].call, board.read()[2].peer, board.read()[2].nbytes) == ("send", 0, 8)


def test_a_board_of_a_size_no_world_fits_is_refused():
    """Does attaching to shared memory of the wrong size fail, saying so?"""
    fd = os.memfd_create("not-a-board")
    try:
        os.ftruncate(fd, 100)
        with pytest.raises(ValueError, match="fits no world size"):
            Board.attach(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- stacks


def test_a_dump_is_split_into_threads_and_the_main_thread_is_found(learner):
    """Are a dump's threads read with their frames innermost first, and is the main thread of the latest dump taken?"""
    later = dump((learner, 7, "late"))
    text = dump(("/x/worker.py", 9, "loop"), ident="0x00000000000000aa") + in_recv(learner) + later
    threads = diagnose.parse_dump(text)
    assert [(t["ident"], t["current"]) for t in threads] == [(0xAA, True), (0x7F0000000001, True), (0x7F0000000001, True)]
    assert threads[0]["frames"][0] == {"filename": "/x/worker.py", "lineno": 9, "name": "loop"}
    assert diagnose.main_stack(text, 0xAA)[0]["name"] == "loop"
    assert diagnose.main_stack(text, 0x7F0000000001)[0] == {"filename": learner, "lineno": 7, "name": "late"}
    assert diagnose.main_stack(text, None) == diagnose.main_stack(later, None)  # unknown main thread: the last one
    assert diagnose.main_stack("", None) == []
    whole = in_recv(learner).encode()
    assert diagnose.dump_complete(whole) and not diagnose.dump_complete(whole[: whole.index(b"factory_process.py")])
    # Complete with the factory's loop: what follows is how the factory started, whichever way it did.
    assert diagnose.dump_complete(whole[: whole.index(b"<string>")])


def test_a_rank_of_a_forked_factory_reads_as_one_of_a_fresh_one(learner):
    """A factory forked from the grader's clean re-grade leaves that process's frames under every rank's stack: are they
    left out, so that the stack, the learner's frame and the report are those of a factory started fresh?"""
    frames = (f"{TORCH}/distributed_c10d.py", 2501, "recv"), (learner, 3, "ring"), (f"{HELPERS}/_runtime/rank.py", 200, "_run")
    fresh, forked = dump(*frames), dump(*frames, started=STARTED_FORKED)
    assert diagnose.main_stack(forked, None) == diagnose.main_stack(fresh, None)
    assert diagnose.main_stack(forked, None)[-1]["name"] == "_run"
    assert diagnose.format_stack(diagnose.main_stack(forked, None)) == diagnose.format_stack(diagnose.main_stack(fresh, None))
    assert "clean.py" not in diagnose.format_stack(diagnose.main_stack(forked, None))
    assert diagnose.dump_complete(forked.encode()[: forked.encode().index(b"clean.py")])


def test_the_call_is_torch_distributeds_own_function_and_the_line_the_learners(learner):
    """Is the call the outermost torch.distributed function (not a decorator's wrapper, a private helper or a
    lambda), and the learner's frame the first outside torch and the helpers?"""
    where = diagnose.describe_wait(frames_of(in_recv(learner)))
    assert where["call"] == "recv" and (where["user"]["filename"], where["user"]["lineno"]) == (learner, 3)
    joining = frames_of(dump((f"{TORCH}/distributed_c10d.py", 900, "_store_based_barrier"),
                             (f"{TORCH}/distributed_c10d.py", 4000, "<lambda>"),
                             (f"{TORCH}/distributed_c10d.py", 1700, "init_process_group"),
                             (f"{TORCH}/c10d_logger.py", 95, "wrapper"), (learner, 5, "setup")))
    assert diagnose.describe_wait(joining)["call"] == "init_process_group"
    python_only = frames_of(dump((f"{TORCH}/../nn/modules/module.py", 1, "forward"), (learner, 7, "late")))
    assert diagnose.describe_wait(python_only) == {"call": None, "user": python_only[1]}


def test_one_sentence_per_rank_prefers_the_board(learner):
    """Does summarize word a rank from its board slot when it noted a call, from its stack otherwise, and its phase
    when starting or idle?"""
    stack = frames_of(in_recv(learner))
    in_call = BoardRecord(1, "call", "recv", peer=0)
    assert diagnose.summarize(1, stack, in_call) == (
        f"rank 1 waits in recv(src=0) at {learner}, line 3, in ring: dist.recv(t, (rank - 1) % 3)")
    assert diagnose.summarize(1, [], in_call) == "rank 1 waits in recv(src=0)"
    assert diagnose.summarize(1, stack, BoardRecord(1, "running")).startswith("rank 1 waits in torch.distributed.recv() at")
    assert "still starting" in diagnose.summarize(0, stack, BoardRecord(0, "starting"))
    assert diagnose.summarize(0, [], BoardRecord(0, "ready")) == "rank 0 was idle, waiting for work"
    assert diagnose.summarize(2, [], None) == "rank 2: no stack could be read (it may be stuck outside Python)"
    assert diagnose.format_stack(stack).splitlines()[0] == f"  {learner}, line 3, in ring"


# --------------------------------------------------------------------------- the wait-for analysis


def kinds(findings: list[diagnose.Finding]) -> list[str]:
    return [f.kind for f in findings]


def test_a_cycle_of_receives(learner):
    """Three ranks each receiving from the one before: is the cycle named rank by rank, as receive-first?"""
    board = [BoardRecord(r, "call", "recv", peer=(r - 1) % 3) for r in range(3)]
    frames = {r: frames_of(in_recv(learner)) for r in range(3)}
    waiting, findings = diagnose.explain_hang(board, frames, busy=[0, 1, 2], finished=[])
    assert waiting[0] == f"rank 0 waits in recv(src=2) at {learner}, line 3, in ring: dist.recv(t, (rank - 1) % 3)"
    assert findings == [diagnose.Finding(diagnose.RECEIVE_FIRST, "Wait-for cycle: rank 0 waits for rank 2, rank 2 "
                                         "waits for rank 1, rank 1 waits for rank 0: every rank is receiving before "
                                         "anyone sends.")]


def test_a_cycle_of_sends_and_a_receive_from_a_rank_that_returned():
    """Is a ring of sends named send-first, and a receive from a finished rank said to wait for it?"""
    sends = [BoardRecord(r, "call", "send", peer=(r + 1) % 2) for r in range(2)]
    assert kinds(diagnose.explain_hang(sends, {}, [0, 1], [])[1]) == [diagnose.SEND_FIRST]
    board = [BoardRecord(0, "call", "recv", peer=1), BoardRecord(1, "ready")]
    _, findings = diagnose.explain_hang(board, {}, busy=[0], finished=[1])
    assert findings == [diagnose.Finding(diagnose.PEER_RETURNED, "rank 0 waits for rank 1, which already returned: "
                                                                 "rank 1 never made the matching call.")]


def test_a_collective_some_rank_never_reached(learner):
    """Ranks 0 and 1 wait in all_reduce while rank 2 runs the learner's code: is rank 2 named once, with its line,
    and a rank that returned without it named as returned?"""
    board = [BoardRecord(0, "call", "all_reduce", world_seq=1), BoardRecord(1, "call", "all_reduce", world_seq=1),
             BoardRecord(2, "running")]
    frames = {2: frames_of(dump((f"{TORCH}/../nn/modules/module.py", 1, "forward"), (learner, 7, "late")))}
    waiting, findings = diagnose.explain_hang(board, frames, busy=[0, 1, 2], finished=[])
    assert findings == [diagnose.Finding(diagnose.NEVER_REACHED, f"rank 2 never reached all_reduce at {learner}, "
                                                                 "line 7, in late")]
    assert waiting[2] == f"rank 2 is running at {learner}, line 7, in late: dist.all_reduce(t)"
    board[2] = BoardRecord(2, "ready")
    _, findings = diagnose.explain_hang(board, {}, busy=[0, 1], finished=[2])
    assert [f.text for f in findings] == ["rank 2 never reached all_reduce: it already returned"]


def test_a_rank_that_made_the_collective_and_went_on(learner):
    """Rank 1 made collective number 1 and went on to a recv from rank 0, which still waits in it: is that the calls
    not agreeing (not 'never reached'), and the two ranks a cycle?"""
    board = [BoardRecord(0, "call", "all_reduce", world_seq=1), BoardRecord(1, "call", "recv", peer=0, world_seq=1)]
    frames = {1: frames_of(in_recv(learner))}
    _, findings = diagnose.explain_hang(board, frames, busy=[0, 1], finished=[])
    assert kinds(findings) == [diagnose.CALLS_DISAGREE, diagnose.CYCLE]
    assert findings[0].text == (f"rank 1 made the call that pairs with rank 0's all_reduce and went on to recv(src=0) "
                                f"at {learner}, line 3, in ring (on both, collective number 1 on the whole group), "
                                "but rank 0 still waits in it: the two calls did not agree")
    board[1] = BoardRecord(1, "call", "broadcast", world_seq=1)
    _, findings = diagnose.explain_hang(board, {}, busy=[0, 1], finished=[])
    assert kinds(findings) == [diagnose.CALLS_DISAGREE, diagnose.CYCLE]
    assert findings[0].text == ("rank 1 is in broadcast and rank 0 in all_reduce, the call that pairs with it (on both, "
                                "collective number 1 on the whole group): the two calls did not agree, they are "
                                "different collectives")


# --------------------------------------------------------------------------- reports


def hung_ring(learner: str) -> Outcome:
    """Two ranks receiving from each other, as the group hands it to the report at the timeout."""
    return Outcome(pending=[0, 1], board=[BoardRecord(r, "call", "recv", peer=1 - r) for r in range(2)],
                   stacks={r: in_recv(learner) for r in range(2)})


def test_the_hang_report_of_a_receive_first_ring(learner):
    """Does the report say how long, who waits where, the cycle, and the fix for receiving first, with the same
    evidence as typed fields (and survive pickling)?"""
    err = hang_report(hung_ring(learner), world_size=2, timeout=5.0)
    assert type(err) is LaunchTimeoutError
    lines = str(err).splitlines()
    assert lines[0] == "The ranks did not finish within 5 s: 2 of 2 ranks still running."
    assert lines[2] == f"rank 0 waits in recv(src=1) at {learner}, line 3, in ring: dist.recv(t, (rank - 1) % 3)"
    assert "Wait-for cycle: rank 0 waits for rank 1, rank 1 waits for rank 0: every rank is receiving" in str(err)
    assert "Fix: let some ranks send first" in str(err) and "Fix: every rank must make the same" not in str(err)
    assert kinds(err.findings) == [diagnose.RECEIVE_FIRST] and err.notes == [f.text for f in err.findings]
    assert err.finished == [] and err.stacks[1].splitlines()[0] == f"  {learner}, line 3, in ring"
    copy = pickle.loads(pickle.dumps(err))
    assert copy.findings == err.findings and str(copy) == str(err)


def test_a_deadlock_found_by_the_watch_becomes_a_deadlock_error(learner, board):
    """A receive cycle on a real board, read twice STABLE s apart: does the watch find ranks 0 and 1, and the report
    call it a deadlock found before the timeout, with a rank that finished named?"""
    now = [50.0]
    watch = DeadlockWatch(board, [0, 1, 2], started=now[0], clock=lambda: now[0])
    board.post(0, "call", "recv", peer=1)
    board.post(1, "call", "recv", peer=0)
    board.post(2, "ready")
    assert watch.check({0, 1}, {2: None}) is None
    now[0] += STABLE
    found = watch.check({0, 1}, {2: None})
    assert found == Deadlock(ranks=[0, 1], seconds=STABLE)
    outcome = hung_ring(learner)
    outcome.board, outcome.replies, outcome.deadlock = board.read(), {2: None}, found
    err = hang_report(outcome, world_size=3, timeout=60.0, recovery="All ranks were stopped.")
    assert isinstance(err, DeadlockError) and err.ranks == [0, 1] and err.seconds == STABLE
    assert str(err).startswith("The ranks deadlocked: found after 0.5 s, ranks 0, 1 of 3 are blocked in point-to-point "
                               "calls that no rank can ever match. All ranks were stopped.")
    assert "finished: rank 2" in str(err) and "larger timeout" not in str(err)


def test_ranks_that_had_not_started_get_a_start_up_report_not_a_hang_report(learner):
    """At the start-up limit, with rank 1 still joining the process group and rank 2 loading (its unpickling running a
    line of the learner's file) while rank 0 started, does the error say so, blame none of the learner's code, and
    carry the late ranks as ``unstarted``?"""
    loading = dump(("<frozen importlib._bootstrap>", 241, "_call_with_frames_removed"), (learner, 1, "<module>"),
                   ("<frozen importlib._bootstrap>", 1176, "_find_and_load"),
                   (f"{HELPERS}/_runtime/rank.py", 230, "_load"))
    board = [BoardRecord(0, "call", "recv", peer=1), BoardRecord(1, "starting"), BoardRecord(2, "running")]
    outcome = Outcome(pending=[0, 1, 2], unstarted=[1, 2], start_limit=60.0, stacks={0: in_recv(learner), 2: loading},
                      board=board)
    err = outcome_error(outcome, 3, 5.0, note="All ranks were stopped.")
    assert type(err) is LaunchTimeoutError and err.unstarted == [1, 2] and err.timeout == 60.0
    lines = str(err).splitlines()
    assert lines[0] == "The ranks did not start within 60 s: ranks 1, 2 of 3 had not started. All ranks were stopped."
    assert lines[2] == err.waiting[1] and err.waiting[1].startswith("rank 1 was still starting")
    assert err.waiting[2] == ("rank 2 was still loading what was sent to it (unpickling the function and its arguments "
                              f"imports the modules they use) at {learner}, line 1, in <module>: "
                              "import torch.distributed as dist")
    assert lines[4] == "started: rank 0 (running, maybe waiting for the others)"
    assert "timeout= counts only your code" in str(err) and "Wait-for" not in str(err) and err.findings == []
    assert hang_report(hung_ring(learner), 2, 5.0).unstarted == []


def test_persistent_ranks_are_told_what_state_they_are_left_in(learner):
    """After a hang on persistent ranks, does the error say which ranks need %dist_restart; and does a rank's state
    say why it cannot take the next request?"""
    err = kept_ranks_error(hung_ring(learner), 2, 5.0, deadlocked=[0, 1], stuck=[], what="The cell")
    assert str(err).startswith("The cell did not finish within 5 s: 2 of 2 ranks still running. Ranks 0, 1 are "
                               "blocked for good inside communication calls")
    assert "run %dist_restart" in str(err).splitlines()[0]
    assert "interrupted and keep their variables" in str(kept_ranks_error(hung_ring(learner), 2, 5.0, deadlocked=[],
                                                                           stuck=[]))
    assert str(unusable_rank_error(1, "exited", -9)).startswith("rank 1 was killed by SIGKILL earlier")
    assert str(unusable_rank_error(0, "exited", 3)).startswith("rank 0 exited with code 3 earlier")
    assert "still busy with an earlier request" in str(unusable_rank_error(0, "busy", None))
    assert unusable_rank_error(0, "idle", None) is None
    assert str(interrupted_cell([0, 1], [1])) == "the cell was interrupted on ranks 0, 1; still blocked: 1 (run %dist_restart)."


def test_the_rank_view_keeps_each_tab_one_stream_holding_every_line(capsys):
    """Does each tab of the widget view hold one stream output with all its lines in order (JupyterLab never merges
    outputs in it, which once lost a line under load), the "all ranks" tab labelling each line and stderr?"""
    from helpers.view import RankOutputView

    view = RankOutputView(world_size=2)
    view.write(1, "stdout", "hello from rank 1")
    view.write(0, "stdout", "hello from rank 0")
    view.write(0, "stderr", "a warning")
    capsys.readouterr()  # display() outside a kernel prints the widget's repr
    assert view.combined.outputs == ({"output_type": "stream", "name": "stdout",
                                      "text": "[rank 1] hello from rank 1\n[rank 0] hello from rank 0\n"
                                              "[rank 0:err] a warning\n"},)
    assert [o["text"] for o in view.per_rank[0].outputs] == ["hello from rank 0\na warning\n"]
    assert [o["text"] for o in view.per_rank[1].outputs] == ["hello from rank 1\n"]
    assert view.lines == 3
