"""Running a benchmark of bench/ the way its smoke test does (tests/test_*bench_smoke.py).

A smoke test checks that a benchmark works, never how fast anything is: :func:`run_bench`
runs the script with tiny settings from the repository root, with this interpreter, and
hands back what it printed and the JSON it wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

__all__ = ["ROOT", "run_bench"]

ROOT = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str, json_path: Path, timeout: float = 120) -> tuple[str, dict]:
    """Run ``bench/SCRIPT ARGS --json JSON_PATH``; return its stdout and the JSON it wrote.

    Asserts that it exits with 0 and that the JSON holds the parts of a report with targets
    (machine, settings, results, targets, passed), as launch_bench.py and cluster_bench.py write it.
    """
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args, "--json", str(json_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(json_path.read_text(encoding="utf-8"))
    assert set(data) >= {"machine", "settings", "results", "targets", "passed"}
    return proc.stdout, data
