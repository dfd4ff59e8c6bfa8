"""Bus bandwidth of gloo's all_reduce against the reference ring and the pipelined ring.

Run: ``make bench-ring`` or ``.venv/bin/python bench/ring_bench.py [--sizes 4M,16M,64M] [--world-sizes 4,2]
[--repeats N] [--piece BYTES] [--json PATH]``

Lesson 8 asks how close a ring written in Python with point-to-point calls can come to
gloo's own ``all_reduce``. Three all-reduces are timed inside the same ranks, in shuffled
order at every repetition, so that the machine's noise falls on all three alike:

- ``gloo``: ``dist.all_reduce``;
- ``ring``: the instructor's reference ring (``autograder/reference.py``, Exercise 4.4),
  which receives a whole chunk, adds it, then sends it on;
- ``pipelined``: ``helpers.ring.pipelined_ring_allreduce`` (the one lesson 8 shows), each
  chunk cut into pieces of ``--piece`` bytes so that sending the next piece overlaps
  adding this one.

Each time is the slowest rank's (one all-reduce of the time taken on every rank, with
MAX); the median over the repetitions is reported, as bus bandwidth, algbw x 2(p-1)/p.
For every size it prints each ring's ratio to gloo and PASS/FAIL against the lesson's
target: the pipelined ring within 20% of gloo (ratio at least 0.8) from 4 MB to 64 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import machine_line  # noqa: E402

from helpers import launch  # noqa: E402

KINDS = ("gloo", "ring", "pipelined")
TARGET = 0.8  # the pipelined ring's bus bandwidth over gloo's, at every size


def parse_size(text: str) -> int:
    """``"4M"`` -> 4194304, ``"512K"`` -> 524288, ``"4"`` -> 4 (bytes; K and M are powers of 2).

    >>> [parse_size(s) for s in ("4", "1K", "64M")]
    [4, 1024, 67108864]
    """
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def size_label(nbytes: int) -> str:
    """4194304 -> ``"4 MB"``, 1024 -> ``"1 KB"``, 4 -> ``"4 B"``."""
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def _time_kinds(rank: int, world_size: int, sizes: list[int], repeats: int, piece: int, seed: int) -> dict:
    """On every rank: median seconds of each all-reduce kind at each size (slowest rank per call)."""
    import random
    import time

    import torch
    import torch.distributed as dist
    from autograder.reference import ring_allreduce

    from helpers.ring import pipelined_ring_allreduce

    run = {
        "gloo": lambda t: dist.all_reduce(t),
        "ring": ring_allreduce,
        "pipelined": lambda t: pipelined_ring_allreduce(t, piece),
    }
    order = random.Random(seed)  # the same seed on every rank: all ranks switch together
    out: dict = {}
    for n in sizes:
        t = torch.ones(max(1, n // 4), dtype=torch.float32)
        times: dict[str, list[float]] = {k: [] for k in KINDS}
        for i in range(repeats + 1):
            kinds = list(KINDS)
            order.shuffle(kinds)
            for kind in kinds:
                t.fill_(1.0)
                dist.barrier()
                start = time.perf_counter()
                run[kind](t)
                elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if i:  # the first round warms the connections up
                    times[kind].append(elapsed.item())
                if t[0].item() != world_size or t[-1].item() != world_size:
                    raise RuntimeError(f"{kind} gave a wrong sum at {n} bytes: {t[0].item()}, {t[-1].item()}")
        out[str(n)] = {k: statistics.median(v) for k, v in times.items()}
    return out


def busbw(nbytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in bytes/s: nbytes / seconds x 2(p-1)/p."""
    return nbytes / seconds * 2 * (world_size - 1) / world_size


def measure(world_size: int, sizes: list[int], repeats: int, piece: int) -> dict:
    """Seconds per kind per size on ``world_size`` fresh ranks."""
    result = launch(_time_kinds, world_size, (sizes, repeats, piece, 1234), output="quiet", timeout=900)
    return result[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4M,16M,64M", help="tensor sizes in bytes, K/M suffixes (default 4M,16M,64M)")
    parser.add_argument("--world-sizes", default="4,2", help="numbers of ranks (default 4,2)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per kind and size (default 5)")
    parser.add_argument("--piece", default="1M", help="the pipelined ring's piece size in bytes (default 1M)")
    parser.add_argument("--json", help="write the numbers to this file")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    worlds = [int(w) for w in args.world_sizes.split(",")]
    piece = parse_size(args.piece)
    print(f"Machine: {machine_line()}")
    print(f"All-reduce of float32 tensors, median of {args.repeats} calls per kind (kinds interleaved), "
          f"slowest rank per call; pipelined pieces of {size_label(piece)}\n")
    report: dict = {"machine": machine_line(), "piece": piece, "repeats": args.repeats, "target": TARGET, "results": []}
    ok = True
    for world in worlds:
        seconds = measure(world, sizes, args.repeats, piece)
        print(f"{world} ranks: bus bandwidth (GB/s) and ratio to gloo")
        print(f"{'size':>7} {'gloo':>8} {'ring':>8} {'pipelined':>10} {'ring/gloo':>10} {'pipe/gloo':>10}  target")
        for n in sizes:
            row = seconds[str(n)]
            bw = {k: busbw(n, row[k], world) for k in KINDS}
            ratio = {k: bw[k] / bw["gloo"] for k in ("ring", "pipelined")}
            passed = ratio["pipelined"] >= TARGET
            ok &= passed
            print(f"{size_label(n):>7} {bw['gloo'] / 1e9:>8.3f} {bw['ring'] / 1e9:>8.3f} {bw['pipelined'] / 1e9:>10.3f} "
                  f"{ratio['ring']:>9.2f}x {ratio['pipelined']:>9.2f}x  {'PASS' if passed else 'FAIL'}")
            report["results"].append({"world_size": world, "size": n, "seconds": row, "busbw": bw, "ratio": ratio,
                                      "passed": passed})
        print()
    print(f"{'PASS' if ok else 'FAIL'}: pipelined ring within {round((1 - TARGET) * 100)}% of gloo's bus bandwidth "
          f"at every size and world size")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
