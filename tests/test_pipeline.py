"""helpers.pipeline and helpers.schedule: does a stage record what it ran, and does the logical clock time it exactly?"""

from __future__ import annotations

import doctest
from fractions import Fraction

import pytest

from helpers.schedule import Schedule


def _gpipe_programs(p: int, m: int) -> list[dict]:
    """What GPipe's ranks record with blocking send/recv: receive, compute, send; forwards, then backwards."""
    records = []
    for s in range(p):
        program = []
        for i in range(m):
            if s > 0:
                program.append(("recv", s - 1, 0, 72))
            program.append(("forward", i))
            if s < p - 1:
                program.append(("send", s + 1, 0, 72))
        for i in range(m):
            if s < p - 1:
                program.append(("recv", s + 1, 0, 72))
            program.append(("backward", i))
            if s > 0:
                program.append(("send", s - 1, 0, 72))
        records.append({"rank": s, "num_stages": p, "program": program})
    return records


def test_docstring_examples_run():
    """Do helpers.schedule's examples give what they show?"""
    import helpers.schedule

    result = doctest.testmod(helpers.schedule)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("p, m", [(1, 1), (2, 1), (2, 4), (3, 5), (4, 8)])
def test_gpipe_takes_m_plus_p_minus_1_steps_and_has_the_formula_bubble(p, m):
    """Does GPipe's program take (m + p - 1) x 3 units on the clock, with a bubble of exactly (p - 1) / (m + p - 1)?"""
    run = Schedule(_gpipe_programs(p, m))
    assert run.makespan == 3 * (m + p - 1)
    assert run.bubble == Schedule.gpipe_bubble(p, m) == Fraction(p - 1, m + p - 1)
    assert [s.start for s in run.for_rank(p - 1) if s.kind == "forward"] == [p - 1 + i for i in range(m)]


def test_a_receive_moves_the_clock_up_to_its_message_and_never_down():
    """Does a receive take the later of the receiver's clock and the message's, and a send carry the sender's clock?"""
    records = [{"rank": 0, "program": [("forward", 0), ("forward", 1), ("send", 1, 0, 4)]},
               {"rank": 1, "program": [("forward", 0), ("forward", 1), ("forward", 2), ("recv", 0, 0, 4),
                                       ("backward", 0)]}]
    run = Schedule(records)
    assert run.for_rank(1)[-1].start == 3  # its own clock (3) was later than the message's (2)
    records[0]["program"] = [("forward", i) for i in range(5)] + [("send", 1, 0, 4)]
    assert Schedule(records).for_rank(1)[-1].start == 5


def test_messages_pair_in_order_per_sender_receiver_and_tag():
    """Is the k-th send from a to b with a tag matched with the k-th receive on b from a with that tag?"""
    records = [{"rank": 0, "program": [("send", 1, 1, 4), ("forward", 0), ("forward", 1), ("send", 1, 2, 4)]},
               {"rank": 1, "program": [("recv", 0, 2, 4), ("forward", 0), ("recv", 0, 1, 4), ("forward", 1)]}]
    run = Schedule(records)
    assert [s.start for s in run.for_rank(1)] == [2, 3]  # tag 2 left rank 0 at time 2, tag 1 at time 0


def test_a_receive_no_send_matches_is_set_aside_and_records_that_wait_in_a_cycle_raise():
    """Is a receive without a matching send noted (not waited for), and do two receives that wait for each other raise?"""
    run = Schedule([{"rank": 0, "program": [("recv", 1, 0, 4), ("forward", 0)]}, {"rank": 1, "program": [("forward", 0)]}])
    assert run.unmatched == [(0, ("recv", 1, 0, 4))] and run.for_rank(0)[0].start == 0
    cycle = [{"rank": 0, "program": [("recv", 1, 0, 4), ("send", 1, 0, 4)]},
             {"rank": 1, "program": [("recv", 0, 0, 4), ("send", 0, 0, 4)]}]
    with pytest.raises(ValueError, match="in a cycle"):
        Schedule(cycle)


def test_lanes_show_each_unit_and_the_idle_ones():
    """Does the text picture give one column per unit, with '.' where a stage is idle?"""
    lines = Schedule(_gpipe_programs(2, 1)).lanes().splitlines()
    assert lines == ["stage 0 | F0 .  .  .  B0 B0", "stage 1 | .  F0 B0 B0 .  ."]


# -- real runs ---------------------------------------------------------------------------------


def _pipeline_rank(rank, world_size, schedule_name, m):
    import torch

    from autograder.answers import lesson10 as reference
    from helpers.pipeline import Stage

    torch.manual_seed(0)
    layer = [torch.nn.Linear(4, 4) for _ in range(world_size)][rank]
    stage = Stage(layer, (2, 4), (2, 4))
    g = torch.Generator().manual_seed(1)
    microbatches = [(torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)) for _ in range(m)]
    getattr(reference, schedule_name)(stage, microbatches)
    return stage.record()


@pytest.mark.parametrize("schedule_name, held", [("gpipe_step", [6, 6, 6]), ("one_f_one_b_step", [3, 2, 1])])
def test_a_real_run_replays_to_the_formula_bubble_with_the_activations_each_stage_held(schedule_name, held):
    """Do the records of a real 3-stage run of 6 micro-batches replay to (p - 1) / (m + p - 1), GPipe holding all 6
    micro-batches on every stage and 1F1B at most p - s on stage s?"""
    from helpers import launch

    records = launch(_pipeline_rank, 3, args=(schedule_name, 6), trace=True, output="quiet", timeout=60)
    run = Schedule(list(records))
    assert run.bubble == Fraction(2, 8) and not run.unmatched
    assert [run.peak_held(s) for s in range(3)] == held
    assert [sum(e[0] == "send" for e in r["program"]) for r in records] == [6, 12, 6]


def _misuse(rank, world_size, what):
    import torch

    from helpers.pipeline import Stage, StageError

    stage = Stage(torch.nn.Linear(2, 2), (1, 2), (1, 2))
    try:
        if what == "backward first":
            stage.backward(0, torch.ones(1, 2))
        elif what == "wrong shape":
            stage.forward(0, torch.ones(3, 2))
        elif what == "no target":
            stage.forward(0, torch.ones(1, 2))
        else:
            stage.record()
    except StageError as err:
        return str(err)
    return "no error"


@pytest.mark.parametrize("what, says", [
    ("backward first", "micro-batch 0 has not gone forward yet"),
    ("wrong shape", "has shape (3, 2), but one micro-batch's is (1, 2)"),
    ("no target", "pass the micro-batch's target"),
    ("record without a trace", "run the launch with trace=True"),
])
def test_a_stage_used_wrongly_says_how(what, says):
    """Does a stage refuse a backward before its forward, a tensor of the wrong shape, a last stage without a target, and a record without a trace, saying what to do?"""
    from helpers import launch

    assert says in launch(_misuse, 1, args=(what,), output="quiet", timeout=60)[0]


def test_a_stage_with_frozen_and_unused_parameters_leaves_their_grad_none():
    """Does a stage whose layer is frozen (requires_grad=False), beside a parameter its forward never uses, run its
    backward, return no input gradient on the first stage and leave every .grad None, as torch's autograd does?"""
    import torch

    from helpers.pipeline import Stage

    class Frozen(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 4).requires_grad_(False)
            self.unused = torch.nn.Parameter(torch.zeros(4))

        def forward(self, x):
            return self.layer(x)

    stage = Stage(Frozen(), (2, 4), (2, 4), rank=0, num_stages=1)
    stage.forward(0, torch.ones(2, 4), torch.zeros(2, 4))
    assert stage.backward(0, 1.0) is None
    assert [p.grad for p in stage.parameters()] == [None, None, None]
    assert stage.held == 0 and [kind for kind, *_ in stage.steps] == ["forward", "backward"]


# -- past 1F1B: chunks and a split backward ------------------------------------------------------


def _chunked_rank(rank, world_size, m):
    import torch

    from autograder.answers.lesson10 import interleaved_step
    from helpers.pipeline import Stage

    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 4) for _ in range(2 * world_size)]
    stages = [Stage(layers[c * world_size + rank], (2, 4), (2, 4), chunk=c, num_chunks=2) for c in range(2)]
    g = torch.Generator().manual_seed(1)
    interleaved_step(stages, [(torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)) for _ in range(m)])
    wiring = [(s.piece, s.is_first, s.is_last, s.prev_rank, s.next_rank) for s in stages]
    return Stage.record_all(stages), wiring


def test_chunks_are_wired_as_pieces_of_the_model_and_replay_to_the_interleaved_bubble():
    """With 2 chunks per rank on 3 ranks, is chunk c of rank r piece 3c + r (rank 2's chunk 0 sending on to rank 0's
    chunk 1), and does a breadth-first run of 3 micro-batches replay to (p - 1) / (v m + p - 1) = 2/8?"""
    from helpers import launch

    replies = launch(_chunked_rank, 3, args=(3,), trace=True, output="quiet", timeout=60)
    wiring = [w for _, w in replies]
    assert wiring[0] == [(0, True, False, None, 1), (3, False, False, 2, 1)]
    assert wiring[2] == [(2, False, False, 1, 0), (5, False, True, 1, None)]
    run = Schedule([record for record, _ in replies])
    assert run.bubble == Schedule.interleaved_bubble(3, 3, 2) == Fraction(2, 8) and not run.unmatched
    assert {s.label for s in run.for_rank(0)} >= {"F0a", "F0b", "B2a", "B2b"}


def _split_rank(rank, world_size, split):
    import torch

    from helpers.pipeline import Stage, StageError

    torch.manual_seed(0)
    stage = Stage(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh()), (2, 3), (2, 3), rank=1, num_stages=3)
    x = torch.randn(2, 3)
    stage.forward(0, x)
    grad = torch.randn(2, 3)
    if not split:
        got = stage.backward(0, grad)
        return got, [p.grad.clone() for p in stage.parameters()], None
    got = stage.backward_input(0, grad)
    before = [p.grad for p in stage.parameters()]            # no weight gradient yet
    try:
        stage.backward(0, grad)
        twice = "no error"
    except StageError as err:
        twice = str(err)
    stage.backward_weight(0)
    try:
        stage.backward_weight(0)
    except StageError as err:
        twice += " | " + str(err)
    return got, [p.grad.clone() for p in stage.parameters()], (before, twice, stage.held)


def test_a_split_backward_gives_the_whole_backwards_gradients_in_two_halves():
    """Does backward_input return the input's gradient at once with no weight gradient yet, and backward_weight then
    add exactly the weight gradients one backward gives, freeing the activations; is each half refused twice?"""
    import torch

    from helpers import launch

    whole_input, whole_weights, _ = launch(_split_rank, 1, args=(False,), output="quiet", timeout=60)[0]
    got_input, got_weights, (before, twice, held) = launch(_split_rank, 1, args=(True,), output="quiet", timeout=60)[0]
    assert torch.equal(got_input, whole_input)
    assert before == [None, None] and held == 0
    assert all(torch.allclose(a, b) for a, b in zip(got_weights, whole_weights))
    assert "already went backward" in twice and "already had its weight gradients" in twice, twice


def _zero_bubble_rank(rank, world_size, m):
    import torch
    import torch.distributed as dist

    from helpers.pipeline import Stage

    torch.manual_seed(0)
    layer = [torch.nn.Linear(4, 4) for _ in range(world_size)][rank]
    stage = Stage(layer, (2, 4), (2, 4))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)) for _ in range(m)]
    requests, postponed, s, p = [], [], stage.rank, stage.num_stages

    def forward(i):
        x = batches[i][0] if stage.is_first else torch.empty(2, 4)
        if not stage.is_first:
            dist.recv(x, src=stage.prev_rank)
        y = stage.forward(i, x, batches[i][1] if stage.is_last else None)
        if not stage.is_last:
            requests.append(dist.isend(y, dst=stage.next_rank))

    warmup = min(p - s - 1, m)
    for i in range(warmup):
        forward(i)
    for i in range(m):
        if warmup + i < m:
            forward(warmup + i)
        grad = 1.0 / m if stage.is_last else torch.empty(2, 4)
        if not stage.is_last:
            dist.recv(grad, src=stage.next_rank)
        back = stage.backward_input(i, grad)
        if not stage.is_first:
            requests.append(dist.isend(back, dst=stage.prev_rank))
        postponed.append(i)
        if i >= s:
            stage.backward_weight(postponed.pop(0))
    for i in postponed:
        stage.backward_weight(i)
    for request in requests:
        request.wait()
    return stage.record()


def test_zero_bubble_h1_replays_to_a_third_of_1f1bs_idle_time():
    """Does ZB-H1 (1F1B's order, backward split, stage s postponing its first s weight gradients) on 3 stages and 6
    micro-batches replay to (p - 1) / (3m + p - 1) = 1/10, with W steps in the picture?"""
    from helpers import launch

    run = Schedule(list(launch(_zero_bubble_rank, 3, args=(6,), trace=True, output="quiet", timeout=60)))
    assert run.bubble == Schedule.zero_bubble_h1_bubble(3, 6) == Fraction(1, 10) and not run.unmatched
    assert run.makespan == 3 * 6 + 2 and "W5" in run.lanes()
