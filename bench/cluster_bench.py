"""Persistent-ranks benchmark: the cost of one request to ranks that are already running.

How to run it (from the repository root)::

    make bench-cluster
    .venv/bin/python bench/cluster_bench.py [--repeats N] [--json PATH]

Other options: ``--launch-repeats N`` (default 20), ``--world-size N`` (default 4),
``--warmup N`` (untimed rounds first, default 5; at most 2 for launches), ``--no-kernel``
(skip the measurement through a real Jupyter kernel). Run it on an
otherwise idle machine, one benchmark at a time: these are wall-clock times.

What is measured, on 4 ranks that are started once and then reused (median, min and max
of ``--repeats`` round trips, default 200, after ``--warmup`` untimed rounds):

(a) an empty ``%%distributed`` cell: one whose body is ``pass`` (IPython refuses a cell
    magic with no body at all: "UsageError: %%distributed is a cell magic, but the cell
    body is empty").
    - in-kernel: an IPython shell in this process
      (``InteractiveShell.instance()``, ``%load_ext helpers``, ``%dist_start -n 4``) and
      ``shell.run_cell_magic("distributed", "", "pass")`` timed around the call. This is the
      magic's own cost inside the kernel -- sending the cell to every rank, running it,
      collecting the replies -- without the browser and ZeroMQ round trip.
    - through a kernel: a real ipykernel started with jupyter_client; the time from
      ``execute("%%distributed\\npass")`` to the kernel's idle status and execute reply. The
      same for a plain empty cell (``pass``) is shown as the baseline: what any cell costs
      through ZeroMQ, so the difference is the magic's share.
(b) ``Cluster.run`` of a trivial function (it returns its rank) on the same 4 ranks: the
    function is pickled by value and called on each rank.
(c) a warm ``helpers.launch`` of the same function on 4 ranks (``output="quiet"``): new
    rank processes forked from the warm factory every time, for comparison.

Target (reported, not enforced: the exit code is 0 either way): the in-kernel empty-cell
median <= 10 ms (ipyparallel's per-task overhead is 1-10 ms). ``--json PATH`` writes every
number as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import sys
import time
from pathlib import Path

from _common import loadavg, machine, parse_args, save_json, say, stats

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # use this checkout's helpers, however the venv installed it
    sys.path.insert(0, str(ROOT))

TARGET_EMPTY_CELL_S = 0.010
WARMUP = 5


def trivial(rank: int, world_size: int) -> int:
    """The function (b) and (c) run: return the rank."""
    return rank


# --------------------------------------------------------------------------------------
# Helpers.
# --------------------------------------------------------------------------------------


def timed(fn, repeats: int, warmup: int) -> dict:
    """Stats of ``repeats`` timed calls of ``fn``, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return stats(samples)


# --------------------------------------------------------------------------------------
# Measurements.
# --------------------------------------------------------------------------------------


def measure_in_process(world_size: int, repeats: int, launch_repeats: int, warmup: int) -> dict:
    """(a) in-kernel, (b) and (c), all in this process."""
    from IPython.core.interactiveshell import InteractiveShell

    import helpers
    from helpers import launch
    from helpers.magics import current

    shell = InteractiveShell.instance()
    with contextlib.redirect_stdout(sys.stderr):  # keep the "Started ..." line off the table
        shell.run_line_magic("load_ext", "helpers")
        shell.run_line_magic("dist_start", f"-n {world_size}")
    cluster = current()
    if cluster is None or not cluster.running:
        raise RuntimeError("%dist_start did not start the ranks")
    out: dict = {}
    try:
        # The magic raises on failure (run_cell_magic does not swallow it), so a broken
        # cell cannot pass for a fast one.
        out["shell_cell"] = timed(lambda: shell.run_cell_magic("distributed", "", "pass"), repeats, warmup)
        say(f"  (a) empty %%distributed cell, in-kernel: median {out['shell_cell']['median'] * 1e3:.2f} ms")

        expected = list(range(world_size))
        if cluster.run(trivial) != expected:
            raise RuntimeError(f"Cluster.run returned {cluster.run(trivial)}, expected {expected}")
        out["cluster_run"] = timed(lambda: cluster.run(trivial), repeats, warmup)
        say(f"  (b) Cluster.run: median {out['cluster_run']['median'] * 1e3:.2f} ms")
    finally:
        with contextlib.redirect_stdout(sys.stderr):
            shell.run_line_magic("dist_stop", "")

    if list(launch(trivial, world_size, output="quiet")) != list(range(world_size)):
        raise RuntimeError("launch returned the wrong results")
    out["launch_warm"] = timed(lambda: launch(trivial, world_size, output="quiet"), launch_repeats, min(warmup, 2))
    say(f"  (c) warm launch: median {out['launch_warm']['median'] * 1e3:.2f} ms")
    helpers.shutdown()  # nothing of ours idles in the background during the kernel runs
    return out


class _KernelTimer:
    """A real ipykernel, and the round trip of one cell through it."""

    def __init__(self) -> None:
        from jupyter_client.manager import start_new_kernel

        env = dict(os.environ)
        env.pop("JPY_SESSION_NAME", None)  # a plain kernel, as nbclient starts it
        env.pop("HELPERS_VIEW", None)
        self.km, self.kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT), env=env)

    def cell(self, code: str, timeout: float = 60.0) -> float:
        """Seconds from sending ``code`` to the kernel's idle status and execute reply."""
        kc = self.kc
        start = time.perf_counter()
        msg_id = kc.execute(code)
        deadline = time.monotonic() + timeout
        idle = replied = False
        error = None
        while not (idle and replied):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"the kernel did not finish {code!r} within {timeout} s")
            if not idle:
                try:
                    msg = kc.get_iopub_msg(timeout=remaining)
                except queue.Empty:
                    continue
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "error":
                    error = msg["content"]
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    idle = True
            else:
                reply = kc.get_shell_msg(timeout=remaining)
                if reply["parent_header"].get("msg_id") == msg_id:
                    replied = True
        elapsed = time.perf_counter() - start
        if error is not None:
            raise RuntimeError(f"cell {code!r} failed in the kernel: {error['ename']}: {error['evalue']}")
        return elapsed

    def close(self) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)


def measure_kernel(world_size: int, repeats: int, warmup: int) -> dict:
    """(a) through a kernel, with an empty plain cell as the baseline."""
    say("  starting a Jupyter kernel ...")
    kernel = _KernelTimer()
    try:
        kernel.cell("%load_ext helpers")
        kernel.cell(f"%dist_start -n {world_size}", timeout=180)
        out = {
            "kernel_baseline": timed(lambda: kernel.cell("pass"), repeats, warmup),
            "kernel_cell": timed(lambda: kernel.cell("%%distributed\npass"), repeats, warmup),
        }
        kernel.cell("%dist_stop")
    finally:
        kernel.close()
    say(
        f"  (a) empty %%distributed cell through a kernel: median {out['kernel_cell']['median'] * 1e3:.2f} ms "
        f"(plain empty cell {out['kernel_baseline']['median'] * 1e3:.2f} ms)"
    )
    return out


# --------------------------------------------------------------------------------------
# Report.
# --------------------------------------------------------------------------------------

ROWS = (
    ("shell_cell", "(a) empty %%distributed cell, in-kernel"),
    ("kernel_cell", "(a) empty %%distributed cell via kernel"),
    ("kernel_baseline", "    plain empty cell via kernel"),
    ("cluster_run", "(b) Cluster.run(trivial)"),
    ("launch_warm", "(c) warm launch(trivial)"),
)


def evaluate(results: dict) -> list[dict]:
    value = results["shell_cell"]["median"]
    return [{
        "name": "empty %%distributed cell median (in-kernel)",
        "value": value, "limit": TARGET_EMPTY_CELL_S, "unit": "s", "op": "<=",
        "passed": value <= TARGET_EMPTY_CELL_S,
    }]


def render(data: dict) -> str:
    m, r, s = data["machine"], data["results"], data["settings"]
    lines = [
        f"persistent ranks benchmark: {s['world_size']} ranks, round trip of one request",
        f"machine: {m['cpu_model']}, {m['cores']} cores, Python {m['python']}, torch {m['torch']}",
    ]
    if data["load_before"] is not None:
        lines.append(f"load average (1 min): {data['load_before']:.2f} before, {data['load_after']:.2f} after")
    lines.append("")
    width = 42
    lines.append(f"{'milliseconds':<{width}}{'median':>9}{'min':>9}{'max':>9}{'n':>6}")
    lines.append("-" * (width + 33))
    for key, label in ROWS:
        entry = r.get(key)
        if entry is None:
            lines.append(f"{label:<{width}}{'-':>9}{'-':>9}{'-':>9}{'':>6}")
            continue
        lines.append(
            f"{label:<{width}}{entry['median'] * 1e3:9.2f}{entry['min'] * 1e3:9.2f}"
            f"{entry['max'] * 1e3:9.2f}{entry['n']:6d}"
        )
    lines.append("")
    lines.append("in-kernel: the magic inside the kernel process, without the browser/ZeroMQ round trip;")
    if r.get("kernel_cell") is not None:
        extra = (r["kernel_cell"]["median"] - r["kernel_baseline"]["median"]) * 1e3
        lines.append(
            f"via kernel: execute -> idle through a real ipykernel; the magic adds {extra:.2f} ms "
            "(median) to a plain cell."
        )
    else:
        lines.append("via kernel: skipped (--no-kernel).")
    slow = [x for x in r["launch_warm"]["samples"] if x > 1.0]
    if slow:
        lines.append(
            f"note: {len(slow)} of {r['launch_warm']['n']} warm launches took over 1 s (slowest "
            f"{max(slow):.2f} s); compare medians."
        )
    lines.append("")
    lines.append("targets:")
    for t in data["targets"]:
        lines.append(
            f"  {'PASS' if t['passed'] else 'FAIL'}  {t['name']}: {t['value'] * 1e3:.2f} ms "
            f"{t['op']} {t['limit'] * 1e3:.0f} ms"
        )
    failed = [t for t in data["targets"] if not t["passed"]]
    lines.append("RESULT: " + ("FAIL -- " + "; ".join(t["name"] for t in failed) if failed else "PASS"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200, help="round trips for (a) and (b) (default 200)")
    parser.add_argument("--launch-repeats", type=int, default=20, help="warm launches for (c) (default 20)")
    parser.add_argument("--world-size", type=int, default=4, help="ranks (default 4)")
    parser.add_argument("--warmup", type=int, default=WARMUP, help=f"untimed rounds before each measurement (default {WARMUP})")
    parser.add_argument("--no-kernel", action="store_true", help="skip the measurement through a real kernel")
    args = parse_args(parser, argv, [("repeats", 1), ("launch_repeats", 1), ("world_size", 1), ("warmup", 0)])

    data: dict = {
        "machine": machine(),
        "settings": {
            "world_size": args.world_size,
            "repeats": args.repeats,
            "launch_repeats": args.launch_repeats,
            "warmup": args.warmup,
            "kernel": not args.no_kernel,
        },
        "load_before": loadavg(),
    }
    say(f"measuring on {args.world_size} ranks ...")
    results = measure_in_process(args.world_size, args.repeats, args.launch_repeats, args.warmup)
    results.update({"kernel_cell": None, "kernel_baseline": None})
    if not args.no_kernel:
        results.update(measure_kernel(args.world_size, args.repeats, args.warmup))
    data["load_after"] = loadavg()
    data["results"] = results
    data["targets"] = evaluate(results)
    data["passed"] = all(t["passed"] for t in data["targets"])
    print(render(data), flush=True)
    if args.json:
        say(f"wrote {save_json(args.json, data)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
