"""DistributedDataParallel's communication, which its reducer does from C++, as the helpers show it."""

from __future__ import annotations

import pytest

from helpers import LaunchTimeoutError, launch


def ddp_steps(rank, world_size, bucket_cap_mb, steps, hook):
    import torch
    import torch.nn as nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(*[nn.Linear(256, 256) for _ in range(3)]), bucket_cap_mb=bucket_cap_mb)
    if hook:
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    for _ in range(steps):
        model(torch.randn(4, 256, generator=torch.Generator().manual_seed(rank))).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_each_ddp_bucket_is_a_traced_all_reduce_with_its_note():
    """Does every DDP bucket show as an all_reduce noted "DDP bucket i", and are the gradients still the mean?"""
    import torch

    layer = (256 * 256 + 256) * 4
    result = launch(ddp_steps, 2, args=(0.2, 2, False), trace=True, output="quiet")
    for rank in range(2):
        calls = [e for e in result.trace.for_rank(rank) if e.op == "all_reduce"]
        # Step 1: DDP's first guess is one bucket; step 2: rebuilt, one bucket per layer.
        assert [e.nbytes for e in calls] == [3 * layer] + [layer] * 3, [e.nbytes for e in calls]
        assert [e.note for e in calls] == ["DDP bucket 0", "DDP bucket 0", "DDP bucket 1", "DDP bucket 2"]
        assert all(e.waited is not None and e.waited >= e.end for e in calls)
    assert all(torch.equal(a, b) for a, b in zip(result[0], result[1]))  # every rank holds the same mean
    torch.manual_seed(0)
    single = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(3)])
    for _ in range(2):  # the two steps accumulate, as in ddp_steps (no zero_grad)
        for rank in range(2):
            (single(torch.randn(4, 256, generator=torch.Generator().manual_seed(rank))).sum() / 2).backward()
    assert all(torch.allclose(a, p.grad, atol=1e-5) for a, p in zip(result[0], single.parameters()))


def test_a_programs_own_comm_hook_is_kept_and_noted():
    """Does a registered fp16 compression hook run (half the bytes) with its all-reduce noted as the bucket's?"""
    result = launch(ddp_steps, 2, args=(25, 1, True), trace=True, output="quiet")
    calls = [e for e in result.trace.for_rank(0) if e.op == "all_reduce"]
    assert len(calls) == 1
    assert calls[0].dtype == "float16" and calls[0].nbytes == 3 * (256 * 256 + 256) * 2
    assert calls[0].note == "DDP bucket 0"


def uneven(rank, world_size, use_join):
    import torch
    import torch.nn as nn
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(8, 2))
    batches = 3 if rank == 0 else 2
    if use_join:
        with Join([model]):
            for _ in range(batches):
                model(torch.randn(4, 8)).sum().backward()
    else:
        for _ in range(batches):
            model(torch.randn(4, 8)).sum().backward()
    return batches


def test_a_rank_stuck_at_the_end_of_ddp_backward_is_named():
    """Does the hang report say the rank with an extra batch waits in DDP's all_reduce, at the backward line?"""
    with pytest.raises(LaunchTimeoutError) as info:
        launch(uneven, 2, args=(False,), timeout=4, output="quiet")
    text = str(info.value)
    assert "rank 0 waits in wait() on all_reduce" in text, text
    assert ".backward()" in text, text
    assert "rank 1 never reached all_reduce: it already returned" in text, text


def test_join_works_with_the_traced_ddp():
    """Does DDP's Join, which hands torch's own requests to C++, still work under the helpers' wrappers?"""
    assert list(launch(uneven, 2, args=(True,), trace=True, output="quiet")) == [3, 2]


def lone_last_step(rank, world_size, divide_by_initial_world_size):
    import torch
    import torch.nn as nn
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(1, 1, bias=False))
    grads = []
    with Join([model], divide_by_initial_world_size=divide_by_initial_world_size):
        for _ in range(2 if rank == 0 else 1):
            model.zero_grad()
            model(torch.ones(1, 1)).sum().backward()
            grads.append(model.module.weight.grad.item())
    return grads


def test_join_divides_a_lone_step_as_ddp_itself_does():
    """Does rank 0's lone last step under Join give DDP's own division (by 2 by default, by 1 with
    divide_by_initial_world_size=False), which a communication hook such as the helpers' would override?"""
    assert launch(lone_last_step, 2, args=(True,), output="quiet")[0] == [1.0, 0.5]
    assert launch(lone_last_step, 2, args=(False,), output="quiet")[0] == [1.0, 1.0]


def construct_on_rank_0_only(rank, world_size):
    import time

    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel

    if rank == 0:
        DistributedDataParallel(nn.Linear(4, 4))
    else:
        time.sleep(30)


def test_a_rank_left_alone_in_ddps_constructor_is_named():
    """Does the hang report name DDP's constructor, a collective, when another rank never builds its DDP?"""
    with pytest.raises(LaunchTimeoutError) as info:
        launch(construct_on_rank_0_only, 2, timeout=3, output="quiet")
    text = str(info.value)
    assert "rank 0 waits in DistributedDataParallel" in text, text
    assert "rank 1 never reached DistributedDataParallel" in text, text
