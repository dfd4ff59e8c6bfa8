"""Launch benchmark: how long ``helpers.launch`` takes, next to torch's own launchers.

How to run it (from the repository root)::

    make bench
    .venv/bin/python bench/launch_bench.py [--repeats N] [--json PATH]

Other options: ``--cold-repeats N`` (default 3), ``--notebook-repeats N`` (default 3), ``--spawn-repeats N`` (default 5),
``--torchrun-repeats N`` (default 3), ``--no-baselines`` (skip mp.spawn and torchrun).
Run it on an otherwise idle machine and run only one benchmark at a time: the numbers
are wall-clock times, so anything else using the CPU shows up in them. The load average
before and after the run is printed to help spot a noisy run; re-run if it is high.

What is measured, for world sizes 2 and 4, always launching the same trivial function
(one ``dist.all_reduce`` of a 1-element tensor, returning a float):

- cold: the first ``launch`` in a fresh Python process. A new interpreter
  (``sys.executable -c ...``) records the time, runs ``import helpers`` (which starts no
  process there: it is no notebook), then ``launch(fn, n, output="quiet")`` once, which
  starts the rank factory and waits for it.
  (a) seconds from before ``import helpers`` to the launch returning -- the number the
  target applies to; (b) seconds for the whole subprocess as the parent sees it,
  interpreter start and exit (factory shutdown) included. The subprocess does not import
  torch itself; whether torch ended up imported in it is reported.
- notebook: a lesson's first launch in a fresh Jupyter kernel (:mod:`devtools.kernel`). The
  set-up cell as the lessons write it (``import torch, torch.distributed as dist`` and
  ``from helpers import launch``), then at once the cell with the first launch: the seconds
  each cell takes, as the notebook sees them. No reading time between the two, so a rank
  factory started by the set-up is least ahead: the worst case of a notebook's first launch.- warm: repeated ``launch(fn, n, output="quiet")`` in this process after a warm-up launch.
- baselines: ``torch.multiprocessing.spawn`` of the same function (gloo, a fresh loopback
  port each time, ``destroy_process_group`` at the end), and ``torchrun``
  (``python -m torch.distributed.run --standalone``) of a small script doing the same,
  if it works here.

Targets (reported, not enforced: the exit code is 0 whether they pass or fail):
warm 4-rank median <= 0.15 s and >= 10x faster than mp.spawn; cold (a) <= 2.5 s.
``--json PATH`` writes every number as JSON.

The baselines live in bench/launch_baselines.py, the targets and the printed report in
bench/launch_report.py. Nothing heavy is imported at module level:
``torch.multiprocessing.spawn`` re-imports this file in each of its child processes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from _common import CpuWatch, loadavg, machine, parse_args, save_json, say, stats
from launch_baselines import measure_spawn, measure_torchrun
from launch_report import evaluate, render

ROOT = Path(__file__).resolve().parents[1]
WORLD_SIZES = (2, 4)

# The subprocess for the cold measurement. It puts the repository first on sys.path (so
# the checkout's helpers is used, whatever the installed copy looks like), defines the
# launched function itself, and never imports torch in its own code.
_COLD_CODE = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {root!r})
    t0 = time.perf_counter()
    import helpers
    t_import = time.perf_counter()
    from helpers import launch

    def allreduce_once(rank, world_size):
        import torch
        import torch.distributed as dist

        t = torch.ones(1)
        dist.all_reduce(t)
        return float(t.item())

    torch_before = "torch" in sys.modules
    result = launch(allreduce_once, {n}, output="quiet")
    t1 = time.perf_counter()
    print("BENCH-COLD " + json.dumps({{
        "launch_s": t1 - t0,
        "import_s": t_import - t0,
        "result": list(result),
        "helpers_file": helpers.__file__,
        "torch_imported_before_launch": torch_before,
        "torch_imported_after_launch": "torch" in sys.modules,
    }}), flush=True)
    """
)


# --------------------------------------------------------------------------------------
# The launched function (mp.spawn's processes run it too).
# --------------------------------------------------------------------------------------


def allreduce_once(rank: int, world_size: int) -> float:
    """One all_reduce of a 1-element tensor; every rank returns world_size."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t.item())


# --------------------------------------------------------------------------------------
# Measurements.
# --------------------------------------------------------------------------------------


def measure_cold(n: int, repeats: int) -> dict:
    code = _COLD_CODE.format(root=str(ROOT), n=n)
    launch_s, process_s, import_s, runs = [], [], [], []
    for i in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=str(ROOT),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=180,
        )
        elapsed = time.perf_counter() - start
        lines = [l for l in proc.stdout.splitlines() if l.startswith("BENCH-COLD ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(
                f"cold launch subprocess (world size {n}, run {i + 1}) failed with exit code "
                f"{proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
            )
        report = json.loads(lines[-1][len("BENCH-COLD "):])
        if report["result"] != [float(n)] * n:
            raise RuntimeError(f"cold launch returned {report['result']}, expected {[float(n)] * n}")
        launch_s.append(report["launch_s"])
        import_s.append(report["import_s"])
        process_s.append(elapsed)
        runs.append(report)
        say(f"  cold  n={n} run {i + 1}/{repeats}: (a) {report['launch_s']:.3f} s, (b) {elapsed:.3f} s")
    return {
        "launch_s": stats(launch_s),
        "process_s": stats(process_s),
        "import_s": stats(import_s),
        "torch_imported_before_launch": any(r["torch_imported_before_launch"] for r in runs),
        "torch_imported_after_launch": any(r["torch_imported_after_launch"] for r in runs),
        "helpers_file": runs[-1]["helpers_file"],
    }


_NOTEBOOK_SETUP = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    import torch, torch.distributed as dist
    from helpers import launch
    """
)
_NOTEBOOK_LAUNCH = textwrap.dedent(
    """
    def allreduce_once(rank, world_size):
        t = torch.ones(1)
        dist.all_reduce(t)
        return float(t.item())

    result = launch(allreduce_once, {n}, output="quiet")
    """
)


def measure_notebook(n: int, repeats: int) -> dict:
    """The set-up cell, then the first launch, each in a fresh kernel; seconds per cell."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from devtools.kernel import start_kernel

    setup_s, launch_s, files = [], [], set()
    for i in range(repeats):
        kernel = start_kernel()
        try:
            cells = [kernel.execute(_NOTEBOOK_SETUP.format(root=str(ROOT)), timeout=180),
                     kernel.execute(_NOTEBOOK_LAUNCH.format(n=n), timeout=180)]
            failed = [c for c in cells if c["error"] is not None or c["status"] != "ok"]
            if failed:
                raise RuntimeError(f"a notebook cell failed (world size {n}, run {i + 1}): {failed[0]['error']}\n"
                                   f"{failed[0]['stderr']}")
            result, helpers_file = kernel.value("(result, __import__('helpers').__file__)")
        finally:
            kernel.close()
        if result != [float(n)] * n:
            raise RuntimeError(f"the notebook's launch returned {result}, expected {[float(n)] * n}")
        setup_s.append(cells[0]["seconds"])
        launch_s.append(cells[1]["seconds"])
        files.add(helpers_file)
        say(f"  notebook n={n} run {i + 1}/{repeats}: set-up {setup_s[-1]:.3f} s, first launch {launch_s[-1]:.3f} s")
    return {"setup_s": stats(setup_s), "first_launch_s": stats(launch_s), "helpers_file": sorted(files)}


def measure_warm(repeats: int) -> tuple[dict, dict]:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    t0 = time.perf_counter()
    import helpers
    from helpers import launch

    machine = helpers.machine_info()  # waits until the rank factory is ready
    info = {
        "factory_ready_s": time.perf_counter() - t0,
        "factory_info": {k: v for k, v in machine.items() if k != "factory_pid"},
        "helpers_file": helpers.__file__,
    }
    out = {}
    try:
        for n in WORLD_SIZES:
            expected = [float(n)] * n
            result = launch(allreduce_once, n, output="quiet")  # warm-up
            if list(result) != expected:
                raise RuntimeError(f"launch returned {list(result)}, expected {expected}")
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                result = launch(allreduce_once, n, output="quiet")
                samples.append(time.perf_counter() - start)
                if list(result) != expected:
                    raise RuntimeError(f"launch returned {list(result)}, expected {expected}")
            out[str(n)] = stats(samples)
            say(f"  warm  n={n}: median {out[str(n)]['median']:.3f} s over {repeats}")
    finally:
        helpers.shutdown()  # nothing of ours idles in the background during the baselines
    return out, info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="warm launches per world size (default 20)")
    parser.add_argument("--cold-repeats", type=int, default=3, help="fresh subprocesses per world size (default 3)")
    parser.add_argument("--notebook-repeats", type=int, default=3, help="fresh kernels per world size (default 3)")
    parser.add_argument("--spawn-repeats", type=int, default=5, help="mp.spawn runs per world size (default 5)")
    parser.add_argument("--torchrun-repeats", type=int, default=3, help="torchrun runs per world size (default 3)")
    parser.add_argument("--no-baselines", action="store_true", help="skip mp.spawn and torchrun")
    args = parse_args(parser, argv, [(name, 1) for name in ("repeats", "cold_repeats", "notebook_repeats", "spawn_repeats",
                                                            "torchrun_repeats")])

    data: dict = {"machine": machine(), "load_before": loadavg()}
    data["settings"] = {
        "world_sizes": list(WORLD_SIZES),
        "repeats": args.repeats,
        "cold_repeats": args.cold_repeats,
        "notebook_repeats": args.notebook_repeats,
        "spawn_repeats": None if args.no_baselines else args.spawn_repeats,
        "torchrun_repeats": None if args.no_baselines else args.torchrun_repeats,
        "baselines": not args.no_baselines,
    }
    results: dict = {}
    say("measuring (progress on stderr; the table follows on stdout)")
    # Cold first, while this process has imported neither helpers nor torch.
    watch = CpuWatch()
    with watch.phase("cold"):
        results["cold"] = {str(n): measure_cold(n, args.cold_repeats) for n in WORLD_SIZES}
    with watch.phase("notebook"):
        results["notebook"] = {str(n): measure_notebook(n, args.notebook_repeats) for n in WORLD_SIZES}
    with watch.phase("warm"):
        results["warm"], data["warm_info"] = measure_warm(args.repeats)
    if args.no_baselines:
        results["spawn"] = results["torchrun"] = results["ratio_spawn_over_warm"] = None
    else:
        with watch.phase("spawn"):
            results["spawn"] = measure_spawn(list(WORLD_SIZES), args.spawn_repeats, allreduce_once)
        with watch.phase("torchrun"):
            results["torchrun"] = measure_torchrun(list(WORLD_SIZES), args.torchrun_repeats)
        results["ratio_spawn_over_warm"] = {
            str(n): results["spawn"][str(n)]["median"] / results["warm"][str(n)]["median"]
            for n in WORLD_SIZES
        }
    data["results"] = results
    data["load_after"] = loadavg()
    data["interference"] = watch.phases
    data["targets"] = evaluate(results)
    data["passed"] = all(t["passed"] is not False for t in data["targets"])

    print(render(data), flush=True)
    if args.json:
        print(f"JSON written to {save_json(args.json, data)}")
    return 0  # it reports, it does not gate


if __name__ == "__main__":
    sys.exit(main())
