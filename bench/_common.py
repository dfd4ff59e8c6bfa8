"""What every benchmark prints about the machine it ran on (light: no torch import)."""

from __future__ import annotations

import os
import platform
import statistics
import sys

__all__ = ["loadavg", "machine", "machine_line", "stats"]


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
