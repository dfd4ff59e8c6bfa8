"""Bus bandwidth of gloo's all_reduce against lesson 4's plain ring and lesson 8's reference ring.

Run: ``make bench-ring`` or ``.venv/bin/python bench/ring_bench.py [--sizes 4M,16M,64M] [--world-sizes 4,2]
[--repeats N] [--piece BYTES] [--json PATH]``

Lesson 8 asks how close a ring written in Python with point-to-point calls can come to
gloo's own ``all_reduce``. Four all-reduces are timed inside the same ranks, each once in
every round, in orders where each follows each other equally often, so that the machine's
noise and what a call leaves behind for the next fall on all of them alike:

- ``gloo``: ``dist.all_reduce``;
- ``ring``: the plain ring, the answer to Exercise 4.4 that learners write in lesson 4
  (``autograder/answers/``), which posts each receive only when it needs the data and
  sends chunks whole: the baseline;
- ``ahead``: ``helpers.ring.pipelined_ring_allreduce(t, piece_bytes=None)``, the same
  ring with the receives of the next two steps posted early (whole chunks);
- ``pipelined``: ``helpers.ring.pipelined_ring_allreduce(t, piece_bytes=--piece)``, the
  instructor's reference ring of lesson 8: receives posted early and chunks cut into
  pieces, so that sending overlaps adding.

Each time is the slowest rank's (one all-reduce of the time taken on every rank, with
MAX). The bus bandwidth shown is the median over the rounds, algbw x 2(p-1)/p. Each
ratio is the median over the rounds of gloo's time over the ring's time in the same
round: pairing the calls of one round cancels the slow swings of a shared machine.
The lesson's target, judged on 4 ranks from 4 MB to 64 MB: the reference (pipelined) ring
within 20% of gloo (ratio at least 0.8). Other rows are shown for information.
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

from _common import loadavg, machine_line  # noqa: E402

from helpers import launch  # noqa: E402

KINDS = ("gloo", "ring", "ahead", "pipelined")
RINGS = KINDS[1:]
TARGET = 0.8  # the pipelined ring's bus bandwidth over gloo's
TARGET_WORLD = 4
TARGET_SIZES = (4 << 20, 64 << 20)  # the target holds at every size in this range, ends included


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


def judged(world_size: int, nbytes: int) -> bool:
    """Is this row one the lesson's target speaks of (4 ranks, 4 MB to 64 MB)?

    >>> judged(4, 4 << 20), judged(4, 64 << 20), judged(2, 16 << 20), judged(4, 1 << 20)
    (True, True, False, False)
    """
    return world_size == TARGET_WORLD and TARGET_SIZES[0] <= nbytes <= TARGET_SIZES[1]


def _time_kinds(rank: int, world_size: int, sizes: list[int], repeats: int, piece: int) -> dict:
    """On every rank: each kind's seconds per round at each size (the slowest rank's, per call)."""
    import time

    import torch
    import torch.distributed as dist
    from autograder.answers.lesson04 import ring_allreduce

    from helpers.ring import pipelined_ring_allreduce

    run = {
        "gloo": lambda t: dist.all_reduce(t),
        "ring": ring_allreduce,
        "ahead": lambda t: pipelined_ring_allreduce(t, piece_bytes=None),
        "pipelined": lambda t: pipelined_ring_allreduce(t, piece_bytes=piece),
    }
    orders = balanced_orders(KINDS)
    out: dict = {}
    for n in sizes:
        t = torch.ones(max(1, n // 4), dtype=torch.float32)
        calls = batch_calls(n)
        times: dict[str, list[float]] = {k: [] for k in KINDS}
        for i in range(repeats + 1):
            # Round 0 warms up; then the orders take turns, so that every kind follows every other equally often.
            for kind in orders[(i - 1) % len(orders)]:
                t.fill_(1.0)
                dist.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    run[kind](t)
                elapsed = torch.tensor([(time.perf_counter() - start) / calls], dtype=torch.float64)
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                if i:  # the first round warms the connections and buffers up
                    times[kind].append(elapsed.item())
                expected = float(world_size) ** calls  # each call multiplies the ones by p: exact in float32
                if t[0].item() != expected or t[-1].item() != expected:
                    raise RuntimeError(f"{kind} gave a wrong sum at {n} bytes after {calls} calls: "
                                       f"{t[0].item()}, {t[-1].item()} instead of {expected}")
        out[str(n)] = times
    return out


def balanced_orders(kinds: tuple[str, ...]) -> list[list[str]]:
    """Orders for the rounds in which every kind directly follows every other kind exactly once (a Williams square).

    A call runs a little faster or slower depending on what ran just before it (how far
    apart the ranks left it, what it left in the caches); in a fixed or seeded order that
    bias falls on some kinds more than others. Over these orders it falls on all alike.
    For an even number of kinds.

    >>> for order in balanced_orders(("a", "b", "c", "d")):
    ...     print(" ".join(order))
    a b d c
    b c a d
    c d b a
    d a c b
    """
    n = len(kinds)
    first = [0]
    for k in range(1, n):
        first.append((k + 1) // 2 if k % 2 else n - k // 2)
    return [[kinds[(i + r) % n] for i in first] for r in range(n)]


def batch_calls(nbytes: int) -> int:
    """How many calls back to back make one timed sample: about 32 MB moved, 1 to 8 calls.

    Timing a few calls together averages out the start of each one (the ranks leave the
    barrier at different moments on a busy machine), as ``nccl-tests`` does.

    >>> [batch_calls(n) for n in (4096, 4 << 20, 16 << 20, 64 << 20)]
    [8, 8, 2, 1]
    """
    return max(1, min(8, (32 << 20) // max(1, nbytes)))


def busbw(nbytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in bytes/s: nbytes / seconds x 2(p-1)/p."""
    return nbytes / seconds * 2 * (world_size - 1) / world_size


def summarize(nbytes: int, world_size: int, times: dict[str, list[float]]) -> dict:
    """Median seconds and bus bandwidth per kind, and each ring's median paired ratio to gloo.

    >>> row = summarize(4, 2, {"gloo": [1.0, 2.0, 4.0], "ring": [2.0, 2.0, 5.0],
    ...                        "ahead": [1.0, 2.0, 4.0], "pipelined": [1.0, 4.0, 4.0]})
    >>> row["ratio"], row["seconds"]["gloo"]
    ({'ring': 0.8, 'ahead': 1.0, 'pipelined': 1.0}, 2.0)
    """
    seconds = {k: statistics.median(v) for k, v in times.items()}
    ratio = {k: statistics.median(g / r for g, r in zip(times["gloo"], times[k])) for k in RINGS}
    return {"world_size": world_size, "size": nbytes, "seconds": seconds, "samples": times,
            "busbw": {k: busbw(nbytes, s, world_size) for k, s in seconds.items()}, "ratio": ratio,
            "judged": judged(world_size, nbytes), "passed": ratio["pipelined"] >= TARGET}


def measure(world_size: int, sizes: list[int], repeats: int, piece: int) -> dict:
    """Seconds per kind per round per size on ``world_size`` fresh ranks."""
    result = launch(_time_kinds, world_size, (sizes, repeats, piece), output="quiet", timeout=900)
    return result[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4M,16M,64M", help="tensor sizes in bytes, K/M suffixes (default 4M,16M,64M)")
    parser.add_argument("--world-sizes", default="4,2", help="numbers of ranks (default 4,2)")
    parser.add_argument("--repeats", type=int, default=24,
                        help="timed rounds per size, best a multiple of 4 (default 24)")
    parser.add_argument("--piece", default="4M", help="the pipelined ring's largest piece in bytes (default 4M)")
    parser.add_argument("--json", help="write the numbers, every round's included, to this file")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    worlds = [int(w) for w in args.world_sizes.split(",")]
    piece = parse_size(args.piece)
    print(f"Machine: {machine_line()}")
    print(f"All-reduce of float32 tensors, {args.repeats} rounds per size, the four kinds in each round in balanced "
          f"orders (each follows each other equally often), {batch_calls(max(sizes))}-{batch_calls(min(sizes))} calls "
          f"back to back per sample, slowest rank per call; pipelined pieces of at most {size_label(piece)}")
    print("Bus bandwidth: median over the rounds. Ratio: median over the rounds of gloo's time / the ring's time.\n")
    report: dict = {"machine": machine_line(), "piece": piece, "repeats": args.repeats, "target": TARGET,
                    "load_before": loadavg(), "results": []}
    for world in worlds:
        per_size = measure(world, sizes, args.repeats, piece)
        print(f"{world} ranks: bus bandwidth (GB/s) and ratio to gloo")
        print(f"{'size':>7} {'gloo':>7} {'plain':>7} {'ahead':>7} {'pipelined':>9} {'plain/gloo':>10} {'ahead/gloo':>11} "
              f"{'pipe/gloo':>10}  target")
        for n in sizes:
            row = summarize(n, world, per_size[str(n)])
            bw, ratio = row["busbw"], row["ratio"]
            verdict = ("PASS" if row["passed"] else "FAIL") if row["judged"] else ("within" if row["passed"] else "below")
            print(f"{size_label(n):>7} {bw['gloo'] / 1e9:>7.3f} {bw['ring'] / 1e9:>7.3f} {bw['ahead'] / 1e9:>7.3f} "
                  f"{bw['pipelined'] / 1e9:>9.3f} {ratio['ring']:>9.2f}x {ratio['ahead']:>10.2f}x "
                  f"{ratio['pipelined']:>9.2f}x  {verdict}")
            report["results"].append(row)
        print()
    report["load_after"] = loadavg()
    rows = [r for r in report["results"] if r["judged"]]
    others = [r for r in report["results"] if not r["judged"]]
    if rows:
        ok = all(r["passed"] for r in rows)
        print(f"{'PASS' if ok else 'FAIL'}: reference (pipelined) ring within {round((1 - TARGET) * 100)}% of gloo's bus bandwidth "
              f"on {TARGET_WORLD} ranks from {size_label(TARGET_SIZES[0])} to {size_label(TARGET_SIZES[1])}: "
              f"{sum(r['passed'] for r in rows)} of {len(rows)} sizes")
    else:
        print(f"No size measured falls under the target ({TARGET_WORLD} ranks, {size_label(TARGET_SIZES[0])} to "
              f"{size_label(TARGET_SIZES[1])}): nothing judged.")
    if others:
        print(f"Other rows: {sum(r['passed'] for r in others)} of {len(others)} within 20% of gloo.")
    print(f"Load average (1 min): {report['load_before']} before, {report['load_after']} after.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
