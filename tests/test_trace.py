"""Tracing, pictures and deadlock diagnosis, on real gloo ranks.

Every rank that runs a function of this file imports the file first, so it imports nothing
slow at the top (matplotlib, the autograder's reference ring). That import is start-up, which
the 2 s timeouts of the hang tests do not count (they start once every rank has loaded its
function); before they did, on a loaded machine the import alone outlasted them, and ranks
were reported as running an import instead of waiting in their calls.
"""

from __future__ import annotations

import math
import os
import warnings

import pytest

from helpers import Cluster, LaunchTimeoutError, launch, perf

os.environ.setdefault("MPLBACKEND", "Agg")  # pictures without a display, set before matplotlib is imported


def token_ring(rank, world_size):
    import torch
    import torch.distributed as dist

    token = torch.zeros(4)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    if rank == 0:
        dist.send(token + 1, right)
        dist.recv(token, left)
    else:
        dist.recv(token, left)
        dist.send(token + 1, right)
    return token[0].item()


def reference_ring(rank, world_size, n):
    import torch

    from autograder.answers.lesson04 import ring_allreduce

    t = torch.arange(float(n)) + rank
    ring_allreduce(t)
    return t


def test_token_ring_counts_each_message_once():
    """Does a token passed round a 4-rank ring give one 16-byte message per link, and nothing else?"""
    result = launch(token_ring, 4, trace=True, output="quiet")
    trace = result.trace
    assert result == [4.0, 1.0, 2.0, 3.0]
    summary = trace.summary()
    for r in range(4):
        assert summary[r]["sent_messages"] == 1 and summary[r]["sent_bytes"] == 16
        assert summary[r]["recv_messages"] == 1 and summary[r]["recv_bytes"] == 16
    expected = [[16 if j == (i + 1) % 4 else 0 for j in range(4)] for i in range(4)]
    assert trace.link_matrix() == expected
    assert trace.op_totals() == {"recv": {"calls": 4, "bytes": 64}, "send": {"calls": 4, "bytes": 64}}
    pairs = trace.matched_messages()
    assert len(pairs) == 4 and all(recv is not None and recv.rank == send.peer for send, recv in pairs)
    for event in trace.events:
        assert event.dtype == "float32" and event.shape == (4,) and event.end >= event.start >= 0


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_chunked_ring_counts_are_bandwidth_optimal(world_size):
    """Does a chunked ring on n=10 (not divisible) show 2(p-1) messages per rank and 2(p-1)n elements in all?"""
    n = 10
    result = launch(reference_ring, world_size, (n,), trace=True, output="quiet")
    total = sum(range(world_size)) + world_size * __import__("torch").arange(float(n))
    assert all(bool((t == total).all()) for t in result)
    summary = result.trace.summary()
    bound = 2 * (world_size - 1) * math.ceil(n / world_size) * 4
    for r in range(world_size):
        assert summary[r]["sent_messages"] == 2 * (world_size - 1)
        assert summary[r]["sent_bytes"] <= bound
    assert sum(s["sent_bytes"] for s in summary.values()) == 2 * (world_size - 1) * n * 4
    # Every byte goes to the right-hand neighbour.
    matrix = result.trace.link_matrix()
    for i in range(world_size):
        for j in range(world_size):
            assert (matrix[i][j] > 0) == (j == (i + 1) % world_size)


def _collectives(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.ones(3) * rank
    dist.broadcast(t, src=1)
    parts = [torch.zeros(3) for _ in range(world_size)]
    dist.all_gather(parts, torch.ones(3) * rank)
    return t.tolist()


def test_broadcast_and_all_gather_are_recorded_as_collectives():
    """Are broadcast and all_gather one record per rank with their sizes, and kept out of the link matrix?"""
    result = launch(_collectives, 3, trace=True, output="quiet")
    trace = result.trace
    assert result == [[1.0] * 3] * 3
    totals = trace.op_totals()
    assert totals["broadcast"] == {"calls": 3, "bytes": 36}
    assert totals["all_gather"] == {"calls": 3, "bytes": 36}
    assert trace.link_matrix() == [[0] * 3] * 3
    assert "point-to-point" in trace.link_note
    broadcasts = [e for e in trace.events if e.op == "broadcast"]
    assert {e.peer for e in broadcasts} == {1}


def _batched(rank, world_size):
    import torch
    import torch.distributed as dist

    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    out, inc = torch.ones(5) * rank, torch.zeros(5)
    ops = [dist.P2POp(dist.isend, out, right), dist.P2POp(dist.irecv, inc, left)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    req = dist.isend(out, right)
    dist.recv(inc, left)
    req.wait()
    return inc[0].item()


def test_batch_operations_are_separate_records_and_waits_are_timed():
    """Is each op inside batch_isend_irecv its own isend/irecv record, and is the wait of an isend recorded?"""
    result = launch(_batched, 3, trace=True, output="quiet")
    trace = result.trace
    assert result == [2.0, 0.0, 1.0]
    batch = [e for e in trace.events if e.batch]
    assert sorted(e.op for e in batch) == ["irecv"] * 3 + ["isend"] * 3
    assert all(e.waited is not None and e.waited >= e.end for e in batch)
    lone = [e for e in trace.events if e.op == "isend" and not e.batch]
    assert len(lone) == 3 and all(e.async_op and e.waited is not None for e in lone)
    assert "batch_isend_irecv" not in trace.op_totals()


def _receive_first(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.zeros(1)
    dist.recv(t, src=(rank + 1) % world_size)
    dist.send(t, dst=(rank - 1) % world_size)


def _skip_collective(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.zeros(1)
    if rank == 2:
        dist.recv(t, src=3)
    else:
        dist.all_reduce(t)


def test_receive_first_deadlock_reports_the_cycle():
    """With tracing off, does a receive-first deadlock name each rank's recv, its peer, and the cycle?"""
    # Found as a deadlock about a second after it forms (a DeadlockError, with the same report): the long
    # timeout only bounds the test.
    with pytest.raises(LaunchTimeoutError) as info:
        launch(_receive_first, 3, timeout=30, output="quiet")
    err = info.value
    for r in range(3):
        assert f"recv(src={(r + 1) % 3})" in err.waiting[r]
        assert "dist.recv(t, src=(rank + 1) % world_size)" in err.waiting[r]
    assert "Wait-for cycle" in str(err)
    assert "every rank is receiving before anyone sends" in str(err)


def test_skipped_collective_names_the_missing_rank():
    """Is a rank that never reached all_reduce named, with the call it is in instead?"""
    with pytest.raises(LaunchTimeoutError) as info:
        launch(_skip_collective, 4, timeout=2, output="quiet")
    message = str(info.value)
    assert "rank 2 never reached all_reduce; it is in recv(src=3)" in message
    assert "rank 0 waits in all_reduce" in message


def _sizes_differ(rank, world_size, then=None):
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(3 + rank))  # gloo pairs the two calls; rank 0 returns, rank 1 waits for more
    if then == "recv" and rank == 0:
        dist.recv(torch.zeros(1), src=1)


def _different_collectives(rank, world_size):
    import torch
    import torch.distributed as dist

    if rank == 0:
        dist.all_reduce(torch.ones(3))
    else:
        dist.broadcast(torch.ones(3), src=1)


def _subgroup_then_skip(rank, world_size):
    import torch
    import torch.distributed as dist

    pair = dist.new_group([0, 1])
    if rank in (0, 1):
        dist.all_reduce(torch.ones(1), group=pair)  # ranks 0 and 1 make one collective more than rank 2
    if rank != 2:
        dist.all_reduce(torch.ones(1))  # and rank 2 skips this one


def test_a_collective_of_different_sizes_is_not_called_missing():
    """When sizes differ, rank 0 makes its all_reduce and returns while rank 1 waits: is that said, not "never reached"?"""
    with pytest.raises(LaunchTimeoutError) as info:
        launch(_sizes_differ, 2, timeout=2, output="quiet")
    message = str(info.value)
    assert "never reached" not in message, message
    assert ("rank 0 made the call that pairs with rank 1's all_reduce and returned (on both, collective number 1 "
            "on the whole group), but rank 1 still waits in it: the two calls did not agree") in message, message
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in message and message.count("Fix:") == 1, message


def test_a_rank_that_went_on_after_a_mismatched_collective_is_named_where_it_is():
    """Does a rank that left the mismatched all_reduce for a recv get named in that recv, as having made the call?"""
    with pytest.raises(LaunchTimeoutError) as info:
        launch(_sizes_differ, 2, args=("recv",), timeout=2, output="quiet")
    message = str(info.value)
    assert "rank 0 made the call that pairs with rank 1's all_reduce and went on to recv(src=1) at " in message, message
    assert "never reached all_reduce" not in message, message


def test_two_different_collectives_at_the_same_point_are_named_once():
    """Rank 0 in all_reduce, rank 1 in broadcast, as each one's first collective: is that one note naming both?"""
    with pytest.raises(LaunchTimeoutError) as info:
        launch(_different_collectives, 2, timeout=2, output="quiet")
    notes = [n for n in info.value.notes if "they are different collectives" in n]
    assert len(notes) == 1, info.value.notes
    assert "broadcast(src=1)" in notes[0] and "all_reduce" in notes[0] and "collective number 1" in notes[0]


def test_a_subgroups_collectives_do_not_make_a_missing_call_look_made():
    """Ranks 0 and 1 make one collective more on a subgroup, then rank 2 skips the world's all_reduce: is rank 2
    still named as never reaching it (subgroup calls are not counted against the whole group's)?"""
    with pytest.raises(LaunchTimeoutError) as info:
        launch(_subgroup_then_skip, 3, timeout=2, output="quiet")
    message = str(info.value)
    assert "rank 2 never reached all_reduce: it already returned" in message, message
    assert "did not agree" not in message, message


def test_persistent_ranks_count_collectives_across_cells():
    """On persistent ranks, after one all_reduce cell, is a mismatched all_reduce in the next named as the 2nd collective?"""
    with Cluster(2, output="quiet", view="text") as cluster:
        cluster.exec("dist.all_reduce(torch.ones(2))")
        with pytest.raises(LaunchTimeoutError) as info:
            cluster.exec("dist.all_reduce(torch.ones(3 + rank))", timeout=2)
    message = str(info.value)
    assert "rank 0 made the call that pairs with rank 1's all_reduce and returned (on both, collective number 2 " in message, message


# -- every public call is watched -----------------------------------------------------------

#: Calls that not every supported torch has: they are wrapped where the installed torch has them.
NEWER_COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "all_reduce_coalesced")
#: torch 2.14's gather into one tensor, and its deprecated name: gloo has no gather_single yet (it raises),
#: so they are only checked to be switched off with the other collectives.
GATHER_SINGLE = ("gather_single", "gather_into_tensor")


def _public_calls() -> set[str]:
    """The public functions of the installed torch.distributed (its __all__ and its module's)."""
    import inspect

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    names = set(getattr(c10d, "__all__", ())) | {n for n in dir(dist) if not n.startswith("_")}
    found = set()
    with warnings.catch_warnings():  # touching a deprecated alias (reduce_op) warns
        warnings.simplefilter("ignore")
        for name in names:
            obj = getattr(dist, name, None) or getattr(c10d, name, None)
            if obj is None or inspect.isclass(obj) or not callable(obj) or inspect.ismodule(obj):
                continue
            module = getattr(obj, "__module__", "") or ""
            if module.startswith("torch.distributed") or name in getattr(c10d, "__all__", ()):
                found.add(name)
    return found


def test_every_public_call_is_wrapped_or_deliberately_left_alone():
    """Is every public function of the installed torch.distributed either wrapped (traced, named in hang reports) or listed as moving no data?"""
    from helpers._runtime.calls import COLLECTIVES, NOT_COMMUNICATION, POINT_TO_POINT

    public = _public_calls()
    assert {"all_reduce", "send", "init_process_group"} <= public, sorted(public)  # the scan finds something
    wrapped = set(POINT_TO_POINT) | set(COLLECTIVES)
    unknown = sorted(public - wrapped - set(NOT_COMMUNICATION))
    assert not unknown, (
        f"torch.distributed {__import__('torch').__version__} has public calls the helpers neither wrap nor "
        f"list as moving no data: {unknown}. Add each collective to COLLECTIVES (or POINT_TO_POINT) in "
        "helpers/_runtime/calls.py, or a call that moves no data to NOT_COMMUNICATION there."
    )
    assert not set(NOT_COMMUNICATION) & wrapped


def _wrapped_and_newer(rank, world_size):
    import torch
    import torch.distributed as dist

    from helpers._runtime.calls import COLLECTIVES, POINT_TO_POINT

    unwrapped = [n for n in POINT_TO_POINT + COLLECTIVES
                 if hasattr(dist, n) and not hasattr(getattr(dist, n), "__wrapped__")]
    values = {}
    if hasattr(dist, "all_gather_single"):
        out = torch.zeros(2 * world_size)
        dist.all_gather_single(out, torch.full((2,), float(rank)))
        values["all_gather_single"] = out.tolist()
    if hasattr(dist, "reduce_scatter_single"):
        out = torch.zeros(2)
        dist.reduce_scatter_single(out, torch.arange(2.0 * world_size) + rank)
        values["reduce_scatter_single"] = out.tolist()
    if hasattr(dist, "all_reduce_coalesced"):
        tensors = [torch.full((3,), float(rank)), torch.ones(1)]
        dist.all_reduce_coalesced(tensors)
        values["all_reduce_coalesced"] = [t.tolist() for t in tensors]
    return unwrapped, values


def test_newer_collectives_are_traced_on_gloo():
    """Are all_gather_single, reduce_scatter_single and all_reduce_coalesced (unwrapped before) one record per rank with their bytes, and is every known call wrapped on the ranks?"""
    import torch.distributed as dist

    present = [n for n in NEWER_COLLECTIVES if hasattr(dist, n)]
    if not present:
        pytest.skip(f"this torch has none of {NEWER_COLLECTIVES}")
    result = launch(_wrapped_and_newer, 2, trace=True, output="quiet")
    for rank, (unwrapped, values) in enumerate(result):
        assert unwrapped == [], f"rank {rank}: not wrapped: {unwrapped}"
        assert sorted(values) == sorted(present)
        if "all_gather_single" in values:
            assert values["all_gather_single"] == [0.0, 0.0, 1.0, 1.0]
        if "reduce_scatter_single" in values:
            assert values["reduce_scatter_single"] == [[1.0, 3.0], [5.0, 7.0]][rank]
        if "all_reduce_coalesced" in values:
            assert values["all_reduce_coalesced"] == [[1.0, 1.0, 1.0], [2.0]]
    totals = result.trace.op_totals()
    expected_bytes = {"all_gather_single": 8, "reduce_scatter_single": 16, "all_reduce_coalesced": 16}
    for name in present:
        assert totals.get(name) == {"calls": 2, "bytes": 2 * expected_bytes[name]}, (name, totals)
    assert set(totals) == set(present), totals  # no inner call recorded twice


def _try_newer_collectives(rank, world_size):
    import torch
    import torch.distributed as dist

    from helpers import ForbiddenCallError

    calls = {
        "all_gather_single": lambda: dist.all_gather_single(torch.zeros(2 * world_size), torch.ones(2)),
        "reduce_scatter_single": lambda: dist.reduce_scatter_single(torch.zeros(1), torch.ones(world_size)),
        "all_reduce_coalesced": lambda: dist.all_reduce_coalesced([torch.ones(1)]),
        "gather_single": lambda: dist.gather_single(torch.ones(1), torch.zeros(world_size) if rank == 0 else None),
        "gather_into_tensor": lambda: dist.gather_into_tensor(torch.ones(1), torch.zeros(world_size) if rank == 0 else None),
    }
    refused = {}
    for name, call in calls.items():
        if hasattr(dist, name):
            try:
                call()
                refused[name] = False
            except ForbiddenCallError:
                refused[name] = True
    return refused


def test_an_exercise_that_switches_collectives_off_switches_off_the_newer_ones():
    """With forbid=COLLECTIVES (the exercises that build a collective from point-to-point calls), are the newer
    collectives of the installed torch (all_gather_single, gather_single of torch 2.14, ...) refused too, so that
    none of them can stand in for the communication an exercise teaches?"""
    import torch.distributed as dist

    from helpers import COLLECTIVES

    present = [n for n in (*NEWER_COLLECTIVES, *GATHER_SINGLE) if hasattr(dist, n)]
    if not present:
        pytest.skip(f"this torch has none of {NEWER_COLLECTIVES}")
    refused = launch(_try_newer_collectives, 2, forbid=COLLECTIVES, output="quiet", timeout=20)
    for rank_refused in refused:
        assert sorted(rank_refused) == sorted(present)
        assert all(rank_refused.values()), rank_refused


def _half_gather(rank, world_size):
    import torch
    import torch.distributed as dist

    if rank == 0:
        dist.all_gather_single(torch.zeros(2 * world_size), torch.ones(2))


def test_a_hang_in_a_newer_collective_is_named():
    """Is a rank stuck in all_gather_single (a call the wrappers missed before) named in the hang report, with the rank that never came?"""
    import torch.distributed as dist

    if not hasattr(dist, "all_gather_single"):
        pytest.skip("this torch has no all_gather_single")
    with pytest.raises(LaunchTimeoutError) as info:
        launch(_half_gather, 2, timeout=2, output="quiet")
    message = str(info.value)
    assert "all_gather_single" in info.value.waiting[0], info.value.waiting
    assert "rank 1 never reached all_gather_single" in message, message


def test_cluster_run_and_exec_can_trace():
    """Do Cluster.run(trace=True) and Cluster.exec(trace=True) give the same kind of trace as launch?"""
    with Cluster(2, output="quiet", view="text") as cluster:
        values = cluster.run(token_ring, trace=True)
        assert values == [2.0, 1.0]
        assert values.trace.summary()[0]["sent_messages"] == 1
        result = cluster.exec("x = torch.ones(2); dist.all_reduce(x); x.sum().item()", trace=True)
        assert result == [4.0, 4.0]
        assert result.trace.op_totals() == {"all_reduce": {"calls": 2, "bytes": 16}}


def test_pictures_from_a_real_trace():
    """Does each picture build headless, with one lane per rank, one arrow per message and one cell per link?"""
    trace = launch(reference_ring, 3, (12,), trace=True, output="quiet").trace
    timeline = trace.plot_timeline()
    ax = timeline.axes[0]
    assert len(ax.get_yticks()) == 3
    assert timeline.n_arrows == len(trace.matched_messages()) == 12
    assert ax.get_title() and ax.get_xlabel() and ax.get_legend() is not None
    links = trace.plot_links()
    assert len(links.axes[0].texts) == 9
    steps = trace.ring_steps()
    assert len(steps) == 4 and [s["phase"] for s in steps] == ["reduce-scatter"] * 2 + ["all-gather"] * 2
    assert not steps[0]["assumed_chunks"]  # chunk ids read from the views' offsets
    assert steps[-1]["holdings"] == [[3, 3, 3]] * 3
    grid = trace.plot_ring_steps(interactive=False)
    panels = [a for a in grid.axes if a.get_title()]
    assert len([a for a in panels if a.get_title().startswith("step")]) == 4
    widget = trace.plot_ring_steps(interactive=True)
    slider = widget.children[0]
    assert slider.max == 3


def _one_phase(rank, world_size, phase):
    import torch

    from autograder.answers.lesson04 import ring_all_gather, ring_reduce_scatter

    t = torch.arange(12.0)
    (ring_reduce_scatter if phase == "reduce-scatter" else ring_all_gather)(t)


def test_ring_steps_of_one_phase_alone():
    """Does ring_steps read a lone reduce-scatter (rank r ends owning chunk r) and a lone all-gather (from the diagonal to a full grid)?"""
    rs = launch(_one_phase, 3, ("reduce-scatter",), trace=True, output="quiet").trace
    steps = rs.ring_steps(phases=("reduce-scatter",))
    assert [s["phase"] for s in steps] == ["reduce-scatter"] * 2 and not steps[0]["assumed_chunks"]
    assert [steps[-1]["holdings"][r][r] for r in range(3)] == [3, 3, 3]
    assert steps[0]["sends"] == [(0, 1, 2), (1, 2, 0), (2, 0, 1)]  # rank r starts with chunk r-1
    ag = launch(_one_phase, 3, ("all-gather",), trace=True, output="quiet").trace
    steps = ag.ring_steps(phases=("all-gather",))
    assert [s["phase"] for s in steps] == ["all-gather"] * 2
    assert steps[0]["holdings"] == [[3, 0, 3], [3, 3, 0], [0, 3, 3]]  # own chunk plus the left neighbour's
    assert steps[-1]["holdings"] == [[3, 3, 3]] * 3
    figure = ag.plot_ring_steps(interactive=False, phases=("all-gather",))
    assert "all-gather" in figure._suptitle.get_text()
    with pytest.raises(ValueError, match="phases is a sequence of"):
        ag.ring_steps(phases=("allgather",))


def test_pingpong_fit_and_alpha_beta_picture():
    """Does a small ping-pong give a positive alpha and beta, and the model plot draw measured and model lines?"""
    pp = perf.pingpong(sizes=[1 << 10, 1 << 16, 1 << 20], repeats=2)
    fit = pp.fit()
    assert fit.alpha >= 0 and fit.beta > 0
    sweep = perf.time_allreduce(None, sizes=[1 << 10, 1 << 16], world_size=2, repeats=2)
    assert len(sweep.seconds) == 2 and all(s > 0 for s in sweep.seconds)
    fig = sweep.plot_alpha_beta(fit)
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 2 and ax.get_xlabel() and ax.get_legend() is not None
    assert len(pp.plot(fit).axes[0].get_lines()) == 2
    assert perf.ring_model(1000, 4, 1e-5, 1e-9) == pytest.approx(6e-5 + 1.5e-6)
