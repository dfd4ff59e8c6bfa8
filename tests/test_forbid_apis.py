"""``forbid=`` switching off whole APIs (ZeroRedundancyOptimizer, FSDP, DTensor, pipelining) and every way into
the functional collectives, on real gloo ranks.

Ranks import this file first, so it imports nothing slow at the top.
"""

from __future__ import annotations

import pytest

from helpers import APIS, COLLECTIVES, DTENSOR, FSDP, PIPELINING, ZERO, Cluster, launch
from helpers.settings import LaunchSettings

REASONS = {ZERO: "shard the optimizer yourself", FSDP: "shard the parameters yourself",
           DTENSOR: "split the layers yourself", PIPELINING: "schedule the micro-batches yourself"}


def _pipeline_stage(rank, world_size):
    """A pipeline stage of one linear layer, made the way this torch's PipelineStage takes it."""
    import inspect

    import torch
    import torch.nn as nn
    from torch.distributed.pipelining import PipelineStage

    # torch 2.4's stage needs example inputs, and checks its arguments before the refused base class runs
    wants = inspect.signature(PipelineStage.__init__).parameters.get("input_args")
    extra = {"input_args": (torch.ones(1, 2),)} if wants is not None and wants.default is wants.empty else {}
    return PipelineStage(nn.Linear(2, 2), rank, world_size, torch.device("cpu"), **extra)


def _attempts(rank, world_size):
    import traceback
    import warnings

    import torch
    import torch.distributed as dist
    import torch.nn as nn

    from helpers import ForbiddenCallError

    def zero():
        from torch.distributed.optim import ZeroRedundancyOptimizer
        ZeroRedundancyOptimizer(nn.Linear(2, 2).parameters(), torch.optim.SGD, lr=0.1)

    def fully_shard_public():
        from torch.distributed.fsdp import fully_shard
        fully_shard(nn.Linear(2, 2))

    def fully_shard_composable():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.distributed._composable.fsdp import fully_shard
        fully_shard(nn.Linear(2, 2))

    def fsdp1():
        from torch.distributed.fsdp import FullyShardedDataParallel
        FullyShardedDataParallel(nn.Linear(2, 2))

    def init_device_mesh():
        from torch.distributed.device_mesh import init_device_mesh
        init_device_mesh("cpu", (world_size,))

    def device_mesh():
        from torch.distributed.device_mesh import DeviceMesh
        DeviceMesh("cpu", list(range(world_size)))

    def from_local():
        from torch.distributed.tensor import DTensor
        DTensor.from_local(torch.ones(2), None)

    def parallelize():
        from torch.distributed.tensor.parallel import parallelize_module
        parallelize_module(nn.Linear(2, 2), None, {})

    def stage():
        _pipeline_stage(rank, world_size)

    def schedule():
        from torch.distributed.pipelining import Schedule1F1B
        Schedule1F1B(None, 2)

    def funcol(name, *args):
        import torch.distributed._functional_collectives as fc
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            getattr(fc, name)(*args)

    group = dist.group.WORLD
    attempts = {f.__name__: f for f in (zero, fully_shard_public, fully_shard_composable, fsdp1, init_device_mesh,
                                         device_mesh, from_local, parallelize, stage, schedule)}
    attempts.update({
        "all_gather_tensor": lambda: funcol("all_gather_tensor", torch.ones(2), 0, group),
        "all_reduce": lambda: funcol("all_reduce", torch.ones(2), "sum", group),
        "reduce_scatter_tensor": lambda: funcol("reduce_scatter_tensor", torch.ones(2), "sum", 0, group),
        "all_to_all_single": lambda: funcol("all_to_all_single", torch.ones(2), None, None, group),
        "broadcast": lambda: funcol("broadcast", torch.ones(2), 0, group),
        "op": lambda: torch.ops._c10d_functional.all_gather_into_tensor(torch.ones(2), world_size, group.group_name),
    })
    out = {}
    for label, attempt in attempts.items():
        try:
            attempt()
            out[label] = None
        except ImportError:
            out[label] = "not in this torch"  # e.g. fully_shard in torch.distributed.fsdp before 2.6
        except ForbiddenCallError as err:
            caller = traceback.extract_tb(err.__traceback__)[-2].name  # the frame that made the refused call
            out[label] = (err.call, err.family, err.name, err.reason, caller)
    return out


def test_each_whole_api_and_every_functional_collective_is_refused():
    """With forbid naming ZERO, FSDP, DTENSOR, PIPELINING and every collective, does each way in (ZeroRedundancyOptimizer,
    fully_shard from both packages, FullyShardedDataParallel, init_device_mesh, DeviceMesh, DTensor.from_local,
    parallelize_module, PipelineStage, a schedule, the functional collectives and their op) raise
    ForbiddenCallError naming what was called, its family, the forbid name and the reason?"""
    forbid = {**REASONS, **dict.fromkeys(COLLECTIVES, "build it from send and recv")}
    result = launch(_attempts, 2, forbid=forbid, output="quiet", timeout=120)
    seen = result[0]
    assert result[1] == seen
    expected = {
        "zero": ("torch.distributed.optim.ZeroRedundancyOptimizer", "zero", ZERO),
        "fully_shard_public": ("torch.distributed.fsdp.fully_shard", "fsdp", FSDP),
        "fully_shard_composable": ("torch.distributed._composable.fsdp.fully_shard", "fsdp", FSDP),
        "fsdp1": ("torch.distributed.fsdp.FullyShardedDataParallel", "fsdp", FSDP),
        "init_device_mesh": ("torch.distributed.device_mesh.init_device_mesh", "dtensor", DTENSOR),
        "device_mesh": ("torch.distributed.device_mesh.DeviceMesh", "dtensor", DTENSOR),
        "from_local": ("torch.distributed.tensor.DTensor.from_local", "dtensor", DTENSOR),
        "parallelize": ("torch.distributed.tensor.parallel.parallelize_module", "dtensor", DTENSOR),
        "stage": ("torch.distributed.pipelining.PipelineStage", "pipelining", PIPELINING),
        "schedule": ("torch.distributed.pipelining.Schedule1F1B", "pipelining", PIPELINING),
    }
    absent = {label for label, value in seen.items() if value == "not in this torch"}
    assert absent <= {"fully_shard_public", "from_local", "parallelize", "stage", "schedule"}, absent  # newer APIs only
    for label, (call, family, name) in expected.items():
        if label in absent:
            continue
        assert seen[label] is not None, f"{label} was not refused"
        assert seen[label][:4] == (call, family, name, REASONS[name]), seen[label]
    for label in {"fully_shard_public", "init_device_mesh", "from_local", "parallelize"} - absent:
        assert seen[label][4] == label, seen[label]  # raised at the program's own call, not deep inside torch
    for label in ("all_gather_tensor", "all_reduce", "reduce_scatter_tensor", "all_to_all_single", "broadcast"):
        assert seen[label] is not None, f"_functional_collectives.{label} was not refused"
        assert seen[label][:2] == (f"torch.distributed._functional_collectives.{label}", "collective"), seen[label]
    assert seen["op"][:2] == ("torch.ops._c10d_functional.all_gather_into_tensor", "collective"), seen["op"]


def test_forbid_accepts_the_api_names_and_refuses_unknown_ones():
    """Does LaunchSettings take every name of helpers.APIS, and say which names exist for an unknown one?"""
    assert set(LaunchSettings(2, forbid=list(APIS)).forbid) == set(APIS)
    assert set(APIS) >= {ZERO, FSDP, DTENSOR, PIPELINING}
    with pytest.raises(ValueError, match="helpers.APIS.*'FSDP'"):
        LaunchSettings(2, forbid=["fsdp2"])


def _take_fully_shard(rank, world_size):
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch before 2.6
        from torch.distributed._composable.fsdp import fully_shard

    globals()["early"] = fully_shard  # a reference taken before the switch-off


def _use(rank, world_size, what):
    import torch
    import torch.nn as nn

    from helpers import ForbiddenCallError

    try:
        if what == "early":
            from torch.distributed.device_mesh import init_device_mesh

            # A CPU mesh named: left to itself, fully_shard builds its mesh on the GPUs when torch sees any.
            globals()["early"](nn.Linear(2, 2), mesh=init_device_mesh("cpu", (world_size,)))
        elif what == "mesh":
            from torch.distributed.device_mesh import init_device_mesh
            init_device_mesh("cpu", (world_size,))
        else:
            _pipeline_stage(rank, world_size)
    except ForbiddenCallError as err:
        return err.call
    return None


def test_kept_ranks_refuse_for_one_request_and_work_again_after():
    """On persistent ranks, is FSDP refused for one request even through a fully_shard taken earlier (FSDP2's state
    refuses to be built), pipelining refused though not imported yet when switched off, and both usable again in
    the next request?"""
    with Cluster(2, output="quiet", view="text", timeout=120) as cluster:
        cluster.run(_take_fully_shard)
        refused = cluster.run(_use, "early", forbid=[FSDP])
        assert refused in (["torch.distributed.fsdp.fully_shard"] * 2,
                           ["torch.distributed._composable.fsdp.fully_shard"] * 2), refused  # before torch 2.6
        assert cluster.run(_use, "early") == [None, None]
        assert cluster.run(_use, "mesh", forbid=[DTENSOR]) == [
            "torch.distributed.device_mesh.init_device_mesh"] * 2
        assert cluster.run(_use, "mesh") == [None, None]
        cluster.run(_use, "mesh", forbid=[PIPELINING])  # switched off before pipelining is imported ...
        assert cluster.run(_use, "stage", forbid=[PIPELINING]) == [
            "torch.distributed.pipelining.PipelineStage"] * 2  # ... refused when it is
        assert cluster.run(_use, "stage") == [None, None]
