"""Launch benchmark: how long ``helpers.launch`` takes, next to torch's own launchers.

How to run it (from the repository root)::

    make bench
    .venv/bin/python bench/launch_bench.py [--repeats N] [--json PATH]

Other options: ``--cold-repeats N`` (default 3), ``--spawn-repeats N`` (default 5),
``--torchrun-repeats N`` (default 3), ``--no-baselines`` (skip mp.spawn and torchrun).
Run it on an otherwise idle machine and run only one benchmark at a time: the numbers
are wall-clock times, so anything else using the CPU shows up in them. The load average
before and after the run is printed to help spot a noisy run; re-run if it is high.

What is measured, for world sizes 2 and 4, always launching the same trivial function
(one ``dist.all_reduce`` of a 1-element tensor, returning a float):

- cold: the first ``launch`` in a fresh Python process. A new interpreter
  (``sys.executable -c ...``) records the time, runs ``import helpers`` (which starts the
  rank factory in the background), then ``launch(fn, n, output="quiet")`` once.
  (a) seconds from before ``import helpers`` to the launch returning -- the number the
  target applies to; (b) seconds for the whole subprocess as the parent sees it,
  interpreter start and exit (factory shutdown) included. The subprocess does not import
  torch itself; whether torch ended up imported in it is reported.
- warm: repeated ``launch(fn, n, output="quiet")`` in this process after a warm-up launch.
- baselines: ``torch.multiprocessing.spawn`` of the same function (gloo, a fresh loopback
  port each time, ``destroy_process_group`` at the end), and ``torchrun``
  (``python -m torch.distributed.run --standalone``) of a small script doing the same,
  if it works here.

Targets (reported, not enforced: the exit code is 0 whether they pass or fail):
warm 4-rank median <= 0.15 s and >= 10x faster than mp.spawn; cold (a) <= 2.5 s.
``--json PATH`` writes every number as JSON.

Nothing heavy is imported at module level: ``torch.multiprocessing.spawn`` re-imports
this file in each of its child processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _common import loadavg, machine, stats

ROOT = Path(__file__).resolve().parents[1]
WORLD_SIZES = (2, 4)

TARGET_WARM_4_S = 0.15
TARGET_RATIO_4 = 10.0
TARGET_COLD_S = 2.5

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

_TORCHRUN_SCRIPT = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert float(t.item()) == float(dist.get_world_size()), t
    dist.destroy_process_group()
    """
)


# --------------------------------------------------------------------------------------
# The launched function, and the mp.spawn entry point around it.
# --------------------------------------------------------------------------------------


def allreduce_once(rank: int, world_size: int) -> float:
    """One all_reduce of a 1-element tensor; every rank returns world_size."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t.item())


def spawn_entry(rank: int, world_size: int) -> None:
    """What each mp.spawn process runs: set up gloo, call the function, tear down."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        value = allreduce_once(rank, world_size)
        if value != float(world_size):
            raise RuntimeError(f"rank {rank}: all_reduce gave {value}, expected {world_size}")
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------
# Helpers.
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def env_vars(**values: str):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v






class CpuWatch:
    """CPU time that processes other than this one and its descendants used meanwhile.

    Busy time of the whole machine (``/proc/stat``) minus the CPU time of this process
    and of every child it has reaped (the factory reaps the ranks, this process reaps the
    factory, mp.spawn's and torchrun's processes). A large share means the machine was not
    idle and the timings of that phase are suspect.
    """

    def __init__(self) -> None:
        self.phases: dict[str, dict] = {}

    @staticmethod
    def _machine_busy() -> float | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        # user nice system idle iowait irq softirq steal ...
        busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6]
        return busy / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own() -> float:
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    @contextlib.contextmanager
    def phase(self, name: str):
        busy0, own0, wall0 = self._machine_busy(), self._own(), time.perf_counter()
        try:
            yield
        finally:
            busy1, own1, wall = self._machine_busy(), self._own(), time.perf_counter() - wall0
            if busy0 is not None and busy1 is not None:
                other = max(0.0, (busy1 - busy0) - (own1 - own0))
                cores = os.cpu_count() or 1
                self.phases[name] = {
                    "wall_s": wall,
                    "other_cpu_s": other,
                    "other_share": other / (wall * cores) if wall > 0 else 0.0,
                }


NOISY_SHARE = 0.05  # other processes used more than 5% of the machine during a phase




def say(text: str = "") -> None:
    print(text, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Measurements.
# --------------------------------------------------------------------------------------


def measure_cold(n: int, repeats: int) -> dict:
    code = _COLD_CODE.format(root=str(ROOT), n=n)
    env = dict(os.environ)
    env.pop("HELPERS_PRESTART", None)  # measure the default: the factory starts on import
    launch_s, process_s, import_s, runs = [], [], [], []
    for i in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=str(ROOT),
            env=env,
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


def measure_spawn(n: int, repeats: int) -> dict:
    import torch.multiprocessing as mp

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from devtools.ports import free_port

    samples = []
    for i in range(repeats):
        with env_vars(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), GLOO_SOCKET_IFNAME="lo"):
            start = time.perf_counter()
            mp.spawn(spawn_entry, args=(n,), nprocs=n, join=True)
            samples.append(time.perf_counter() - start)
        say(f"  spawn n={n} run {i + 1}/{repeats}: {samples[-1]:.3f} s")
    return stats(samples)


def measure_torchrun(n: int, repeats: int, script: str) -> dict:
    samples = []
    for i in range(repeats):
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nproc-per-node", str(n), "--standalone", script,
        ]
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=str(ROOT), env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=180)
        except subprocess.TimeoutExpired:
            return {"skipped": f"torchrun with {n} processes did not finish within 180 s"}
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"skipped": f"torchrun exited with code {proc.returncode}: " + " | ".join(tail)}
        samples.append(elapsed)
        say(f"  torchrun n={n} run {i + 1}/{repeats}: {elapsed:.3f} s")
    return stats(samples)


# --------------------------------------------------------------------------------------
# Report.
# --------------------------------------------------------------------------------------


def evaluate(results: dict) -> list[dict]:
    targets = []
    warm4 = results["warm"]["4"]["median"]
    targets.append({
        "name": "warm 4-rank median",
        "value": warm4, "limit": TARGET_WARM_4_S, "unit": "s", "op": "<=",
        "passed": warm4 <= TARGET_WARM_4_S,
    })
    ratio4 = (results.get("ratio_spawn_over_warm") or {}).get("4")
    targets.append({
        "name": "mp.spawn / warm, 4 ranks (medians)",
        "value": ratio4, "limit": TARGET_RATIO_4, "unit": "x", "op": ">=",
        "passed": None if ratio4 is None else ratio4 >= TARGET_RATIO_4,
        **({"note": "not measured (--no-baselines)"} if ratio4 is None else {}),
    })
    for n in WORLD_SIZES:
        cold = results["cold"][str(n)]["launch_s"]["median"]
        targets.append({
            "name": f"cold (a) median, {n} ranks",
            "value": cold, "limit": TARGET_COLD_S, "unit": "s", "op": "<=",
            "passed": cold <= TARGET_COLD_S,
        })
    return targets


def render(data: dict) -> str:
    m, r = data["machine"], data["results"]
    lines = []
    lines.append("helpers.launch benchmark (trivial fn: one all_reduce of a 1-element tensor)")
    lines.append(
        f"machine: {m['cpu_model']}, {m['cores']} cores ({m['usable_cores']} usable), "
        f"Python {m['python']}, torch {m['torch']}"
    )
    la0, la1 = data["load_before"], data["load_after"]
    if la0 is not None:
        lines.append(f"load average (1 min): {la0:.2f} before, {la1:.2f} after")
    phases = data.get("interference") or {}
    if phases:
        lines.append(
            "CPU used by other processes while measuring: "
            + ", ".join(f"{name} {p['other_share'] * 100:.0f}%" for name, p in phases.items())
            + " of the machine"
        )
        noisy = [name for name, p in phases.items() if p["other_share"] > NOISY_SHARE]
        if noisy:
            lines.append(
                f"WARNING: the machine was busy with other work during {', '.join(noisy)}; "
                "those timings are noisy -- re-run on an idle machine"
            )
    lines.append("")

    head = f"{'wall time, seconds':<34}"
    sub = f"{'':<34}"
    for n in WORLD_SIZES:
        head += f"{f'{n} ranks':^30}"
        sub += f"{'median':>8}{'min':>8}{'max':>8}{'n':>4}  "
    lines += [head, sub, "-" * len(sub.rstrip())]

    def row(label: str, per_n: dict | None, note: str = "") -> None:
        text = f"{label:<34}"
        for n in WORLD_SIZES:
            s = (per_n or {}).get(str(n))
            if s is None or "skipped" in s:
                text += f"{'-':>8}{'-':>8}{'-':>8}{'':>4}  "
            else:
                text += f"{s['median']:8.3f}{s['min']:8.3f}{s['max']:8.3f}{s['n']:4d}  "
        lines.append(text.rstrip() + (f"  {note}" if note else ""))

    cold = r["cold"]
    row("cold (a) import helpers -> return", {k: v["launch_s"] for k, v in cold.items()})
    row("cold (b) whole subprocess", {k: v["process_s"] for k, v in cold.items()})
    row("warm launch", r["warm"])
    row("torch.multiprocessing.spawn", r.get("spawn"))
    row("torchrun --standalone", r.get("torchrun"))
    ratio = r.get("ratio_spawn_over_warm")
    text = f"{'ratio spawn / warm (medians)':<34}"
    for n in WORLD_SIZES:
        v = (ratio or {}).get(str(n))
        text += f"{(f'{v:.1f}x' if v is not None else '-'):>8}{'':>22}"
    lines.append(text.rstrip())
    lines.append("")

    before = any(v["torch_imported_before_launch"] for v in cold.values())
    after = any(v["torch_imported_after_launch"] for v in cold.values())
    lines.append(
        f"cold subprocess: torch imported in its main process before launch: {'yes' if before else 'no'}; "
        f"after launch: {'yes' if after else 'no'}"
    )
    lines.append(f"warm: rank factory ready {data['warm_info']['factory_ready_s']:.3f} s after import in this process")
    if r.get("spawn") is None:
        lines.append("baselines: skipped (--no-baselines)")
    for n in WORLD_SIZES:
        tr = (r.get("torchrun") or {}).get(str(n))
        if tr and "skipped" in tr:
            lines.append(f"torchrun {n} ranks skipped: {tr['skipped']}")
    lines.append("")

    lines.append("targets:")
    for t in data["targets"]:
        if t["passed"] is None:
            lines.append(f"  SKIP  {t['name']}: {t.get('note', 'not measured')}")
            continue
        value = f"{t['value']:.1f}x" if t["unit"] == "x" else f"{t['value']:.3f} s"
        limit = f"{t['limit']:.0f}x" if t["unit"] == "x" else f"{t['limit']:.2f} s"
        lines.append(f"  {'PASS' if t['passed'] else 'FAIL'}  {t['name']}: {value} {t['op']} {limit}")
    failed = [t for t in data["targets"] if t["passed"] is False]
    checked = [t for t in data["targets"] if t["passed"] is not None]
    if failed:
        lines.append(
            f"RESULT: FAIL -- {len(failed)} of {len(checked)} targets missed: "
            + "; ".join(t["name"] for t in failed)
        )
    else:
        skipped = len(data["targets"]) - len(checked)
        lines.append(
            f"RESULT: PASS -- all {len(checked)} targets checked were met"
            + (f" ({skipped} skipped)" if skipped else "")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="warm launches per world size (default 20)")
    parser.add_argument("--cold-repeats", type=int, default=3, help="fresh subprocesses per world size (default 3)")
    parser.add_argument("--spawn-repeats", type=int, default=5, help="mp.spawn runs per world size (default 5)")
    parser.add_argument("--torchrun-repeats", type=int, default=3, help="torchrun runs per world size (default 3)")
    parser.add_argument("--no-baselines", action="store_true", help="skip mp.spawn and torchrun")
    parser.add_argument("--json", metavar="PATH", help="also write all numbers as JSON to PATH")
    args = parser.parse_args(argv)
    for name in ("repeats", "cold_repeats", "spawn_repeats", "torchrun_repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be 1 or more")

    data: dict = {"machine": machine(), "load_before": loadavg()}
    data["settings"] = {
        "world_sizes": list(WORLD_SIZES),
        "repeats": args.repeats,
        "cold_repeats": args.cold_repeats,
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
    with watch.phase("warm"):
        results["warm"], data["warm_info"] = measure_warm(args.repeats)
    if args.no_baselines:
        results["spawn"] = results["torchrun"] = results["ratio_spawn_over_warm"] = None
    else:
        with watch.phase("spawn"):
            results["spawn"] = {str(n): measure_spawn(n, args.spawn_repeats) for n in WORLD_SIZES}
        with watch.phase("torchrun"), tempfile.TemporaryDirectory(prefix="launch_bench_") as tmp:
            script = os.path.join(tmp, "allreduce_once.py")
            with open(script, "w", encoding="utf-8") as f:
                f.write(_TORCHRUN_SCRIPT)
            results["torchrun"] = {}
            for n in WORLD_SIZES:
                results["torchrun"][str(n)] = measure_torchrun(n, args.torchrun_repeats, script)
                if "skipped" in results["torchrun"][str(n)]:
                    say(f"  torchrun n={n} skipped: {results['torchrun'][str(n)]['skipped']}")
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
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        print(f"JSON written to {path}")
    return 0  # it reports, it does not gate


if __name__ == "__main__":
    sys.exit(main())
