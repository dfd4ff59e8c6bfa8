"""What a checkpoint costs the training: DCP's synchronous save against ``async_save``, on CPU ranks.

Run: ``.venv/bin/python bench/checkpoint_bench.py [--ranks 2] [--mib 64] [--repeats 5]``

Each of ``--ranks`` processes (``helpers.launch``, gloo) holds a DDP-replicated model of about
``--mib`` MiB of float32 weights plus SGD's momentum (twice that in all), and saves it with
``torch.distributed.checkpoint`` ``--repeats`` times each way, into a fresh folder every time:

- ``dcp.save``: the training is blocked for the whole write;
- ``dcp.async_save`` (torch 2.3 on): blocked only until the state is copied aside, the write goes on
  in the background; the time to its future's end is printed too.

It prints the median of each, the ratio, and what Young's interval (sqrt(2 delta M)) and the share of
time lost at it would be for a job with that checkpoint time and 1, 10 and 100 failures a day.
Figures travel as ratios from one run; the absolute times are this machine's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import machine_line  # noqa: E402


def saver(rank, world_size, folder, mib, repeats):
    import os
    import time

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.nn as nn
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.nn.parallel import DistributedDataParallel as DDP

    width = int((mib * 2**20 / 4 / 4) ** 0.5)           # four square layers of `mib` MiB in all
    torch.manual_seed(0)
    model = DDP(nn.Sequential(*[nn.Linear(width, width, bias=False) for _ in range(4)]))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    times = {"sync": [], "async blocked": [], "async written": []}
    for i in range(repeats):
        model_state, opt_state = get_state_dict(model, opt)
        dist.barrier()
        began = time.perf_counter()
        dcp.save({"model": model_state, "optim": opt_state}, checkpoint_id=os.path.join(folder, f"sync-{i}"))
        times["sync"].append(time.perf_counter() - began)
        if hasattr(dcp, "async_save"):
            dist.barrier()
            began = time.perf_counter()
            future = dcp.async_save({"model": model_state, "optim": opt_state},
                                    checkpoint_id=os.path.join(folder, f"async-{i}"))
            times["async blocked"].append(time.perf_counter() - began)
            future.result()
            times["async written"].append(time.perf_counter() - began)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--mib", type=float, default=64.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from helpers import launch

    with tempfile.TemporaryDirectory() as folder:
        results = launch(saver, args.ranks, args=(folder, args.mib, args.repeats), timeout=600, output="quiet")
    print(f"DCP checkpoint of a {args.mib:g} MiB model + SGD momentum on {args.ranks} CPU ranks (gloo), "
          f"median of {args.repeats}; machine: {machine_line()}")
    medians = {kind: statistics.median(t for r in results for t in r[kind]) for kind in results[0] if results[0][kind]}
    for kind, seconds in medians.items():
        print(f"  {kind:14s} {seconds * 1000:8.1f} ms")
    if "async blocked" in medians:
        print(f"  async_save blocks the training {medians['async blocked'] / medians['sync']:.2f}x as long as dcp.save")
    delta = medians.get("async blocked", medians["sync"])
    for per_day in (1, 10, 100):
        mtbf = 86400 / per_day
        for name, d in (("sync", medians["sync"]), ("async", delta)):
            tau = (2 * d * mtbf) ** 0.5
            print(f"  {per_day:3d} failures a day, {name:5s}: Young's interval {tau:7.1f} s, "
                  f"{100 * (2 * d / mtbf) ** 0.5:.3f}% of the time lost to checkpoints and lost work")
    return 0


if __name__ == "__main__":
    sys.exit(main())
