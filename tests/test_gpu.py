"""The nccl path: runs only where CUDA GPUs are present, and says why it skips elsewhere."""

from __future__ import annotations

import pytest
import torch

from helpers import Cluster, launch, machine_info

GPUS = machine_info().get("cuda_count", 0)
needs_two = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 CUDA GPUs for 2 nccl ranks; this machine has {GPUS}")
needs_one = pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU; this machine has none")


def _cuda_allreduce(rank, world_size):
    import torch
    import torch.distributed as dist

    t = torch.ones(1024, device="cuda") * (rank + 1)
    dist.all_reduce(t)
    return {"device": torch.cuda.current_device(), "backend": dist.get_backend(), "value": t[0].item(), "tensor": t}


def _cpu_and_cuda(rank, world_size):
    """What the lessons do (CPU tensors: a collective, and a tagged send/recv around the ring) next to a CUDA one."""
    import torch
    import torch.distributed as dist

    cpu = torch.ones(8) * (rank + 1)
    dist.all_reduce(cpu)
    got = torch.zeros(2)
    reqs = [dist.isend(torch.full((2,), float(rank)), (rank + 1) % world_size, tag=7),
            dist.irecv(got, (rank - 1) % world_size, tag=7)]
    for req in reqs:
        req.wait()
    cuda = torch.ones(4, device="cuda")
    dist.all_reduce(cuda)
    return {"backend": str(dist.get_backend()), "cpu": cpu[0].item(), "from_left": got[0].item(),
            "cuda": cuda[0].item()}


@pytest.mark.gpu
@needs_two
def test_auto_picks_nccl_with_one_gpu_per_rank():
    """With 2 GPUs, does backend='auto' run 2 ranks on nccl, rank r on GPU r, and bring tensors back on the CPU?"""
    result = launch(_cuda_allreduce, 2, output="quiet")
    assert result.backend == "nccl"
    assert [r["device"] for r in result] == [0, 1]
    assert all("nccl" in r["backend"] and r["value"] == 3.0 for r in result)


@pytest.mark.gpu
@needs_two
def test_auto_on_gpus_still_runs_the_lessons_cpu_tensors():
    """On a machine with a GPU per rank, backend='auto' picks nccl; do the lessons' CPU tensors (collectives, tagged
    point-to-point) still work in the same group, through gloo, next to CUDA tensors through nccl?"""
    result = launch(_cpu_and_cuda, 2, output="quiet")
    assert result.backend == "nccl"
    assert [(r["cpu"], r["cuda"]) for r in result] == [(3.0, 2.0)] * 2
    assert [r["from_left"] for r in result] == [1.0, 0.0]
    assert all("cpu:gloo" in r["backend"] and "cuda:nccl" in r["backend"] for r in result), result


@pytest.mark.gpu
@needs_two
def test_explicit_nccl_is_nccl_alone():
    """Does backend='nccl' give nccl alone, as init_process_group('nccl') does on a cluster (CPU tensors refused)?"""
    result = launch(_cuda_allreduce, 2, backend="nccl", output="quiet")
    assert [r["backend"] for r in result] == ["nccl", "nccl"] and result[0]["value"] == 3.0
    assert all(r["tensor"].device.type == "cpu" for r in result)


@pytest.mark.gpu
@needs_one
def test_cuda_in_the_kernel_does_not_break_ranks():
    """After the notebook itself initialised CUDA, do ranks still start (they are not forks of it)?"""
    torch.zeros(1, device="cuda")  # CUDA is now initialised in this process
    result = launch(lambda rank, ws: torch.cuda.is_available() and torch.zeros(1, device="cuda").item(), 1, output="quiet")
    assert result == [0.0]


@pytest.mark.gpu
@needs_two
def test_persistent_ranks_on_nccl():
    """Do persistent ranks run on nccl with CUDA tensors kept on each rank's GPU between requests?"""
    with Cluster(2, output="quiet", view="text") as cluster:
        cluster.exec("x = torch.ones(4, device='cuda') * (rank + 1); dist.all_reduce(x)")
        assert [v.tolist() for v in cluster.pull("x")] == [[3.0] * 4] * 2
        assert cluster.exec("x.device.index") == [0, 1]


def _cuda_pipelined_ring(rank, world_size):
    import torch

    from helpers.ring import pipelined_ring_allreduce

    t = torch.ones(1000, device="cuda")
    try:
        pipelined_ring_allreduce(t)
    except ValueError as err:
        return str(err)
    return None


@pytest.mark.gpu
@needs_two
def test_pipelined_ring_refuses_cuda_tensors_with_the_reason():
    """On nccl, does lesson 8's ring (written for gloo's tags) refuse a CUDA tensor at once, saying why and what to do,
    instead of risking a deadlock?"""
    for message in launch(_cuda_pipelined_ring, 2, output="quiet"):
        assert message and "cuda:" in message and "nccl ignores tags" in message and "backend='gloo'" in message


@pytest.mark.gpu
@needs_one
def test_lesson_12_gpu_route_measures_a_step_beside_the_plan():
    """Does lesson 12's GPU route train the model on the GPU (the loss falls from ln V), and do the plan's memory and the
    cost model's step land near the measurement (the plan counts what is kept, the model matrix products only)?"""
    import math

    from autograder.answers.lesson12 import plan_memory, plan_traffic
    from helpers.plan import Cluster as Machine, Layout, Link, Model
    from helpers.planrun import on_gpu
    from helpers.steptime import predict

    model = Model("gpu", vocab=32000, hidden=1024, layers=8, heads=16, kv_heads=4, ffn=2816, seq=2048, batch=4)
    got = on_gpu(model, steps=4)
    assert got["loss"] < math.log(model.vocab) + 1 and got["seconds"] > 0 and got["flops"] > 1e12
    gpu = Machine(got["gpu"], 1, 1, torch.cuda.get_device_properties(0).total_memory, got["flops"], Link("-", 0, 1),
                  Link("-", 0, 1))
    p = predict(model, Layout(precision="fp32", micro_batch=model.batch), gpu, plan_memory, plan_traffic, flops=got["flops"])
    planned = sum(p.memory[0].values())
    assert 0.8 < got["peak"] / planned < 2.0, (got["peak"], planned)
    assert 1.0 <= got["seconds"] / p.step < 5.0, (got["seconds"], p.step)
