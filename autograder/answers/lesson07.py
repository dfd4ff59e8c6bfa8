"""Lesson 07's answer: Exercise 7.2, a training script's ``main`` that survives a lost process (never shipped).

The same code is the solution cell ``ex7_2-resilient-main`` of lesson 07; the tests grade it, and
variants of it with one mistake each, under real torchrun agents.
"""

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from autograder.lessons.faults import CKPT_DIR, CKPT_EVERY, FINAL, GLOBAL_BATCH, LR, MOMENTUM, STEPS, make_dataset, make_dropout_model

__all__ = ["resilient_main"]


def resilient_main():
    """Train STEPS steps with DDP, checkpoint every CKPT_EVERY steps with DCP, resume from the newest complete one."""
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dataset = make_dataset()
    x_all, y_all = dataset.tensors
    per_rank = GLOBAL_BATCH // world_size               # the global batch stays GLOBAL_BATCH on any world size
    steps_per_epoch = len(dataset) // GLOBAL_BATCH
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    model = DDP(make_dropout_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    # Resume from the newest *complete* checkpoint: DCP writes .metadata last, after every rank's data.
    done = sorted(d for d in os.listdir(CKPT_DIR) if os.path.exists(os.path.join(CKPT_DIR, d, ".metadata"))) \
        if os.path.isdir(CKPT_DIR) else []
    start = 0
    if done:
        model_state, opt_state = get_state_dict(model, opt)
        state = {"model": model_state, "optim": opt_state, "step": 0, "rng": torch.get_rng_state()}
        dcp.load(state, checkpoint_id=os.path.join(CKPT_DIR, done[-1]))   # resharded to this world size
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        torch.set_rng_state(state["rng"])               # on every rank: the dropout masks go on as before
        start = state["step"]

    for step in range(start, STEPS):
        epoch, position = divmod(step, steps_per_epoch)  # the sampler's epoch and position come from the step
        sampler.set_epoch(epoch)
        order = list(sampler)[position * per_rank:(position + 1) * per_rank]
        opt.zero_grad()
        F.cross_entropy(model(x_all[order]), y_all[order]).backward()
        opt.step()
        if (step + 1) % CKPT_EVERY == 0:
            model_state, opt_state = get_state_dict(model, opt)
            state = {"model": model_state, "optim": opt_state, "step": step + 1, "rng": torch.get_rng_state()}
            # A new folder per checkpoint: a save killed halfway never touches the previous one.
            dcp.save(state, checkpoint_id=os.path.join(CKPT_DIR, f"step-{step + 1:06d}"))

    if rank == 0:
        model.eval()
        with torch.no_grad():
            print(f"final loss {F.cross_entropy(model(x_all), y_all).item():.6f}")
        torch.save({"model": model.module.state_dict()}, FINAL)
    dist.barrier()                                      # nobody leaves before the final weights exist
    dist.destroy_process_group()
