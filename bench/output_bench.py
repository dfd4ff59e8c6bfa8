"""Rank output benchmark: does every line a persistent rank prints land in its own cell?

How to run it (from the repository root)::

    make bench-output
    .venv/bin/python bench/output_bench.py [--cells N] [--world-size N] [--load K]
                                           [--slow-poll S] [--settle S] [--json PATH]

A real Jupyter kernel (ipykernel through jupyter_client, :mod:`devtools.kernel`) runs
``--cells`` ``%%distributed`` cells (default 3000) on ``--world-size`` persistent ranks
(default 2). Cells go in turn to every rank, then to each rank alone; each rank the cell
runs on prints one line naming the cell. A cell's output is what a notebook shows under it:
the kernel's stream messages whose parent is that cell. After the last cell one empty cell
catches what would still come late.

Counted over all cells: the lines expected, those in their own cell, those missing from it,
and of those, the ones that showed up in a later cell (misplaced) or never (lost).

- ``--load K`` keeps K busy processes running beside the kernel for the whole run (plain
  Python loops, :mod:`devtools.load`, the soak's too, ended by their process group ids): the kernel then
  competes for the CPU as on a busy laptop, and a rank can print and reply between the
  kernel's wake-up and its read. Default: as many as there are cores.
- ``--slow-poll S`` widens that gap to S seconds on purpose (:mod:`devtools.slowpoll`);
  ``--settle S`` makes each rank wait S seconds before it prints, so that its start alone
  wakes the kernel. ``--slow-poll 0.2 --settle 0.05`` meets the race in every cell that
  runs on one rank.

Target: no line missing from its cell (0 misplaced, 0 lost). Exit code 0 either way.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from _common import loadavg, machine, parse_args, save_json, say

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's helpers and devtools
    sys.path.insert(0, str(ROOT))

from devtools.load import start_load, stop_load  # noqa: E402 - once ROOT is on sys.path

def targets(i: int, world_size: int) -> list[int]:
    """The ranks cell ``i`` runs on: every rank, then each one alone, in turn.

    >>> [targets(i, 2) for i in range(4)]
    [[0, 1], [0], [1], [0, 1]]
    """
    k = i % (world_size + 1)
    return list(range(world_size)) if k == 0 else [k - 1]


def run_cells(cells: int, world_size: int, slow_poll: float, settle: float) -> dict:
    """Run the cells in a fresh kernel; where every rank's line landed."""
    from devtools.kernel import start_kernel

    kernel = start_kernel()
    try:
        setup = "import os\nos.environ.pop('JPY_SESSION_NAME', None)\n"
        if slow_poll:
            setup += f"import devtools.slowpoll\ndevtools.slowpoll.install({slow_poll})\n"
        kernel.run(setup + "%load_ext helpers")
        kernel.run(f"%dist_start -n {world_size}", timeout=180)
        wait = f"import time; time.sleep({settle})\n" if settle else ""
        outputs: list[str] = []
        expected: list[list[str]] = []
        started = time.perf_counter()
        for i in range(cells):
            ranks = targets(i, world_size)
            flag = "" if len(ranks) == world_size else f" --ranks {ranks[0]}"
            outputs.append(kernel.run(f"%%distributed{flag}\n{wait}print('cell {i} on rank', rank)"))
            expected.append([f"[rank {r}] cell {i} on rank {r}" for r in ranks])
            if (i + 1) % 500 == 0:
                say(f"  {i + 1} cells ...")
        seconds = time.perf_counter() - started
        outputs.append(kernel.run("%%distributed\npass"))  # what still comes late lands here
        kernel.run("%dist_stop")
    finally:
        kernel.close()
    lines = [set(out.splitlines()) for out in outputs]
    missing, misplaced = [], []
    for i, want in enumerate(expected):
        for line in want:
            if line in lines[i]:
                continue
            missing.append(line)
            if any(line in later for later in lines[i + 1:]):
                misplaced.append(line)
    total = sum(len(want) for want in expected)
    return {"cells": cells, "lines": total, "in_own_cell": total - len(missing), "missing": len(missing),
            "misplaced": len(misplaced), "lost": len(missing) - len(misplaced), "seconds": seconds,
            "examples": missing[:10]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=3000, help="how many %%%%distributed cells (default 3000)")
    parser.add_argument("--world-size", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1,
                        help="busy processes beside the kernel (default: one per core; 0 for none)")
    parser.add_argument("--slow-poll", type=float, default=0.0, help="slow the kernel's wait by S seconds")
    parser.add_argument("--settle", type=float, default=0.0, help="each rank waits S seconds before printing")
    args = parse_args(parser, argv, at_least=[("cells", 1), ("world_size", 1), ("load", 0)])

    say(f"output benchmark: {args.cells} cells on {args.world_size} ranks, {args.load} busy processes beside")
    load = start_load(args.load)
    load_before = loadavg()
    try:
        result = run_cells(args.cells, args.world_size, args.slow_poll, args.settle)
    finally:
        stop_load(load)
    load_after = loadavg()
    passed = result["missing"] == 0
    data = {
        "machine": machine(),
        "settings": {"cells": args.cells, "world_size": args.world_size, "load": args.load,
                     "slow_poll": args.slow_poll, "settle": args.settle},
        "load_before": load_before, "load_after": load_after,
        "results": result,
        "targets": [{"name": "lines missing from their own cell", "value": result["missing"], "limit": 0,
                     "op": "<=", "unit": "lines", "passed": passed}],
        "passed": passed,
    }
    m = data["machine"]
    print(f"rank output benchmark: {args.cells} %%distributed cells on {args.world_size} ranks, "
          f"{args.load} busy processes beside, slowed wait {args.slow_poll} s, settle {args.settle} s")
    print(f"machine: {m['cpu_model']}, {m['cores']} cores, Python {m['python']}, torch {m['torch']}")
    if load_after is not None:
        print(f"load average (1 min) at the end: {load_after:.2f}")
    print(f"lines printed: {result['lines']}; in their own cell: {result['in_own_cell']}; "
          f"missing: {result['missing']} (in a later cell: {result['misplaced']}, nowhere: {result['lost']})")
    print(f"{result['seconds']:.1f} s for the cells ({result['seconds'] / args.cells * 1e3:.1f} ms each)")
    for line in result["examples"]:
        print(f"  missing from its cell: {line}")
    print(f"RESULT: {'PASS' if passed else 'FAIL'} {result['missing']} of {result['lines']} lines missing from their cell")
    if args.json:
        save_json(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
