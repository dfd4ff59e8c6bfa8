"""What one learner's server costs on the course's JupyterHub while it runs lesson 04's launches.

Run: ``make bench-hub`` or ``.venv/bin/python bench/hub_bench.py [--lesson 04-ring-all-reduce] [--json PATH]``

A learner's server on the hub (`make hub`) is a Jupyter server and, once a notebook is open, its
kernel; every launch from a cell adds the kernel's rank factory and the ranks. This measures
both parts the way they run there, from the course's venv, without the hub in front (which
adds nothing per learner but a proxy route):

1. an idle Jupyter server (``jupyter server``, the program ``jupyterhub-singleuser`` wraps),
   sampled for a few seconds: its memory;
2. the lesson's instructor notebook (every exercise answered, so every launch of the lesson
   runs, ranks included) executed top to bottom in a fresh kernel, as a learner who runs
   the whole lesson would, while the kernel's process tree is sampled every 0.2 s: peak
   memory (PSS, which counts the pages the forked ranks share with their parent once, and RSS,
   which counts them in every process), CPU seconds of the whole tree, wall seconds, and the
   cores it kept busy on average and at its busiest second.

The figures answer "how many learners per core": a learner running a lesson's cells keeps
about ``busy`` cores busy while the cell runs, and nothing between cells.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from _common import machine_line, process_tree as tree  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def sample(pids: list[int]) -> tuple[dict[int, float], int, int]:
    """CPU seconds per process, and the tree's PSS and RSS in bytes."""
    cpu, pss, rss = {}, 0, 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu[pid] = (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
            rss += int(fields[21]) * PAGE
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
                    break
        except (OSError, IndexError, ValueError):
            continue
    return cpu, pss, rss


def idle_server(seconds: float = 5.0) -> dict:
    """An idle ``jupyter server`` from the course's venv: its memory after it answered."""
    from _servers import get
    from helpers._runtime.spec import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as home:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "jupyter"), "server", "--no-browser", f"--port={port}",
             "--ServerApp.ip=127.0.0.1", "--IdentityProvider.token=bench", f"--ServerApp.root_dir={home}",
             "--ServerApp.port_retries=0", *(["--allow-root"] if os.geteuid() == 0 else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if get(f"http://127.0.0.1:{port}/api/status?token=bench")[0] == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.3)
            time.sleep(seconds)
            _, pss, rss = sample(tree(proc.pid))
        finally:
            proc.terminate()
            proc.wait(30)
    return {"pss_mb": round(pss / 2**20), "rss_mb": round(rss / 2**20)}


def run_lesson(lesson: str) -> dict:
    """The lesson's instructor notebook executed in a fresh kernel, its process tree sampled throughout."""
    import threading

    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "solutions" / lesson)}})
    seen: dict[int, float] = {}
    peak = {"pss": 0, "rss": 0}
    per_second: list[tuple[float, float]] = []
    done = threading.Event()

    def watch(kernel_pid: int) -> None:
        last_t, last_cpu = time.monotonic(), 0.0
        while not done.is_set():
            cpu, pss, rss = sample(tree(kernel_pid))
            seen.update(cpu)
            peak["pss"], peak["rss"] = max(peak["pss"], pss), max(peak["rss"], rss)
            now, total = time.monotonic(), sum(seen.values())
            if now - last_t >= 1.0:
                per_second.append((now - last_t, total - last_cpu))
                last_t, last_cpu = now, total
            time.sleep(0.2)

    with client.setup_kernel():
        kernel_pid = client.km.provisioner.process.pid
        watcher = threading.Thread(target=watch, args=(kernel_pid,), daemon=True)
        started = time.monotonic()
        watcher.start()
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        wall = time.monotonic() - started
        done.set()
        watcher.join()
    cpu = sum(seen.values())
    busiest = max((c / w for w, c in per_second), default=0.0)
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "busy_cores_mean": round(cpu / wall, 2),
            "busy_cores_peak_1s": round(busiest, 2), "peak_pss_mb": round(peak["pss"] / 2**20),
            "peak_rss_mb": round(peak["rss"] / 2**20), "processes_seen": len(seen)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lesson", default="04-ring-all-reduce")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    print(machine_line(), flush=True)
    server = idle_server()
    print(f"idle Jupyter server: PSS {server['pss_mb']} MB, RSS {server['rss_mb']} MB", flush=True)
    run = run_lesson(args.lesson)
    print(f"{args.lesson}, every cell in a fresh kernel: {run['wall_s']} s wall, {run['cpu_s']} CPU s "
          f"({run['busy_cores_mean']} cores busy on average, {run['busy_cores_peak_1s']} at the busiest second), "
          f"peak kernel + ranks PSS {run['peak_pss_mb']} MB (RSS {run['peak_rss_mb']} MB), "
          f"{run['processes_seen']} processes", flush=True)
    total = server["pss_mb"] + run["peak_pss_mb"]
    print(f"one learner's server at its peak: about {total} MB (PSS, server + kernel + ranks)")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_line(), "lesson": args.lesson, "idle_server": server,
                                         "lesson_run": run, "peak_total_pss_mb": total}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
