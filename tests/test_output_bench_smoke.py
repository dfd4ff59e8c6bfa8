"""Smoke tests of the tools that hunt the lost line: bench/output_bench.py and `make soak`.

They check that the tools work and count right, never how fast anything is.
"""

from __future__ import annotations

import json
import subprocess
import sys

from _bench import ROOT, run_bench


def test_output_bench_counts_every_line_in_its_own_cell(tmp_path):
    """Do six cells, each meeting the race on purpose (slowed wait, ranks settling first), with
    one busy process beside, show each of their eight lines in their own cell, counted so?"""
    stdout, data = run_bench("output_bench.py", "--cells", "6", "--load", "1", "--slow-poll", "0.2",
                             "--settle", "0.05", json_path=tmp_path / "output_bench.json")
    result = data["results"]
    assert result["lines"] == 8  # cells to ranks [0, 1], [0], [1], twice
    assert (result["in_own_cell"], result["missing"], result["misplaced"], result["lost"]) == (8, 0, 0, 0), stdout
    assert data["passed"] is True and "RESULT: PASS 0 of 8" in stdout


def test_soak_runs_a_group_and_writes_its_summary(tmp_path):
    """Does `python -m devtools.soak` run a group the number of times asked, beside busy
    processes, and write what each run gave?"""
    done = subprocess.run([sys.executable, "-m", "devtools.soak", "--runs", "2", "--load", "1", "--groups", "output",
                           "--out", str(tmp_path), "--", "-k", "closed or bigger"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["group"], r["run"], r["exit"]) for r in summary["records"]] == [("output", 1, 0), ("output", 2, 0)]
    assert "output   2/2 green" in done.stdout


def test_soak_counts_a_run_that_ran_no_test_as_failed(tmp_path):
    """A run in which pytest found nothing to run is no green run: is it reported failed, with exit 1?"""
    done = subprocess.run([sys.executable, "-m", "devtools.soak", "--runs", "1", "--load", "0", "--groups", "output",
                           "--out", str(tmp_path), "--", "-k", "no_test_is_called_this"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "output   0/1 green" in done.stdout and "failed: output run 1" in done.stdout
