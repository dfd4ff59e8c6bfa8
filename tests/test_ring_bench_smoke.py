"""Smoke test for bench/ring_bench.py: it runs at tiny sizes and prints and writes what it should.

This checks only that the benchmark works and that its three all-reduces give the right sums
(the script checks them on every call), never how fast anything is: the 20% target is judged
by running the benchmark itself (``make bench-ring``), not by a timed test.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "ring_bench.py"


def test_ring_bench_prints_a_ratio_per_size_and_writes_json(tmp_path):
    """At 4 KB and 64 KB on 2 ranks, does it print one row per size with both ratios and a verdict, and the same in JSON?"""
    out = tmp_path / "ring.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "4K,64K", "--world-sizes", "2", "--repeats", "1", "--piece", "1K",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = re.findall(r"^\s+(\d+ [KM]?B)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+([\d.]+)x\s+(PASS|FAIL)$",
                      proc.stdout, re.M)
    assert [r[0] for r in rows] == ["4 KB", "64 KB"], proc.stdout
    assert re.search(r"^(PASS|FAIL): pipelined ring within 20% of gloo", proc.stdout, re.M), proc.stdout

    data = json.loads(out.read_text())
    assert data["target"] == 0.8 and data["piece"] == 1024
    results = data["results"]
    assert [(r["world_size"], r["size"]) for r in results] == [(2, 4096), (2, 65536)]
    for r in results:
        assert set(r["seconds"]) == {"gloo", "ring", "pipelined"}
        assert all(t > 0 for t in r["seconds"].values())
        assert r["ratio"]["pipelined"] == r["busbw"]["pipelined"] / r["busbw"]["gloo"]
        assert r["passed"] == (r["ratio"]["pipelined"] >= 0.8)
