"""What the benchmarks share (light: no torch import, so a benchmark's baseline pays for none).

- The machine a benchmark ran on, and how busy it was: :func:`machine`, :func:`machine_line`,
  :func:`loadavg`, and :class:`CpuWatch` (the CPU other processes took while it measured).
- Timings: :func:`stats` (median, min, max of samples).
- Command line and output: :func:`parse_args` (adds ``--json`` and checks counts),
  :func:`say` (progress on stderr, so stdout keeps the table), :func:`save_json`.

Example::

    >>> stats([0.3, 0.1, 0.2])["median"]
    0.2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

__all__ = ["loadavg", "machine", "machine_line", "stats", "CpuWatch", "NOISY_SHARE", "say", "parse_args", "save_json",
           "process_tree"]


def stats(samples: list[float]) -> dict:
    """Median, min, max and count of timings (seconds), with the samples."""
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
        "samples": list(samples),
    }


def loadavg() -> float | None:
    """The 1-minute load average, or None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def machine() -> dict:
    """CPU model, cores, Python and torch versions (torch read from its metadata, not imported)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    try:
        from importlib.metadata import version

        torch_version = version("torch")
    except Exception:  # noqa: BLE001
        torch_version = "unknown"
    return {
        "cpu_model": cpu,
        "cores": os.cpu_count() or 1,
        "usable_cores": usable,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "torch": torch_version,
        "platform": platform.platform(),
    }


def machine_line() -> str:
    """One line for a report's header."""
    m = machine()
    return f"{m['cpu_model']}, {m['cores']} cores, Python {m['python']}, torch {m['torch']}"


#: A phase is noisy when other processes used more than this share of the machine meanwhile.
NOISY_SHARE = 0.05


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
    def phase(self, name: str) -> Iterator[None]:
        """Record, under ``name``, the wall time of the block and the CPU others used during it."""
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


def say(text: str = "") -> None:
    """Progress, on stderr: stdout carries only the report."""
    print(text, file=sys.stderr, flush=True)


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None,
               at_least: Sequence[tuple[str, int]] = ()) -> argparse.Namespace:
    """Add ``--json PATH`` to a benchmark's ``parser``, parse ``argv``, and check each
    ``(option, minimum)`` of ``at_least`` (``("world_size", 1)``: ``--world-size`` must be 1 or more)."""
    parser.add_argument("--json", metavar="PATH", help="also write all numbers as JSON to PATH")
    args = parser.parse_args(argv)
    for name, minimum in at_least:
        if getattr(args, name) < minimum:
            parser.error(f"--{name.replace('_', '-')} must be {minimum} or more")
    return args


def save_json(path: str, data: dict) -> Path:
    """Write ``data`` as indented JSON to ``path`` (creating its folder); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(k) for k in f.read().split())
        except OSError:
            continue
    return out
