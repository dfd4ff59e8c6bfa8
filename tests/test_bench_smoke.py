"""Smoke test for bench/launch_bench.py: it runs and writes well-formed JSON.

This checks only that the benchmark works, never how fast anything is: timing targets are
judged by running the benchmark itself (``make bench``), not by a timed test.
"""

from __future__ import annotations

from _bench import run_bench


def _positive_stats(entry: dict, n_expected: int) -> None:
    assert set(entry) >= {"median", "min", "max", "n", "samples"}
    assert entry["n"] == n_expected == len(entry["samples"])
    for key in ("median", "min", "max"):
        assert isinstance(entry[key], float) and entry[key] > 0, (key, entry)
    assert all(s > 0 for s in entry["samples"])
    assert entry["min"] <= entry["median"] <= entry["max"]


def test_bench_runs_and_writes_json(tmp_path):
    """Does the benchmark run with tiny repeats and no baselines, print its RESULT line, and write every timing and target as JSON?"""
    stdout, data = run_bench("launch_bench.py", "--repeats", "2", "--cold-repeats", "1", "--notebook-repeats", "1",
                             "--no-baselines", json_path=tmp_path / "bench.json")
    assert "RESULT:" in stdout

    assert set(data["machine"]) >= {"cpu_model", "cores", "python", "torch"}
    assert data["machine"]["cores"] > 0

    results = data["results"]
    assert set(results) >= {"cold", "notebook", "warm", "spawn", "torchrun", "ratio_spawn_over_warm"}
    assert results["spawn"] is None and results["torchrun"] is None  # --no-baselines
    for n in ("2", "4"):
        cold = results["cold"][n]
        _positive_stats(cold["launch_s"], 1)
        _positive_stats(cold["process_s"], 1)
        assert isinstance(cold["torch_imported_before_launch"], bool)
        assert isinstance(cold["torch_imported_after_launch"], bool)
        _positive_stats(results["warm"][n], 2)
        _positive_stats(results["notebook"][n]["setup_s"], 1)
        _positive_stats(results["notebook"][n]["first_launch_s"], 1)

    names = [t["name"] for t in data["targets"]]
    assert any("warm" in name for name in names) and any("cold" in name for name in names)
    for target in data["targets"]:
        assert target["passed"] in (True, False, None)
