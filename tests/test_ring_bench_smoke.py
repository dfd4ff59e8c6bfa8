"""Smoke test for bench/ring_bench.py: it runs at tiny sizes and prints and writes what it should.

This checks only that the benchmark works and that its four all-reduces give the right sums
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
    """At 4 KB and 64 KB on 2 ranks and 64 KB on 4, does it print one row per size with the three ratios and a
    verdict, judge only the 4-rank rows from 4 MB up (none here), and write the same, every round included, as JSON?"""
    out = tmp_path / "ring.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "4K,64K", "--world-sizes", "2,4", "--repeats", "2", "--piece", "1K",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    number = r"\s+([\d.]+)"
    rows = re.findall(r"^\s+(\d+ [KM]?B)" + number * 4 + r"\s+([\d.]+)x" * 3 + r"\s+(within|below)$", proc.stdout, re.M)
    assert [r[0] for r in rows] == ["4 KB", "64 KB"] * 2, proc.stdout
    assert "No size measured falls under the target (4 ranks, 4 MB to 64 MB): nothing judged." in proc.stdout
    assert re.search(r"^Other rows: \d of 4 within 20% of gloo\.$", proc.stdout, re.M), proc.stdout

    data = json.loads(out.read_text())
    assert data["target"] == 0.8 and data["piece"] == 1024 and data["repeats"] == 2
    results = data["results"]
    assert [(r["world_size"], r["size"]) for r in results] == [(2, 4096), (2, 65536), (4, 4096), (4, 65536)]
    for r in results:
        assert set(r["seconds"]) == {"gloo", "ring", "ahead", "pipelined"}
        assert all(len(v) == 2 and all(t > 0 for t in v) for v in r["samples"].values())
        assert all(t > 0 for t in r["seconds"].values())
        assert set(r["ratio"]) == {"ring", "ahead", "pipelined"}
        assert not r["judged"] and r["passed"] == (r["ratio"]["pipelined"] >= 0.8)


def test_ring_bench_docstring_examples_run():
    """Do the examples in bench/ring_bench.py (sizes, batches, the judged rows, the paired ratios) give what they show?"""
    import doctest
    import importlib.util

    spec = importlib.util.spec_from_file_location("ring_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = doctest.testmod(module)
    assert result.attempted >= 5 and result.failed == 0
