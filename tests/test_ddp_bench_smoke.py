"""Smoke test for bench/ddp_bench.py: it runs all four ways and writes well-formed JSON.

This checks only that the benchmark works, never how fast anything is: the figures are
judged by running the benchmark itself (``make bench-ddp``), not by a timed test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ddp_bench_runs_and_writes_json(tmp_path):
    """Does the lesson-06 step benchmark run all four ways with tiny settings, print its RESULT line and write positive timings?"""
    out = tmp_path / "ddp_bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ddp_bench.py"), "--steps", "1", "--rounds", "1", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RESULT: step ms" in proc.stdout
    data = json.loads(out.read_text(encoding="utf-8"))
    assert set(data["results"]["step_s"]) == {"no communication", "after backward", "MiniDDP", "DDP"}
    assert all(t > 0 for t in data["results"]["step_s"].values())
    assert set(data["results"]["hidden"]) == {"MiniDDP", "DDP"}
