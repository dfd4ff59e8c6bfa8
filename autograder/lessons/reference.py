"""Instructor reference implementations, used by the benchmarks and to check the graders.

Learners write their own versions in the notebooks; these are the answers the hidden
tests are validated against. It never ships to learners and the grading sandbox hides it.
How to use it::

    from autograder.lessons.reference import ring_allreduce
    helpers.launch(lambda rank, ws: ring_allreduce(torch.ones(10)), 4)

Lesson 11's answers are in :mod:`autograder.lessons.reference_attention`, hidden the same way.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# The bucket rule and lesson 4's split into chunks are exercises' statements, not answers: learners get them too.
from autograder.lessons.ringcheck import chunk_bounds
from autograder.lessons.lesson06 import bucket_layout

__all__ = ["chunk_bounds", "ring_chunks", "ring_reduce_scatter", "ring_all_gather", "ring_allreduce",
           "hierarchical_all_reduce", "average_gradients", "train", "PerParameterDDP", "MiniDDP", "bucket_layout",
           "ShardedOptimizer", "TensorParallelMLP", "gpipe_step", "one_f_one_b_step", "interleaved_step"]


def ring_chunks(phase: str, step: int, rank: int, world_size: int) -> tuple[int, int]:
    """Exercise 4.1: ``(chunk sent right, chunk received from the left)`` at ``step`` of ``phase``.

    The ring's schedule in which rank r ends the reduce-scatter owning chunk r, as
    ``dist.reduce_scatter`` leaves item r on rank r, and starts the all-gather by sending it.
    In both phases a rank receives the chunk just below the one it sends, and at the next
    step sends what it has just received.

    >>> [ring_chunks("reduce-scatter", s, 0, 4) for s in range(3)]
    [(3, 2), (2, 1), (1, 0)]
    >>> [ring_chunks("all-gather", s, 0, 4) for s in range(3)]
    [(0, 3), (3, 2), (2, 1)]
    """
    if phase == "reduce-scatter":
        send = (rank - step - 1) % world_size
    elif phase == "all-gather":
        send = (rank - step) % world_size
    else:
        raise ValueError(f"phase is 'reduce-scatter' or 'all-gather', not {phase!r}")
    return send, (send - 1) % world_size


def _ring_pass(flat: torch.Tensor, phase: str, add: bool) -> None:
    """The p-1 steps of one phase on the flat view ``flat``: send right, receive from the left.

    Each step posts its send with ``isend`` before it receives, so the calls always pair up.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % p, (rank - 1) % p
    bounds = chunk_bounds(flat.numel(), p)
    buffer = torch.empty(bounds[0][1] - bounds[0][0], dtype=flat.dtype)
    for step in range(p - 1):
        send_chunk, recv_chunk = ring_chunks(phase, step, rank, p)
        s0, s1 = bounds[send_chunk]
        r0, r1 = bounds[recv_chunk]
        incoming = buffer[: r1 - r0]
        request = dist.isend(flat[s0:s1], right)  # the send is posted, so every rank reaches its recv
        dist.recv(incoming, left)
        request.wait()
        if add:
            flat[r0:r1] += incoming
        else:
            flat[r0:r1] = incoming


def ring_reduce_scatter(tensor: torch.Tensor) -> torch.Tensor:
    """Exercise 4.2: chunk ``rank`` of ``tensor`` (flattened) becomes its sum over all ranks, in place (p-1 messages)."""
    _ring_pass(tensor.view(-1), "reduce-scatter", add=True)
    return tensor


def ring_all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Exercise 4.3: every rank's chunk ``rank`` is copied into chunk ``rank`` on every rank, in place (p-1 messages)."""
    _ring_pass(tensor.view(-1), "all-gather", add=False)
    return tensor


def ring_allreduce(tensor: torch.Tensor) -> torch.Tensor:
    """Exercise 4.4: sum ``tensor`` in place over all ranks with a bandwidth-optimal ring.

    Reduce-scatter (p-1 steps: rank r then owns the full sum of chunk r), then all-gather
    (p-1 steps): each rank sends 2(p-1) messages of at most ceil(n/p) elements.
    """
    ring_reduce_scatter(tensor)
    ring_all_gather(tensor)
    return tensor


def hierarchical_all_reduce(tensor: torch.Tensor, ranks_per_node: int) -> torch.Tensor:
    """Exercise 3.3: sum ``tensor`` in place over all ranks, node by node, with collectives on subgroups.

    Nodes are blocks of ``ranks_per_node`` consecutive ranks, led by their lowest rank. Reduce within each node to
    its leader, all-reduce among the leaders, broadcast within each node. Every rank creates every group, in order.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    m = ranks_per_node
    nodes = [dist.new_group(list(range(first, first + m))) for first in range(0, world_size, m)]
    leaders = dist.new_group(list(range(0, world_size, m)))
    node, leader = nodes[rank // m], rank - rank % m
    dist.reduce(tensor, dst=leader, group=node)
    if rank == leader:
        dist.all_reduce(tensor, group=leaders)
    dist.broadcast(tensor, src=leader, group=node)
    return tensor


def average_gradients(model: torch.nn.Module) -> None:
    """Exercise 5.1: every parameter's ``.grad`` becomes its mean over all ranks, in place.

    Frozen parameters, and those with no gradient on any rank, are left alone; a gradient on some ranks only counts
    as zero on the others. One small all-reduce first makes the ranks agree on which to reduce (the same calls).
    """
    world_size = dist.get_world_size()
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        return
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=params[0].device)
    dist.all_reduce(present)
    for p, ranks_with_grad in zip(params, present.tolist()):
        if ranks_with_grad == 0:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad /= world_size


def train(rank: int, world_size: int, dataset, model: torch.nn.Module, epochs: int, batch_size: int,
          lr: float) -> list[float]:
    """Exercise 5.2: data-parallel SGD on this rank's shard; returns this rank's loss at each step."""
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            loss = F.cross_entropy(model(inputs), labels)
            opt.zero_grad()
            loss.backward()
            average_gradients(model)
            opt.step()
            losses.append(loss.item())
    return losses


def _broadcast_state(module: torch.nn.Module) -> None:
    """Every parameter and buffer takes rank 0's value (6.1 and 6.2 start this way)."""
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor, src=0)


class PerParameterDDP(torch.nn.Module):
    """Exercise 6.1: each gradient's asynchronous all-reduce starts from its parameter's hook."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module
        _broadcast_state(module)
        self._works: list[tuple[torch.Tensor, object]] = []
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._gradient_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _gradient_ready(self, param: torch.Tensor) -> None:
        self._works.append((param, dist.all_reduce(param.grad, async_op=True)))

    def finish_gradient_synchronization(self) -> None:
        """Wait for every all-reduce of this step; each ``.grad`` becomes the mean over the ranks."""
        for param, work in self._works:
            work.wait()
            param.grad /= dist.get_world_size()
        self._works = []


class MiniDDP(torch.nn.Module):
    """Exercise 6.2: data parallelism that reduces gradients in buckets while backward runs.

    At construction every parameter and buffer takes rank 0's value. A bucket's asynchronous all-reduce starts when
    its last gradient is ready; ``finish_gradient_synchronization`` starts any bucket still waiting (a missing
    gradient counts as zero), waits for all and writes each mean back into ``.grad``. A parameter whose gradient never
    came keeps ``.grad`` None, as DDP leaves a parameter no rank used, so an optimizer skips it.
    """

    def __init__(self, module: torch.nn.Module, bucket_size_mb: float = 25.0) -> None:
        super().__init__()
        self.module = module
        _broadcast_state(module)
        params = [p for p in module.parameters() if p.requires_grad]
        layout = bucket_layout([p.numel() * p.element_size() for p in params], bucket_size_mb)
        self.buckets = [[params[i] for i in bucket] for bucket in layout]
        self._bucket_of = {id(p): b for b, bucket in enumerate(self.buckets) for p in bucket}
        self._ready = [0] * len(self.buckets)
        self._started: list[tuple[int, torch.Tensor, object]] = []
        for p in params:
            p.register_post_accumulate_grad_hook(self._gradient_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _gradient_ready(self, param: torch.Tensor) -> None:
        b = self._bucket_of[id(param)]
        self._ready[b] += 1
        if self._ready[b] == len(self.buckets[b]):
            self._start(b)

    def _start(self, b: int) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[b]]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._started.append((b, flat, dist.all_reduce(flat, async_op=True)))
        self._ready[b] = -1  # started: later hooks in this step must not start it again

    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket's all-reduce; each ``.grad`` becomes the mean over the ranks."""
        for b in range(len(self.buckets)):
            if self._ready[b] != -1:
                self._start(b)  # a parameter without a gradient kept this bucket from starting
        world_size = dist.get_world_size()
        for b, flat, work in self._started:
            work.wait()
            flat /= world_size
            offset = 0
            for p in self.buckets[b]:
                if p.grad is not None:  # one that never came stays None: no rank used it (the same on every rank)
                    p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self._started = []
        self._ready = [0] * len(self.buckets)


# -- lesson 09 -----------------------------------------------------------------------------


class ShardedOptimizer:
    """Exercise 9.1: ZeRO-1. Each rank keeps optimizer state for its 1/p slice of the flattened trainable parameters.

    ``step()`` reduce-scatters the padded flat gradients (each rank receives its slice's mean), steps the slice, and
    all-gathers the updated slices into every rank's parameters. The slice is one piece per parameter in it (and one
    for the padding), so a piece whose parameter got no gradient gets none and is left as torch's optimizers leave such
    a parameter. Every rank must see the same parameters without a gradient, as FSDP2 also assumes.
    """

    def __init__(self, params, optimizer_cls, **kwargs) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.shard = -(-self.numel // self.world_size)
        flat = self._flatten([p.detach() for p in self.params])
        start, end = self.rank * self.shard, (self.rank + 1) * self.shard
        self.pieces, offset = [], 0  # (parameter, or None for the padding; this rank's piece of it)
        for p in self.params + [None]:  # None: the padding after the last parameter
            size = p.numel() if p is not None else self.shard * self.world_size - self.numel
            lo, hi = max(offset, start), min(offset + size, end)
            if lo < hi:
                self.pieces.append((p, torch.nn.Parameter(flat[lo:hi].clone())))
            offset += size
        self.optimizer = optimizer_cls([piece for _, piece in self.pieces], **kwargs)

    def _flatten(self, tensors) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.nn.functional.pad(flat, (0, self.shard * self.world_size - self.numel))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        grads = self._flatten([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])
        mean = torch.empty(self.shard, dtype=grads.dtype)
        (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(mean, grads)
        offset = 0
        for p, piece in self.pieces:
            has_grad = p is not None and p.grad is not None
            piece.grad = mean[offset:offset + piece.numel()] / self.world_size if has_grad else None
            offset += piece.numel()
        self.optimizer.step()
        flat = torch.empty_like(grads)
        (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(
            flat, torch.cat([piece.detach() for _, piece in self.pieces]))
        offset = 0
        for p in self.params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


# -- lesson 10 -----------------------------------------------------------------------------


class _CopyToTensorParallel(torch.autograd.Function):
    """f: the identity forward; backward sums the input's gradient over the ranks."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class _ReduceFromTensorParallel(torch.autograd.Function):
    """g: forward sums the ranks' partial outputs; backward is the identity."""

    @staticmethod
    def forward(ctx, partial):
        total = partial.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad


class TensorParallelMLP(torch.nn.Module):
    """Exercise 10.1: ``fc2(gelu(fc1(x)))``, fc1 split by output features (rows r*k:(r+1)*k, k = hidden / p), fc2 by
    input features (the same columns), fc2's bias whole, added once; one all-reduce forward (g), one backward (f)."""

    def __init__(self, fc1: torch.nn.Linear, fc2: torch.nn.Linear) -> None:
        super().__init__()
        rank, world_size = dist.get_rank(), dist.get_world_size()
        k = fc1.out_features // world_size
        mine = slice(rank * k, (rank + 1) * k)
        def shard(param, part):  # a frozen weight's shard stays frozen: torch leaves its .grad None
            return torch.nn.Parameter(param.detach()[part].clone(), requires_grad=param.requires_grad)
        self.w1, self.b1 = shard(fc1.weight, mine), shard(fc1.bias, mine)
        self.w2, self.b2 = shard(fc2.weight, (slice(None), mine)), shard(fc2.bias, slice(None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _CopyToTensorParallel.apply(x)
        h = torch.nn.functional.gelu(torch.nn.functional.linear(x, self.w1, self.b1))
        return _ReduceFromTensorParallel.apply(torch.nn.functional.linear(h, self.w2)) + self.b2


def _pipeline_forward(stage, i: int, microbatch, requests: list) -> None:
    inputs, targets = microbatch
    x = inputs if stage.is_first else torch.empty(stage.input_shape)
    if not stage.is_first:
        dist.recv(x, src=stage.prev_rank)
    y = stage.forward(i, x, targets if stage.is_last else None)
    if not stage.is_last:
        requests.append((dist.isend(y, dst=stage.next_rank), y))


def _pipeline_backward(stage, i: int, m: int, requests: list) -> None:
    grad = 1.0 / m if stage.is_last else torch.empty(stage.output_shape)  # the step's loss: the mean of m losses
    if not stage.is_last:
        dist.recv(grad, src=stage.next_rank)
    g = stage.backward(i, grad)
    if not stage.is_first:
        requests.append((dist.isend(g, dst=stage.prev_rank), g))


def gpipe_step(stage, microbatches) -> None:
    """Exercise 10.2: every micro-batch forward through the stages, then every one backward."""
    interleaved_step([stage], microbatches)


def one_f_one_b_step(stage, microbatches) -> None:
    """Exercise 10.3: p - s - 1 forwards to fill the pipeline, then one forward and one backward in turn."""
    m, requests = len(microbatches), []
    warmup = min(stage.num_stages - stage.rank - 1, m)
    for i in range(warmup):
        _pipeline_forward(stage, i, microbatches[i], requests)
    for i in range(m - warmup):
        _pipeline_forward(stage, warmup + i, microbatches[warmup + i], requests)
        _pipeline_backward(stage, i, m, requests)
    for i in range(m - warmup, m):
        _pipeline_backward(stage, i, m, requests)
    for request, _ in requests:
        request.wait()


def interleaved_step(stages, microbatches) -> None:
    """Exercise 10.4 (one chunk: 10.2's GPipe): all forwards through chunk 0, then chunk 1, ...; backwards reversed."""
    m, requests = len(microbatches), []
    for stage in stages:
        for i, microbatch in enumerate(microbatches):
            _pipeline_forward(stage, i, microbatch, requests)
    for stage in reversed(stages):
        for i in range(m):
            _pipeline_backward(stage, i, m, requests)
    for request, _ in requests:
        request.wait()
