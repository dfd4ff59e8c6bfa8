"""Soak: run test modules again and again while the machine is busy, and count every failure.

A test that fails now and then is a bug. This finds such tests before CI does: each group of
modules runs ``--runs`` times in a row (a fresh pytest each time), while ``--load`` busy
processes keep the cores occupied, and every failure is kept with its pytest output.

How to run it (from the repository root)::

    make soak                                   # every group, 10 runs each, load = cores
    make soak SOAK_RUNS=3 SOAK_GROUPS=kernel    # fewer runs, one group
    .venv/bin/python -m devtools.soak --runs 10 --load 2 --groups kernel,magics --out soak-results

The groups (``--groups``, comma-separated; all by default):

- ``kernel``: tests/test_launch_kernel.py, ``launch`` through a real Jupyter kernel;
- ``magics``: tests/test_magics_kernel.py, ``%%distributed`` through a real kernel;
- ``output``: tests/test_rank_output_order.py, the ranks' output with a slowed wait;
- ``browser``: tests/test_browser.py, JupyterLab in chromium;
- ``grading``: tests/test_grading_e2e*.py, one class graded by nbgrader in the sandbox;
- ``hub``: tests/test_hub.py, the course on a JupyterHub, nbgrader's exchange end to end in chromium.

Each run's pytest output goes to ``OUT/GROUP-RUN.log``; a summary table is printed and written
to ``OUT/summary.json``. The exit code is 1 if any run failed. The busy processes are plain
Python loops (:mod:`devtools.load`), ended by their process group ids.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .load import start_load, stop_load

__all__ = ["GROUPS", "main"]

ROOT = Path(__file__).resolve().parents[1]

GROUPS: dict[str, list[str]] = {
    "kernel": ["tests/test_launch_kernel.py"],
    "magics": ["tests/test_magics_kernel.py"],
    "output": ["tests/test_rank_output_order.py"],
    "browser": ["tests/test_browser.py"],
    "grading": sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_grading_e2e*.py")),
    "hub": ["tests/test_hub.py"],
}

def _summary_line(log: str) -> str:
    """pytest's last line ('== 5 passed in 12.3s =='), or the last line it printed."""
    lines = [line for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if " in " in line and ("passed" in line or "failed" in line or "error" in line):
            return line.strip("= ")
    return lines[-1] if lines else "(no output)"


def run_group(name: str, runs: int, out: Path, pytest_args: list[str]) -> list[dict]:
    """Run one group ``runs`` times; one record per run."""
    records = []
    for i in range(1, runs + 1):
        log_path = out / f"{name}-{i:02d}.log"
        started = time.monotonic()
        with open(log_path, "w") as log:
            code = subprocess.call([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *pytest_args,
                                    *GROUPS[name]], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        seconds = time.monotonic() - started
        summary = _summary_line(log_path.read_text(errors="replace"))
        records.append({"group": name, "run": i, "exit": code, "seconds": round(seconds, 1),
                        "summary": summary, "log": str(log_path)})
        print(f"{name:8} run {i:2d}/{runs}: {'ok  ' if code == 0 else 'FAIL'} {seconds:7.1f} s  {summary}", flush=True)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each group (default 10)")
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1,
                        help="busy processes kept running meanwhile (default: one per core)")
    parser.add_argument("--groups", default=",".join(GROUPS), help=f"comma-separated, from {', '.join(GROUPS)}")
    parser.add_argument("--out", default="soak-results", help="folder for the logs and summary.json")
    parser.add_argument("pytest_args", nargs="*", help="more arguments for pytest (after --)")
    args = parser.parse_args(argv)
    groups = [g for g in args.groups.split(",") if g]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown or args.runs < 1 or args.load < 0:
        parser.error(f"groups must be among {', '.join(GROUPS)} (got {', '.join(unknown) or 'none unknown'}); "
                     "--runs at least 1, --load at least 0")
    # Ctrl-C stops the soak (and its busy processes), and the tests' processes get the signal as
    # from a terminal, even where the soak itself was started in the background (SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"soak: {args.runs} runs of {', '.join(groups)}, {args.load} busy processes beside; logs in {out}/",
          flush=True)
    load = start_load(args.load)
    records: list[dict] = []
    started = time.monotonic()
    try:
        for name in groups:
            records += run_group(name, args.runs, out, args.pytest_args)
    finally:
        stop_load(load)
    print()
    for name in groups:
        mine = [r for r in records if r["group"] == name]
        green = sum(r["exit"] == 0 for r in mine)
        print(f"{name:8} {green}/{len(mine)} green, {sum(r['seconds'] for r in mine) / len(mine):.0f} s a run")
    failed = [r for r in records if r["exit"] != 0]
    for r in failed:
        print(f"failed: {r['group']} run {r['run']}: {r['summary']} (see {r['log']})")
    (out / "summary.json").write_text(json.dumps({
        "runs": args.runs, "load": args.load, "groups": groups, "seconds": round(time.monotonic() - started, 1),
        "records": records}, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
