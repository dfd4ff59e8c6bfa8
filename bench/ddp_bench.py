"""Time per training step: gradients averaged after backward, MiniDDP, and torch's DDP.

Run: ``make bench-ddp`` or ``.venv/bin/python bench/ddp_bench.py [--steps 30] [--rounds 3] [--json PATH]``

Lesson 06's section 10, with the instructor's MiniDDP (autograder/answers/): the same
model (8 Linear layers of 512x512, 8 MB of gradients), batch 128 per rank, 2 ranks on gloo,
one thread per rank. Four ways, taking turns round after round so that a busy moment of
the machine hits them alike; each way's figure is the best round's median step of the
slower rank:

- ``no communication``: the compute alone, no gradient is averaged;
- ``after backward``: lesson 05's averaging, one all-reduce per parameter after backward;
- ``MiniDDP`` and ``DDP``: 1 MB buckets, all-reduced while backward runs.

It prints each way's step time, the communication left on top of the compute, and the
share of the communication that the bucketed wrappers hide behind backward.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import machine, machine_line  # noqa: E402

WAYS = ("no communication", "after backward", "MiniDDP", "DDP")


def time_steps(rank: int, world_size: int, how: str, steps: int) -> float:
    """The median time of ``steps`` training steps done ``how`` (after three warm-up steps)."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel

    from autograder.answers.lesson05 import average_gradients
    from autograder.answers.lesson06 import MiniDDP

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(512, 512), nn.Tanh())])
    if how == "MiniDDP":
        wrapped = MiniDDP(model, bucket_size_mb=1.0)
    elif how == "DDP":
        wrapped = DistributedDataParallel(model, bucket_cap_mb=1.0)
    else:
        wrapped = model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 512)
    samples = []
    for _ in range(steps + 3):
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        wrapped(x).square().mean().backward()
        if how == "after backward":
            average_gradients(model)
        elif how == "MiniDDP":
            wrapped.finish_gradient_synchronization()
        opt.step()
        samples.append(time.perf_counter() - start)
    timed = sorted(samples[3:])
    return timed[len(timed) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per launch (default 30)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the four ways (default 3)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    from helpers import launch

    print(machine_line())
    best = {how: float("inf") for how in WAYS}
    for _ in range(args.rounds):
        for how in WAYS:
            best[how] = min(best[how], max(launch(time_steps, 2, args=(how, args.steps), output="quiet")))
    compute = best["no communication"]
    comm = best["after backward"] - compute
    hidden = {how: (1 - (best[how] - compute) / comm) if comm > 0 else None for how in ("MiniDDP", "DDP")}
    for how in WAYS:
        line = f"{how:17s} {best[how] * 1e3:7.1f} ms per step"
        if how != "no communication":
            line += f"   communication on top of the compute {(best[how] - compute) * 1e3:6.1f} ms"
        if hidden.get(how) is not None:
            line += f"   hidden behind backward {hidden[how]:.0%}"
        print(line)
    print(f"RESULT: step ms {', '.join(f'{h} {best[h] * 1e3:.1f}' for h in WAYS)}")
    if args.json:
        args.json.write_text(json.dumps({
            "machine": machine(),
            "settings": {"steps": args.steps, "rounds": args.rounds, "world_size": 2, "bucket_mb": 1.0},
            "results": {"step_s": best, "hidden": hidden},
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
