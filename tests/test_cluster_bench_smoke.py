"""Smoke test for bench/cluster_bench.py: it runs end to end and writes well-formed JSON.

This checks only that the benchmark works, never how fast anything is: the timing target
is judged by running the benchmark itself (``make bench-cluster``), not by a timed test.
"""

from __future__ import annotations

from _bench import run_bench


def test_cluster_bench_runs_and_writes_json(tmp_path):
    """Does the benchmark run with tiny repeats (through a real kernel too), print its table and RESULT line, and write every measurement as JSON?"""
    stdout, data = run_bench("cluster_bench.py", "--repeats", "3", "--launch-repeats", "1", "--world-size", "2",
                             "--warmup", "1", json_path=tmp_path / "cluster_bench.json")
    assert "RESULT: " in stdout
    assert "(a) empty %%distributed cell, in-kernel" in stdout

    assert data["settings"]["world_size"] == 2
    results = data["results"]
    for key, n in [("shell_cell", 3), ("kernel_cell", 3), ("kernel_baseline", 3), ("cluster_run", 3), ("launch_warm", 1)]:
        entry = results[key]
        assert entry["n"] == n == len(entry["samples"]), key
        assert 0 < entry["min"] <= entry["median"] <= entry["max"], (key, entry)
    assert [t["passed"] in (True, False) for t in data["targets"]] == [True]
    assert data["passed"] in (True, False)
