"""helpers.ring: is the pipelined ring all-reduce lesson 8 shows a correct all-reduce, and not Exercise 4.1's answer?"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from autograder.answers.lesson04 import ring_chunks
from helpers import launch
from helpers.ring import pipelined_ring_allreduce, ring_schedule
from autograder.hidden import grade


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_the_schedule_is_a_ring_turned_one_chunk_from_lesson_4s(world_size):
    """Does every step receive what the left neighbour sends and send on what just arrived, adding in the
    reduce-scatter only, with rank r owning chunk r+1 in between: lesson 4's ring turned by one chunk?"""
    schedules = [ring_schedule(rank, world_size) for rank in range(world_size)]
    for rank, steps in enumerate(schedules):
        expected = [((chunk + 1) % world_size, (recv + 1) % world_size, phase == "reduce-scatter")
                    for phase in ("reduce-scatter", "all-gather") for s in range(world_size - 1)
                    for chunk, recv in [ring_chunks(phase, s, rank, world_size)]]
        assert steps == expected
        left = schedules[(rank - 1) % world_size]
        assert all(recv == left[s][0] for s, (_, recv, _) in enumerate(steps))
        assert all(steps[s + 1][0] == steps[s][1] for s in range(len(steps) - 1))


def test_the_shipped_schedule_does_not_answer_exercise_4_1():
    """helpers.ring ships to learners: is its schedule, copied into ring_chunks, a wrong answer to 4.1 (the chunk
    rank r owns is r+1, and the feedback says so) rather than the exercise's answer?"""
    from autograder import exercise
    from autograder.kit.exercise import GradingFailure

    table = {(phase, s, rank, p): ring_schedule(rank, p)[s if phase == "reduce-scatter" else p - 1 + s][:2]
             for p in range(2, 9) for rank in range(p) for s in range(p - 1) for phase in ("reduce-scatter", "all-gather")}
    copied = lambda phase, step, rank, world_size: table[phase, step, rank, world_size]  # noqa: E731 - no call to helpers.ring
    with pytest.raises(GradingFailure, match=r"rank 0's chunk 0 holds the sum of ranks \[0\] only.* Its chunk 1 is complete"):
        grade("4.1", copied, "reduce_scatter")


def _sums(rank, world_size, cases):
    out = []
    for numel, dtype_name, piece, ahead in cases:
        g = torch.Generator().manual_seed(rank)
        t = (torch.randn(numel, generator=g) * 100).to(getattr(torch, dtype_name))
        expected = t.clone()
        dist.all_reduce(expected)                     # gloo's own answer, for comparison
        same = pipelined_ring_allreduce(t, piece, ahead=ahead) is t
        out.append((same, bool(torch.allclose(t.double(), expected.double(), rtol=1e-5, atol=1e-3))))
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_pipelined_ring_sums_like_all_reduce(world_size):
    """Does it sum in place like dist.all_reduce for sizes below, at and above the world size, tiny, uneven and
    whole-chunk pieces, three dtypes, with receives posted 0, 1, 2, 3 and (more than p-1) 9 steps ahead?"""
    cases = [(1, "float32", 4, 2), (3, "float32", 4, 0), (10, "float64", 8, 2), (1001, "float32", 64, 2),
             (1001, "float32", 64, 0), (1001, "float32", 64, 1), (1001, "float32", 64, 9), (1001, "int64", None, 2),
             (1001, "int64", None, 0), (50_000, "float32", 1 << 12, 3), (50_001, "float32", 12_000, 2),
             (20_000, "float32", 1 << 30, 2)]
    for rank, results in enumerate(launch(_sums, world_size, (cases,), output="quiet", timeout=60)):
        for (numel, dtype_name, piece, ahead), (same, right) in zip(cases, results):
            assert same, f"rank {rank}: the result is not the tensor passed in ({numel} {dtype_name})"
            assert right, (f"rank {rank} of {world_size}: wrong sum for {numel} {dtype_name} in pieces of {piece} "
                           f"bytes, ahead={ahead}")


def _traffic(rank, world_size, numel, piece):
    from helpers._runtime.instrument import current

    inst = current()
    t = torch.ones(numel)
    inst.tracing = True
    pipelined_ring_allreduce(t, piece)
    inst.tracing = False
    events = inst.take_events()
    sent = [(e.peer, e.nbytes) for e in events if e.op == "isend"]
    received = [(e.peer, e.nbytes) for e in events if e.op == "irecv"]
    return sent, received, bool((t == world_size).all())


@pytest.mark.parametrize("world_size,numel,piece", [(3, 3000, 1000), (4, 10_000, None), (4, 10_001, 4096)])
def test_it_sends_what_the_plain_ring_sends_only_to_the_right(world_size, numel, piece):
    """Does every rank send exactly 2(p-1)/p of the tensor (as lesson 4's ring), all of it to the right neighbour,
    receive only from the left one, in pieces of at most piece_bytes?"""
    chunk = -(-numel // world_size)
    for rank, (sent, received, right) in enumerate(launch(_traffic, world_size, (numel, piece), output="quiet",
                                                          timeout=60)):
        assert right, f"rank {rank}: wrong sum"
        def length(c):
            return min(chunk, max(0, numel - (c % world_size) * chunk))
        # Rank r owns chunk r+1 between the phases. Reduce-scatter: every chunk but r+1 goes right, every chunk but r
        # comes in; all-gather: every chunk but r+2 goes right, every chunk but r+1 (its own, finished) comes in.
        assert sum(n for _, n in sent) == 4 * (2 * numel - length(rank + 1) - length(rank + 2)), (rank, sent)
        assert sum(n for _, n in received) == 4 * (2 * numel - length(rank) - length(rank + 1)), (rank, received)
        assert {peer for peer, _ in sent} == {(rank + 1) % world_size}, sent
        assert {peer for peer, _ in received} == {(rank - 1) % world_size}, received
        largest = piece if piece else 4 * chunk
        assert max(n for _, n in sent) <= largest, (rank, max(n for _, n in sent), largest)


def test_docstring_examples_run():
    """Do the examples in helpers.ring's docstrings give what they show?"""
    import doctest

    import helpers.ring

    result = doctest.testmod(helpers.ring)
    assert result.attempted >= 3 and result.failed == 0


def test_a_tensor_off_the_cpu_is_refused_with_the_reason():
    """Is a tensor that is not on the CPU (here a 'meta' one, which any machine has) refused before any message,
    with what to do instead? On nccl, tags are ignored and receives posted early could deadlock."""
    with pytest.raises(ValueError, match=r"on meta\. .*nccl ignores tags.*backend='gloo'"):
        pipelined_ring_allreduce(torch.ones(8, device="meta"))
