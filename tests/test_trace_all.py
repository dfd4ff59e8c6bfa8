"""Every collective in the trace, however it is made: ProcessGroup methods called directly, the functional
collectives (DTensor, parallelize_module, clip_grad_norm_ on FSDP2), FSDP2's own calls, and pipelining
running under the wrappers. Real gloo ranks; nothing is mocked.

Ranks import this file first, so it imports nothing slow at the top.
"""

from __future__ import annotations

import pytest

from helpers import launch

from _torch_features import needs_dtensor, needs_fsdp2, needs_pipelining


def _direct_process_group(rank, world_size):
    import torch
    import torch.distributed as dist

    pg = dist.group.WORLD
    t = torch.ones(4)
    dist.all_reduce(t)  # one event: its own ProcessGroup.allreduce is part of it
    pg.allreduce([t]).wait()
    pg.allreduce(t, dist.ReduceOp.MAX).wait()  # the single-tensor overload, with an op
    gathered = torch.zeros(2 * world_size)
    pg._allgather_base(gathered, torch.full((2,), float(rank))).wait()
    scattered = torch.zeros(2)
    pg._reduce_scatter_base(scattered, torch.arange(2.0 * world_size)).wait()
    outs = [torch.zeros(3 * world_size)]
    pg.allgather_into_tensor_coalesced(outs, [torch.full((3,), float(rank))]).wait()
    box = torch.full((5,), float(rank))
    if rank == 0:
        pg.send([box], 1, 7).wait()
    else:
        pg.recv([box], 0, 7).wait()
    return gathered.tolist(), scattered.tolist(), outs[0].tolist(), box.tolist(), t.tolist()


def test_process_group_methods_called_directly_are_traced_once_each():
    """Are pg.allreduce, _allgather_base, _reduce_scatter_base, allgather_into_tensor_coalesced and pg.send/recv
    one event each, named as the public call doing that work with their bytes, and is dist.all_reduce (which ends
    in pg.allreduce) still one event?"""
    result = launch(_direct_process_group, 2, trace=True, output="quiet", timeout=60)
    gathered, scattered, coalesced, box, t = result[1]
    assert gathered == [0.0, 0.0, 1.0, 1.0] and scattered == [4.0, 6.0] and coalesced == [0.0] * 3 + [1.0] * 3
    assert box == [0.0] * 5 and t == [4.0] * 4  # 1+1, then 2+2, then max(4, 4)
    for rank in range(2):
        seen = [(e.op, e.nbytes, e.via, e.note) for e in result.trace.for_rank(rank)]
        p2p = ("isend", 20, "process_group", "ProcessGroup.send") if rank == 0 else \
            ("irecv", 20, "process_group", "ProcessGroup.recv")
        assert seen == [
            ("all_reduce", 16, None, None),
            ("all_reduce", 16, "process_group", "ProcessGroup.allreduce"),
            ("all_reduce", 16, "process_group", "ProcessGroup.allreduce"),
            ("all_gather_into_tensor", 8, "process_group", "ProcessGroup._allgather_base"),
            ("reduce_scatter_tensor", 16, "process_group", "ProcessGroup._reduce_scatter_base"),
            ("all_gather_into_tensor", 12, "process_group", "ProcessGroup.allgather_into_tensor_coalesced"),
            p2p,
        ], seen
        events = result.trace.for_rank(rank)
        assert events[2].reduce_op == "MAX"
        assert all(e.async_op and e.waited is not None for e in events[1:])
        assert [e.seq for e in events[:6]] == [1, 2, 3, 4, 5, 6]  # numbered like the public collectives
        assert events[6].peer == 1 - rank and events[6].tag == 7
    assert result.trace.link_matrix() == [[0, 20], [0, 0]]


def _functional(rank, world_size):
    import warnings

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD
    summed = funcol.all_reduce(torch.full((3,), float(rank)), "sum", group)
    summed = summed.wait() if hasattr(summed, "wait") else summed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # all_gather_tensor is deprecated in newer torch: still used
        gathered = funcol.all_gather_tensor(torch.full((2,), float(rank)), 0, group)
        reduced = funcol.reduce_scatter_tensor(torch.arange(4.0), "sum", 0, group)  # gloo has AVG from torch 2.8 only
    out = torch.ops._c10d_functional.all_reduce(torch.ones(1), "max", group.group_name)  # the op itself
    torch.ops._c10d_functional.wait_tensor(out)
    return summed.tolist(), gathered.tolist(), reduced.tolist(), out.tolist()


def test_functional_collectives_are_traced_with_their_waits():
    """Are the functional collectives (funcol.all_reduce, all_gather_tensor, reduce_scatter_tensor, and the op
    torch.ops._c10d_functional.all_reduce called directly) one event each, with the public name, bytes, reduce op,
    via "functional", and the time wait_tensor returned?"""
    result = launch(_functional, 2, trace=True, output="quiet", timeout=60)
    assert result[0] == ([1.0] * 3, [0.0, 0.0, 1.0, 1.0], [0.0, 2.0], [1.0])
    for rank in range(2):
        events = result.trace.for_rank(rank)
        seen = [(e.op, e.nbytes, e.reduce_op, e.via, e.note) for e in events]
        assert seen == [
            ("all_reduce", 12, "SUM", "functional", "_c10d_functional.all_reduce"),
            ("all_gather_into_tensor", 8, None, "functional", "_c10d_functional.all_gather_into_tensor"),
            ("reduce_scatter_tensor", 16, "SUM", "functional", "_c10d_functional.reduce_scatter_tensor"),
            ("all_reduce", 4, "MAX", "functional", "_c10d_functional.all_reduce"),
        ], seen
        assert all(e.async_op and e.waited is not None and e.waited >= e.end for e in events)


def _tensor_parallel(rank, world_size):
    import torch
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from helpers._runtime.instrument import current

    inst = current()
    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    setup = [(e.op, e.nbytes) for e in inst.take_events()]
    x = torch.randn(4, 8, requires_grad=True, generator=torch.Generator().manual_seed(1))
    with CommDebugMode() as comm:
        y = model(x)
        forward = inst.take_events()
        y.sum().backward()
        backward = inst.take_events()
    counted = sum(comm.get_comm_counts().values())
    weight = distribute_tensor(torch.arange(16.0).reshape(4, 4), mesh, [Shard(0)])
    inst.take_events()
    total = weight.full_tensor().sum().item()
    gathered = inst.take_events()

    def rows(events):
        return [(e.op, e.nbytes, e.via, e.reduce_op, None if e.group is None else tuple(e.group)) for e in events]

    return setup, rows(forward), rows(backward), counted, rows(gathered), total, x.grad.sum().item()


@needs_dtensor
def test_dtensor_and_parallelize_module_collectives_are_in_the_trace():
    """With a column- then row-parallel MLP on 2 ranks, are the forward's and the backward's all-reduces (the two
    CommDebugMode counts) in the trace with the activation's bytes, and a sharded weight's full_tensor() an
    all-gather of the shard's bytes?"""
    result = launch(_tensor_parallel, 2, trace=True, output="quiet", timeout=120)
    for setup, forward, backward, counted, gathered, total, _ in result:
        assert [op for op, _ in setup] == ["scatter", "scatter", "scatter", "broadcast"]  # the weights, distributed
        # The mesh's group: the world itself (torch 2.13), or a group of every rank made for the mesh (torch 2.11).
        groups = {row[4] for row in forward + backward + gathered}
        assert groups <= {None, (0, 1)}, groups
        assert [row[:4] for row in forward] == [("all_reduce", 4 * 8 * 4, "functional", "SUM")]
        assert [row[:4] for row in backward] == [("all_reduce", 4 * 8 * 4, "functional", "SUM")]
        assert counted == 2  # CommDebugMode still sees them too, under the helpers' wrappers
        assert [row[:4] for row in gathered] == [("all_gather_into_tensor", 2 * 4 * 4, "functional", None)]
        assert total == sum(range(16))
    assert result[0][6] == pytest.approx(result[1][6])


def _fsdp2(rank, world_size, reshard):
    import torch
    import torch.nn as nn

    from helpers._runtime.instrument import current

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4 and 2.5
        from torch.distributed._composable.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world_size,))  # named: by itself fully_shard takes the GPUs when there are any
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(3)])
    for block in model:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    current().take_events()
    model(torch.randn(4, 8)).sum().backward()
    step = [e.op for e in current().take_events()]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    clip = [(e.op, e.via) for e in current().take_events()]
    return step, clip


@needs_fsdp2
@pytest.mark.parametrize("reshard, gathers", [(True, 6), (False, 3)])
def test_fsdp2_collectives_per_step(reshard, gathers):
    """Does one FSDP2 step of a 3-block model show 6 all-gathers and 3 reduce-scatters with reshard_after_forward
    (3 and 3 without), and clip_grad_norm_ on its DTensor gradients a functional all-reduce?"""
    result = launch(_fsdp2, 2, args=(reshard,), trace=True, output="quiet", timeout=120)
    for step, clip in result:
        assert sum("gather" in op for op in step) == gathers, step
        assert sum("scatter" in op for op in step) == 3, step
        assert len(step) == gathers + 3, step
        assert clip == [("all_reduce", "functional")], clip


def _pipeline(rank, world_size, schedule):
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    torch.manual_seed(0)
    full = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
    part = full[2 * rank: 2 * rank + 2]
    stage = PipelineStage(part, rank, world_size, torch.device("cpu"))
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    steps = kind(stage, n_microbatches=4, loss_fn=lambda out, target: ((out - target) ** 2).mean())
    if rank == 0:
        steps.step(torch.randn(8, 8, generator=torch.Generator().manual_seed(1)))
    else:
        steps.step(target=torch.zeros(8, 8))
    same = dist.isend is c10d.isend and dist.irecv is c10d.irecv
    return same, [p.grad.clone() for p in part.parameters()]


@needs_pipelining
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipelining_runs_under_the_wrappers_with_and_without_trace(schedule):
    """Do torch.distributed.pipelining's GPipe and 1F1B run on the wrapped calls (dist.isend is still
    distributed_c10d.isend, which P2POp checks), give the same gradients traced and not, and show one isend per
    micro-batch and boundary in the trace?"""
    import torch

    plain = launch(_pipeline, 2, args=(schedule,), output="quiet", timeout=120)
    traced = launch(_pipeline, 2, args=(schedule,), trace=True, output="quiet", timeout=120)
    for (same_a, grads_a), (same_b, grads_b) in zip(plain, traced):
        assert same_a and same_b
        assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))
    sends = [e.nbytes for e in traced.trace.events if e.op == "isend"]
    receives = [e.nbytes for e in traced.trace.events if e.op == "irecv"]
    # 4 activations forward, 4 gradients back, each a micro-batch of 2 x 8 float32; torch before 2.13 also
    # sends the stage's output shapes once, as a small message of its own.
    assert sends.count(2 * 8 * 4) == receives.count(2 * 8 * 4) == 8, (sends, receives)
    assert len(sends) == len(receives) <= 10, (sends, receives)
    assert all(e.via is None for e in traced.trace.events)


#: ProcessGroup methods that move no data: asking about the group, making groups, stopping it.
NOT_COMMUNICATION_METHODS = {"BackendType", "abort", "boxed", "unbox", "get_group_store", "merge_remote_group", "name",
                             "rank", "size", "set_timeout", "shutdown", "split_group", "bound_device_id",
                             "group_desc", "group_name", "use_pg_for_symm_mem_rendezvous", "options",
                             "Options"}  # torch 2.4: the class of a group's options


def test_every_public_process_group_method_is_watched_or_moves_no_data():
    """Is every public method of the installed torch's ProcessGroup either wrapped (its direct calls traced, named
    as the public call doing that work) or known to move no data, so that a collective a new torch adds is not
    missed?"""
    import torch.distributed as dist

    from helpers._runtime.calls import KNOWN, PROCESS_GROUP_METHODS

    methods = {n for n in vars(dist.ProcessGroup) if not n.startswith("_") and callable(getattr(dist.ProcessGroup, n))}
    assert {"allreduce", "send", "barrier"} <= methods
    unknown = sorted(methods - set(PROCESS_GROUP_METHODS) - NOT_COMMUNICATION_METHODS)
    assert not unknown, (
        f"torch {__import__('torch').__version__}'s ProcessGroup has methods the helpers neither wrap nor list as "
        f"moving no data: {unknown}. Add each to PROCESS_GROUP_METHODS in helpers/_runtime/calls.py (with the public "
        "call doing the same work), or to NOT_COMMUNICATION_METHODS here.")
    assert all(op in KNOWN for op, _ in PROCESS_GROUP_METHODS.values())
