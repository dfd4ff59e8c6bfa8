"""Instructor reference implementations, used by the benchmarks and to check the graders.

Learners write their own versions in the notebooks; these are the answers the hidden
tests are validated against. How to use it::

    import sys; sys.path.insert(0, "autograder")
    from reference import ring_allreduce
    helpers.launch(lambda rank, ws: ring_allreduce(torch.ones(10)), 4)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["ring_allreduce", "chunk_bounds", "average_gradients", "train", "MiniDDP", "bucket_layout"]


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``world_size`` contiguous chunks of ceil(n/p) (the last ones may be short or empty)."""
    size = -(-numel // world_size)
    return [(min(i * size, numel), min((i + 1) * size, numel)) for i in range(world_size)]


def ring_allreduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` in place over all ranks with a bandwidth-optimal ring.

    Reduce-scatter (p-1 steps), then all-gather (p-1 steps): each rank sends 2(p-1)
    messages of at most ceil(n/p) elements. Sends go to the right neighbour while
    receives come from the left one; even ranks send first and odd ranks receive first,
    so the blocking calls always pair up.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return tensor
    flat = tensor.view(-1)
    bounds = chunk_bounds(flat.numel(), p)
    right, left = (rank + 1) % p, (rank - 1) % p
    buffer = torch.empty(bounds[0][1] - bounds[0][0], dtype=flat.dtype)

    def exchange(send_chunk: int, recv_chunk: int) -> torch.Tensor:
        s0, s1 = bounds[send_chunk]
        r0, r1 = bounds[recv_chunk]
        incoming = buffer[: r1 - r0]
        if rank % 2 == 0:
            dist.send(flat[s0:s1], right)
            dist.recv(incoming, left)
        else:
            dist.recv(incoming, left)
            dist.send(flat[s0:s1], right)
        return incoming

    for step in range(p - 1):  # reduce-scatter: after it, rank r owns the full sum of chunk (r+1) % p
        send_chunk, recv_chunk = (rank - step) % p, (rank - step - 1) % p
        incoming = exchange(send_chunk, recv_chunk)
        r0, r1 = bounds[recv_chunk]
        flat[r0:r1] += incoming
    for step in range(p - 1):  # all-gather: pass the finished chunks round the ring
        send_chunk, recv_chunk = (rank - step + 1) % p, (rank - step) % p
        incoming = exchange(send_chunk, recv_chunk)
        r0, r1 = bounds[recv_chunk]
        flat[r0:r1] = incoming
    return tensor


def average_gradients(model: torch.nn.Module) -> None:
    """Exercise 5.1: every parameter's ``.grad`` becomes its mean over all ranks, in place.

    Frozen parameters, and parameters with no gradient on any rank, are left alone; a
    parameter with a gradient on some ranks only counts as zero on the others. One small
    all-reduce first makes every rank agree on which parameters to reduce, so that every
    rank makes the same calls.
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


def bucket_layout(sizes_in_bytes: list[int], bucket_size_mb: float) -> list[list[int]]:
    """Exercise 6.1's bucket rule: which parameters share a bucket, as indices into ``sizes_in_bytes``.

    ``sizes_in_bytes`` are the trainable parameters' sizes in ``model.parameters()`` order.
    Walk them in reverse (the order backward produces gradients) and add each to the open
    bucket; close the bucket as soon as it holds at least ``bucket_size_mb`` MB (MB = 2**20
    bytes). A parameter larger than the cap fills a bucket by itself.

    >>> bucket_layout([400, 40, 400, 40], 400 / 2**20)
    [[3, 2], [1, 0]]
    """
    cap = bucket_size_mb * 1024 * 1024
    buckets, current, size = [], [], 0
    for index in reversed(range(len(sizes_in_bytes))):
        current.append(index)
        size += sizes_in_bytes[index]
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class MiniDDP(torch.nn.Module):
    """Exercise 6.1: data parallelism that reduces gradients in buckets while backward runs.

    At construction every parameter and buffer takes rank 0's value. During backward, a
    hook on each parameter notes its gradient as ready; when every gradient of a bucket is
    ready, the bucket's all-reduce starts, asynchronously. ``finish_gradient_synchronization``
    starts any bucket still waiting (its missing gradients count as zero), waits for every
    all-reduce and writes each parameter's mean gradient back to ``.grad``.
    """

    def __init__(self, module: torch.nn.Module, bucket_size_mb: float = 25.0) -> None:
        super().__init__()
        self.module = module
        with torch.no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor, src=0)
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
                mean = flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                if p.grad is None:
                    p.grad = mean.clone()
                else:
                    p.grad.copy_(mean)
        self._started = []
        self._ready = [0] * len(self.buckets)
