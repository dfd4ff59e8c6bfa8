"""Deadlocks found as they form (helpers._runtime.deadlock): the rules on hand-built boards, the
wrappers' message counts, and real gloo ranks through helpers.launch and helpers.Cluster.

A deadlock in point-to-point calls must end the launch about a second after it forms with
a DeadlockError (a LaunchTimeoutError) carrying the usual hang report; a program that is
only slow must never get one; what the board cannot see stays with the timeout.
"""

from __future__ import annotations

import pickle
import threading
import time

import pytest
import torch
import torch.distributed as dist

import helpers
from conftest import rank_children
from helpers import Cluster, DeadlockError, LaunchTimeoutError
from helpers._runtime.deadlock import STABLE, DeadlockWatch, stuck_ranks
from helpers._runtime.instrument import Instrument
from helpers._runtime.wrapper import wrap
from helpers._runtime.board import (
    FLAG_TIMED,
    FLAG_UNSURE,
    RECVS_DONE,
    RECVS_POSTED,
    SENDS_DONE,
    SENDS_POSTED,
    Board,
    BoardRecord,
    P2PCounts,
)

def launch(fn, world_size, *args, **kwargs):
    """``helpers.launch`` on gloo (backend="auto" would pick nccl on a machine with GPUs)."""
    kwargs.setdefault("backend", "gloo")
    return helpers.launch(fn, world_size, *args, **kwargs)


#: A deadlock must be found within this many seconds of the moment every rank started its request
#: (the error's ``seconds``), whatever the timeout: the watch reads the board at least four times a
#: second and needs the same state twice STABLE (0.5 s) apart, so about a second after the ranks
#: reach their calls; the rest is room for a busy 2-core machine. Start-up (forking, joining the
#: group, importing this file to unpickle the function) is not counted: it took seconds on a loaded
#: machine, and a bound on the launch's wall time that included it failed now and then.
PROMPT = 6.0


# --------------------------------------------------------------------------- the rules, by hand


def R(rank, phase, call=None, peer=None, flags=0):  # noqa: N802 - reads like the record it builds
    return BoardRecord(rank, phase, call, peer=peer, flags=flags)


def counts(world, entries):
    """P2PCounts from {(rank, peer): (sends_posted, sends_done, recvs_posted, recvs_done)}."""
    values = [0] * (4 * world * world)
    for (rank, peer), four in entries.items():
        at = (rank * world + peer) * 4
        values[at:at + 4] = four
    return P2PCounts(world, tuple(values))


def ring_of_receives(world):
    return [R(r, "call", "recv", (r - 1) % world) for r in range(world)]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_rules_a_cycle_of_receives_is_stuck(world):
    """Is every rank of a ring that receives first, with no send posted anywhere, stuck?"""
    assert stuck_ranks(ring_of_receives(world), P2PCounts.zero(world), finished=()) == list(range(world))


def test_rules_a_send_posted_before_the_receives_frees_the_ring():
    """When rank 0 posted an isend to rank 1 before its recv, can rank 1 go on, and so every rank?"""
    board = ring_of_receives(3)
    assert stuck_ranks(board, counts(3, {(0, 1): (1, 0, 0, 0), (1, 0): (0, 0, 1, 0)}), finished=()) == []


def test_rules_a_send_already_received_does_not_count_twice():
    """Rank 1 already received the one message rank 0 posted: does a second recv from rank 0 still count as stuck?"""
    board = ring_of_receives(2)
    c = counts(2, {(0, 1): (1, 1, 1, 0), (1, 0): (0, 0, 2, 1)})
    assert stuck_ranks(board, c, finished=()) == [0, 1]


def test_rules_sends_nobody_receives_are_stuck_and_posted_receives_free_them():
    """Is a ring of blocking sends stuck, but not once a peer has a receive posted from the sender?"""
    board = [R(r, "call", "send", (r + 1) % 3) for r in range(3)]
    assert stuck_ranks(board, P2PCounts.zero(3), finished=()) == [0, 1, 2]
    # rank 1 posted an irecv from rank 0 earlier: rank 0's send will be taken, and the ring moves
    assert stuck_ranks(board, counts(3, {(1, 0): (0, 0, 1, 0), (0, 1): (1, 0, 0, 0)}), finished=()) == []


def test_rules_a_send_already_taken_is_about_to_return():
    """Rank 1 received rank 0's message and returned before rank 0's send saw it complete: is rank 0 live?"""
    board = [R(0, "call", "send", 1), R(1, "ready")]
    assert stuck_ranks(board, counts(2, {(0, 1): (1, 0, 0, 0), (1, 0): (0, 0, 1, 1)}), finished={1}) == []
    # rank 1 returned without receiving anything: rank 0's send can never go
    assert stuck_ranks(board, counts(2, {(0, 1): (1, 0, 0, 0)}), finished={1}) == [0]
    # rank 1 received one message, which rank 0's earlier send saw complete: this one is stuck
    assert stuck_ranks(board, counts(2, {(0, 1): (2, 1, 0, 0), (1, 0): (0, 0, 1, 1)}), finished={1}) == [0]


def test_rules_waits_on_requests_are_judged_like_blocking_calls():
    """Are wait() on irecv and wait() on isend judged as receive and send, and a wait on a batch (call 'wait') left live?"""
    board = [R(0, "wait", "irecv", 1), R(1, "wait", "isend", 0)]
    c = counts(2, {(0, 1): (0, 0, 1, 0), (1, 0): (1, 0, 0, 0)})
    assert stuck_ranks(board, c, finished=()) == []  # rank 1's isend will fill rank 0's irecv
    board = [R(0, "wait", "irecv", 1), R(1, "wait", "irecv", 0)]
    c = counts(2, {(0, 1): (0, 0, 1, 0), (1, 0): (0, 0, 1, 0)})
    assert stuck_ranks(board, c, finished=()) == [0, 1]
    assert stuck_ranks([R(0, "wait", "wait", None), R(1, "wait", "irecv", 0)], c, finished=()) == []


def test_rules_a_receive_from_a_finished_rank():
    """Is a recv from a rank that returned stuck when it sent nothing, and live when it left a send behind?"""
    board = [R(0, "ready"), R(1, "call", "recv", 0)]
    assert stuck_ranks(board, P2PCounts.zero(2), finished={0}) == [1]
    assert stuck_ranks(board, counts(2, {(0, 1): (1, 0, 0, 0)}), finished={0}) == []


def test_rules_a_peer_that_runs_or_waits_in_a_collective_is_live():
    """Is a rank waiting on a peer that runs Python, starts, or waits in a collective (directly or down a chain) live?"""
    for phase, call in (("running", None), ("starting", None), ("ready", None), ("call", "all_reduce")):
        board = [R(0, phase, call), R(1, "call", "recv", 0), R(2, "call", "recv", 1)]
        assert stuck_ranks(board, P2PCounts.zero(3), finished=()) == [], phase


def test_rules_a_closed_cycle_is_stuck_whatever_other_ranks_do():
    """Ranks 0 and 1 receive from each other while 2 and 3 wait in all_reduce for them: are 0 and 1 stuck?"""
    board = [R(0, "call", "recv", 1), R(1, "call", "recv", 0), R(2, "call", "all_reduce"), R(3, "running")]
    assert stuck_ranks(board, P2PCounts.zero(4), finished=()) == [0, 1]


def test_rules_unsure_ranks_and_timed_waits_switch_detection_off():
    """Does any rank's unsure flag empty the answer, and is a wait with its own timeout live?"""
    board = ring_of_receives(3)
    board[2] = R(2, "running", flags=FLAG_UNSURE)
    board[1] = R(1, "call", "recv", 0)
    assert stuck_ranks(board, P2PCounts.zero(3), finished=()) == []
    board = [R(0, "wait", "irecv", 1, flags=FLAG_TIMED), R(1, "call", "recv", 0)]
    assert stuck_ranks(board, P2PCounts.zero(2), finished=()) == []


def test_docstring_examples_run():
    """Do the runnable examples in the docstrings of helpers._runtime's pure modules give what they show?"""
    import doctest
    import importlib

    for name in ("deadlock", "protocol", "board", "calls", "callargs", "spec", "cells", "report", "wrapper"):
        module = importlib.import_module(f"helpers._runtime.{name}")
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, (module.__name__, result)


# --------------------------------------------------------------------------- the watch, on a real board


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def two_ranks():
    """A board of two ranks, and a clock that moves only when the test moves it."""
    board, clock = Board.create(2), Clock()
    yield board, clock
    board.close()


def test_watch_reports_only_a_state_read_twice_half_a_second_apart(two_ranks):
    """Does the watch wait for two equal reads STABLE s apart, start over when a rank moves, and say when it found it?"""
    board, clock = two_ranks
    watch = DeadlockWatch(board, [0, 1], started=clock.now, clock=clock)
    board.post(0, "call", "recv", peer=1)
    board.post(1, "call", "recv", peer=0)
    assert watch.check({0, 1}, {}) is None  # first sight
    clock.now += STABLE / 2
    assert watch.check({0, 1}, {}) is None  # too soon
    board.post(1, "call", "recv", peer=0)  # rank 1 left its recv and entered another
    clock.now += STABLE
    assert watch.check({0, 1}, {}) is None  # a new state: seen once
    clock.now += STABLE
    found = watch.check({0, 1}, {})
    assert found is not None and found.ranks == [0, 1] and found.seconds == pytest.approx(2 * STABLE + STABLE / 2)


def test_watch_counts_a_message_posted_between_reads(two_ranks):
    """When a send is posted between two reads of a deadlock-looking state, is nothing reported?"""
    board, clock = two_ranks
    watch = DeadlockWatch(board, [0, 1], started=clock.now, clock=clock)
    board.post(0, "call", "recv", peer=1)
    board.post(1, "wait", "irecv", peer=0)
    assert watch.check({0, 1}, {}) is None
    board.counter(0)[1 * 4 + SENDS_POSTED] += 1  # rank 0's thread posted an isend to rank 1
    for _ in range(2):
        clock.now += STABLE
        assert watch.check({0, 1}, {}) is None  # rank 1 can go on, so the cycle is broken


def test_watch_treats_idle_ranks_outside_the_request_as_finished_and_dead_ones_as_live(two_ranks):
    """On persistent ranks, is a recv from an idle rank the request did not target a deadlock, and one from a dead rank not?"""
    board, clock = two_ranks
    board.post(0, "ready")
    board.post(1, "call", "recv", peer=0)
    watch = DeadlockWatch(board, [1], started=clock.now, clock=clock)
    assert watch.check({1}, {}) is None
    clock.now += STABLE
    assert watch.check({1}, {}).ranks == [1]
    watch = DeadlockWatch(board, [1], started=clock.now, clock=clock, exited=lambda r: r == 0)
    for _ in range(3):
        assert watch.check({1}, {}) is None
        clock.now += STABLE
    board.post(0, "running")  # not idle: it may send yet
    watch = DeadlockWatch(board, [1], started=clock.now, clock=clock)
    for _ in range(3):
        assert watch.check({1}, {}) is None
        clock.now += STABLE


# --------------------------------------------------------------------------- the wrappers' counts


class FakeWork:
    def __init__(self, log, board, rank):
        self.log, self.board, self.rank = log, board, rank

    def wait(self, timeout=None):
        self.log.append(("wait", self.board.read()[self.rank].phase, self.board.read_counts()))
        return True

    def is_completed(self):
        return True


@pytest.fixture
def wrapped():
    """A send, recv, isend and irecv that do nothing, wrapped by rank 0's Instrument on a board of 2."""
    board = Board.create(2)
    inst = Instrument(0, board, 2)
    log = []

    def fake(name):
        def send(tensor, dst=None, group=None, tag=0, group_dst=None):
            log.append((name, board.read()[0].phase, board.read_counts()))
            return FakeWork(log, board, 0) if name.startswith("i") else None

        def recv(tensor, src=None, group=None, tag=0, group_src=None):
            log.append((name, board.read()[0].phase, board.read_counts()))
            return FakeWork(log, board, 0) if name.startswith("i") else src

        return wrap(inst, name, send if "send" in name else recv)

    yield {name: fake(name) for name in ("send", "recv", "isend", "irecv")}, board, inst, log
    board.close()


def test_wrappers_count_posted_before_the_call_and_done_after(wrapped):
    """Is a send counted as posted while it is in torch, and as done only once it returned?"""
    calls, board, inst, log = wrapped
    t = torch.ones(2)
    calls["send"](t, 1)
    name, phase, during = log[-1]
    assert (name, phase) == ("send", "call")
    assert during.pair(0, 1) == (1, 0, 0, 0)
    assert board.read_counts().pair(0, 1) == (1, 1, 0, 0)
    calls["recv"](t, 1)
    assert log[-1][2].pair(0, 1) == (1, 1, 1, 0) and board.read_counts().pair(0, 1) == (1, 1, 1, 1)


def test_wrappers_count_a_request_done_once_at_its_first_wait(wrapped):
    """Is an irecv counted done at its wait(), after the board says 'running', and only once however often it is waited?"""
    calls, board, inst, log = wrapped
    req = calls["irecv"](torch.ones(2), 1)
    assert board.read_counts().pair(0, 1) == (0, 0, 1, 0)
    req.wait()
    assert log[-1][:2] == ("wait", "wait") and log[-1][2].pair(0, 1) == (0, 0, 1, 0)
    assert board.read_counts().pair(0, 1) == (0, 0, 1, 1) and board.read()[0].phase == "running"
    req.wait()
    assert board.read_counts().pair(0, 1) == (0, 0, 1, 1)
    assert not board.read()[0].unsure


def test_wrappers_mark_a_wait_with_a_timeout_and_what_they_cannot_count(wrapped):
    """Is wait(timeout) noted as timed, and do recv(src=None) and a call from another thread mark the rank unsure?"""
    calls, board, inst, log = wrapped
    req = calls["isend"](torch.ones(2), 1)
    seen = []
    inst._write = (lambda original: lambda *a: (original(*a), seen.append(board.read()[0].flags)))(inst._write)
    req.wait(5)
    assert seen[0] & FLAG_TIMED and not board.read()[0].unsure
    calls["recv"](torch.ones(2))  # from any source
    assert board.read()[0].unsure


def test_a_tensor_off_the_cpu_marks_the_rank_unsure_and_a_call_outside_the_group_is_not_counted(wrapped):
    """Does a send of a tensor off the CPU (nccl's sends need not wait for their receive) mark the rank unsure, and is
    a call on a group the rank is not in (torch does nothing) left uncounted?"""
    calls, board, inst, log = wrapped
    inst.non_member = -100  # torch's GroupMember.NON_GROUP_MEMBER
    calls["send"](torch.ones(2), 1, group=-100)
    assert board.read_counts().pair(0, 1) == (0, 0, 0, 0) and not board.read()[0].unsure
    calls["send"](torch.ones(2, device="meta"), 1)
    assert board.read()[0].unsure and board.read_counts().pair(0, 1) == (0, 0, 0, 0)


def test_a_call_from_another_thread_marks_the_rank_unsure(wrapped):
    """Does a send made from a second Python thread mark the rank unsure (the board shows one call per rank)?"""
    calls, board, inst, log = wrapped
    worker = threading.Thread(target=calls["send"], args=(torch.ones(2), 1))
    worker.start()
    worker.join()
    assert board.read()[0].unsure
    assert board.read_counts().pair(0, 1) == (0, 0, 0, 0)


# --------------------------------------------------------------------------- real ranks: found


def _receive_first(rank, world_size):
    t = torch.zeros(1)
    dist.recv(t, src=(rank - 1) % world_size)  # RECEIVE-FIRST
    dist.send(t, dst=(rank + 1) % world_size)


def _deadlock(fn, world_size, args=(), **kwargs):
    """Launch ``fn`` with a long timeout; return the DeadlockError, found within PROMPT seconds of the ranks' start."""
    with pytest.raises(DeadlockError) as info:
        launch(fn, world_size, args, timeout=60, output="quiet", **kwargs)
    assert 0 < info.value.seconds < PROMPT, f"found after {info.value.seconds:.1f} s"
    return info.value


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_a_receive_first_ring_is_found_within_seconds(world_size, no_leftover_ranks):
    """Does a ring where every rank receives first raise DeadlockError within seconds though the timeout is 60 s,
    with the hang report's receive-first cycle, every rank's line, and no rank left?"""
    err = _deadlock(_receive_first, world_size)
    assert isinstance(err, LaunchTimeoutError) and err.timeout == 60
    assert err.ranks == list(range(world_size))
    head = str(err).splitlines()[0]
    assert head.startswith(f"The ranks deadlocked: found after {err.seconds:.1f} s") and "did not finish" not in head, head
    assert "every rank is receiving before anyone sends" in str(err) and "Fix: let some ranks send first" in str(err)
    for rank in range(world_size):
        assert f"rank {rank} waits in recv(src={(rank - 1) % world_size})" in err.waiting[rank]
        assert "dist.recv(t, src=(rank - 1) % world_size)  # RECEIVE-FIRST" in err.stacks[rank]
    assert err.finished == []
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is DeadlockError and copy.ranks == err.ranks and str(copy) == str(err)
    assert rank_children() == []


def _send_first(rank, world_size, numel):
    t = torch.ones(numel)
    dist.send(t, dst=(rank + 1) % world_size)
    dist.recv(t, src=(rank - 1) % world_size)


def test_blocking_sends_nobody_receives_are_found(no_leftover_ranks):
    """Does a ring where every rank sends 16 MB first (more than any buffer) raise DeadlockError, naming the send cycle?"""
    err = _deadlock(_send_first, 3, (4 << 20,))
    assert err.ranks == [0, 1, 2]
    for rank in range(3):
        assert f"rank {rank} waits in send(dst={(rank + 1) % 3})" in err.waiting[rank]
    assert "every rank is sending before anyone receives" in str(err) and "Fix: let some ranks receive first" in str(err)


def _receive_from_a_rank_that_returns(rank, world_size):
    if rank == 1:
        dist.recv(torch.zeros(1), src=0)


def test_a_receive_from_a_rank_that_finished_is_found(no_leftover_ranks):
    """Rank 1 receives from rank 0, which returns without sending: is that a DeadlockError saying rank 0 already returned?"""
    err = _deadlock(_receive_from_a_rank_that_returns, 2)
    assert err.ranks == [1] and err.finished == [0]
    assert "rank 1 of 2 is blocked in a point-to-point call" in str(err).splitlines()[0]
    assert "rank 1 waits for rank 0, which already returned" in str(err)


def _irecv_then_wait_first(rank, world_size):
    t = torch.zeros(3)
    request = dist.irecv(t, src=(rank - 1) % world_size)
    request.wait()  # before anything was sent
    dist.isend(t, dst=(rank + 1) % world_size).wait()


@pytest.mark.parametrize("trace", [False, True])
def test_waiting_on_irecv_before_any_isend_is_found(trace, no_leftover_ranks):
    """With and without tracing, is every rank waiting on its irecv before its isend found, each 'wait() on irecv'?"""
    err = _deadlock(_irecv_then_wait_first, 3, trace=trace)
    assert err.ranks == [0, 1, 2]
    for rank in range(3):
        assert f"wait() on irecv(src={(rank - 1) % 3})" in err.waiting[rank]


def _pair_deadlocks_while_others_wait_in_all_reduce(rank, world_size):
    t = torch.ones(1)
    if rank < 2:
        dist.recv(t, src=1 - rank)
    dist.all_reduce(t)


def test_a_pair_deadlocked_while_the_others_wait_in_a_collective_is_found(no_leftover_ranks):
    """Ranks 0 and 1 receive from each other while 2 and 3 wait in all_reduce for them: is it found, naming both?"""
    err = _deadlock(_pair_deadlocks_while_others_wait_in_all_reduce, 4)
    assert err.ranks == [0, 1] and sorted(err.waiting) == [0, 1, 2, 3]
    assert "rank 2 waits in all_reduce" in err.waiting[2]
    assert "every rank is receiving before anyone sends" in str(err)


# --------------------------------------------------------------------------- real ranks: no false alarm


def _isend_ring(rank, world_size, rounds):
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    mine, theirs = torch.full((1000,), float(rank)), torch.zeros(1000)
    for _ in range(rounds):
        request = dist.isend(mine, dst=right)
        dist.recv(theirs, src=left)
        request.wait()
        mine = theirs.clone()
    return mine[0].item()


def test_a_correct_isend_recv_ring_runs(no_leftover_ranks):
    """Does a correct ring (isend, recv, wait) of 200 rounds on 4 ranks finish with the right values?"""
    assert launch(_isend_ring, 4, (200,), output="quiet", timeout=60) == [0.0, 1.0, 2.0, 3.0]


def _late_sender(rank, world_size, delay):
    t = torch.full((2,), 7.0)
    if rank == 0:
        time.sleep(delay)  # slow to reach its send: rank 1 waits in recv meanwhile
        dist.send(t, dst=1)
    else:
        dist.recv(t, src=0)
    return t[0].item()


def test_a_rank_slow_to_send_is_not_a_deadlock(no_leftover_ranks):
    """Rank 0 sleeps 2.5 s before sending while rank 1 waits in recv: does the launch succeed?"""
    assert launch(_late_sender, 2, (2.5,), output="quiet", timeout=60) == [7.0, 7.0]


def _tags_out_of_order(rank, world_size):
    n = 2 << 20  # 8 MB each: the transfers take a while, seen by the checks in flight
    a, b = torch.ones(n), torch.full((n,), 2.0)
    first, second = torch.zeros(n), torch.zeros(n)
    for _ in range(3):
        if rank == 0:
            requests = [dist.isend(a, dst=1, tag=1), dist.isend(b, dst=1, tag=2)]
            for request in requests:
                request.wait()  # the first one waits while rank 1 takes the second
            dist.recv(torch.zeros(1), src=1)  # rank 1 is ready for the next round
        else:
            dist.recv(second, src=0, tag=2)  # the later message first
            dist.recv(first, src=0, tag=1)
            dist.send(torch.ones(1), dst=0)
    return first[0].item() * 10 + second[0].item()


def test_messages_received_out_of_order_by_tag_are_not_a_deadlock(no_leftover_ranks):
    """Does a program that receives two tagged 8 MB messages in the other order than sent, three times, finish?"""
    assert launch(_tags_out_of_order, 2, output="quiet", timeout=60) == [0.0, 12.0]


def _slow_ring_step(rank, world_size):
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    t = torch.full((4,), float(rank))
    for step in range(3):
        if rank == 2:
            time.sleep(0.8)  # slow Python between calls, longer than the deadlock check's half second
        if rank % 2 == 0:
            dist.send(t, dst=right)
            dist.recv(t, src=left)
        else:
            incoming = torch.zeros(4)
            dist.recv(incoming, src=left)
            dist.send(t, dst=right)
            t = incoming
    return t[0].item()


def test_a_ring_with_one_slow_rank_is_not_a_deadlock(no_leftover_ranks):
    """Does a send/recv ring where rank 2 spends 0.8 s in Python before each step finish?"""
    assert len(launch(_slow_ring_step, 4, output="quiet", timeout=60)) == 4


def _pipelined_ring(rank, world_size):
    from helpers.ring import pipelined_ring_allreduce

    t = torch.empty(1 << 16)
    for _ in range(5):
        t.fill_(rank + 1.0)
        pipelined_ring_allreduce(t, piece_bytes=1 << 14)
    return t[0].item()


def test_the_course_ring_with_receives_posted_ahead_is_not_a_deadlock(no_leftover_ranks):
    """Does lesson 8's ring (receives posted steps ahead, many tags, waits out of order) run on 3 ranks?"""
    assert launch(_pipelined_ring, 3, output="quiet", timeout=60) == [6.0, 6.0, 6.0]


# --------------------------------------------------------------------------- real ranks: left to the timeout


def _loops_while_its_peer_receives(rank, world_size):
    if rank == 0:
        while True:
            pass
    dist.recv(torch.zeros(1), src=0)


def test_an_endless_loop_is_still_the_timeout(no_leftover_ranks):
    """Rank 0 loops forever while rank 1 waits in recv from it: is it a plain LaunchTimeoutError at the timeout?"""
    started = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as info:
        launch(_loops_while_its_peer_receives, 2, timeout=3, output="quiet")
    assert not isinstance(info.value, DeadlockError)
    assert time.monotonic() - started >= 3.0  # the timeout counts from the ranks' start, so never less
    assert str(info.value).startswith("The ranks did not finish within 3 s")
    assert "rank 0 is running" in info.value.waiting[0] and "_loops_while_its_peer_receives" in info.value.waiting[0]


def _any_source(rank, world_size):
    t = torch.zeros(1)
    if rank == 0:
        dist.recv(t)  # from any source: the counts cannot say who would match it
    else:
        dist.recv(t, src=0)


def test_a_receive_from_any_source_leaves_it_to_the_timeout(no_leftover_ranks):
    """Does a deadlock involving recv(src=None) stay with the timeout (LaunchTimeoutError, not DeadlockError)?"""
    with pytest.raises(LaunchTimeoutError) as info:
        launch(_any_source, 2, timeout=3, output="quiet")
    assert not isinstance(info.value, DeadlockError)
    assert "did not finish within 3 s" in str(info.value)


# --------------------------------------------------------------------------- persistent ranks


def test_persistent_ranks_deadlock_is_found_and_restart_gives_a_working_group(no_leftover_ranks):
    """Does Cluster.run of a receive-first ring raise DeadlockError within seconds (timeout 60), leave the ranks busy
    and say to restart, and does restart() give a working group?"""
    cluster = Cluster(3, backend="gloo", timeout=60.0, output="quiet", view="text")
    try:
        with pytest.raises(DeadlockError) as info:
            cluster.run(_receive_first)
        err = info.value
        assert err.seconds < PROMPT, f"found after {err.seconds:.1f} s"
        head = str(err).splitlines()[0]
        assert head.startswith("The call deadlocked") and "restart" in head, head
        assert "every rank is receiving before anyone sends" in str(err)
        assert [s["state"] for s in cluster.status()] == ["busy"] * 3
        cluster.restart()
        assert cluster.exec("t = torch.ones(1)\ndist.all_reduce(t)\nt.item()") == [3.0, 3.0, 3.0]
    finally:
        cluster.shutdown()


def test_persistent_ranks_across_cells():
    """Rank 0 isends in one cell and rank 1 receives in the next: no alarm; and a later recv from idle rank 0 is found."""
    with Cluster(2, backend="gloo", timeout=60.0, output="quiet", view="text") as cluster:
        cluster.exec("request = dist.isend(torch.full((2,), 5.0), dst=1)", ranks=[0])
        assert cluster.exec("t = torch.zeros(2)\ndist.recv(t, src=0)\nt[0].item()", ranks=[1]) == [5.0]
        cluster.exec("request.wait()", ranks=[0])
        with pytest.raises(DeadlockError) as info:
            cluster.exec("dist.recv(t, src=0)", ranks=[1])  # rank 0 is idle: nothing can come
        assert info.value.seconds < PROMPT
        assert info.value.ranks == [1] and info.value.waiting[1].startswith("rank 1 waits in recv(src=0)")


# --------------------------------------------------------------------------- grading


def test_grading_feedback_says_the_ranks_deadlocked():
    """Does the grading harness turn a deadlock into feedback saying the ranks deadlocked (found before the 10 s
    timeout: the timeout's feedback says "did not finish"), where each waited, and the cycle?"""
    from autograder.kit.harness import GradingFailure, run_ranks

    with pytest.raises(GradingFailure) as info:
        run_ranks("no_hang", _receive_first, 3, exercise="Exercise 4.4", function="ring_allreduce", timeout=10)
    text = str(info.value)
    assert text.startswith("no_hang: your code deadlocked on 3 ranks: ranks 0, 1, 2 waited in point-to-point calls")
    assert "did not finish" not in text
    assert "rank 1 waits in recv(src=0)" in text and "every rank is receiving before anyone sends" in text
