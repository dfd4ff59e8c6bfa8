"""hello, exported from a notebook by helpers.export_script.

Run: torchrun --standalone --nproc-per-node=2 hello.py
"""

import os
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 - before any process group exists: see main()



def hello(rank, world_size):
    print(f"rank {rank} of {world_size}")


def main():
    # Set by torchrun (and by torch.distributed.launch --use-env, or a SLURM wrapper).
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")  # reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    world = dist.group.WORLD
    try:
        hello(rank, world_size)
    finally:
        dist.destroy_process_group()
        # The group's last reference goes here, while Python is whole, so gloo's threads end
        # now. Kept until the interpreter's exit (torch.distributed.nn, which DDP imports,
        # keeps it in default arguments unless imported before the group exists), their end
        # aborted the process now and then.
        del world


if __name__ == "__main__":
    main()
