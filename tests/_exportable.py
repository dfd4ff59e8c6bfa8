"""Functions for tests/test_commands.py to export, as a notebook would define them (one module)."""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 3
X = torch.arange(12.0).reshape(6, 2)
LOCK = __import__("threading").Lock()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1)

    def forward(self, x):
        return self.lin(x)


def shard(rank, world_size):
    return X[rank::world_size]


def train(rank, world_size, lr):
    torch.manual_seed(0)
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(STEPS):
        opt.zero_grad()
        model(shard(rank, world_size)).sum().backward()
        opt.step()
    weight = model.module.lin.weight.detach().clone()
    dist.all_reduce(weight)
    line = f"rank {rank} of {world_size}, local rank {os.environ['LOCAL_RANK']}: sum of weights {weight.sum().item():.6f}"
    sys.stdout.write(line + "\n")  # one write: the two ranks share the pipe, so print's two writes could interleave


def uses_a_lock(rank, world_size):
    with LOCK:
        return rank
