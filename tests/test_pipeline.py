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

    from autograder.lessons import reference
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
