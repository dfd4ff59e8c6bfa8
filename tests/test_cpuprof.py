"""devtools/cpuprof.py: CPU seconds per test, counted with the processes a test starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devtools import cpuprof

ROOT = Path(__file__).resolve().parent.parent

SPINS = '''
import subprocess, sys, time

def test_spins_in_a_child():
    subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 1.0\\nwhile time.process_time() < end: pass"], check=True)

def test_sleeps():
    time.sleep(1.0)
'''


@pytest.mark.skipif(cpuprof.why_not() is not None, reason=f"CPU cannot be counted per test here: {cpuprof.why_not()}")
def test_a_childs_cpu_counts_for_its_test_and_a_sleep_does_not(tmp_path):
    """Does a test whose child process computes for a second get about a second of CPU, one that sleeps for a
    second nearly none (both a second of wall time), and does the summary list the module?"""
    (tmp_path / "test_spin.py").write_text(SPINS)
    before = set(cpuprof.CPUACCT.glob("course-cpuprof-*"))  # a run that profiles this suite has its own
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                           "-p", "devtools.cpuprof", f"--cpu-profile={tmp_path / 'prof'}", str(tmp_path / "test_spin.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {r["test"].split("::")[1]: r for r in map(json.loads, (tmp_path / "prof" / "main.jsonl").read_text().splitlines())}
    assert rows["test_spins_in_a_child"]["cpu"] >= 0.9 and rows["test_spins_in_a_child"]["wall"] >= 0.9, rows
    assert rows["test_sleeps"]["cpu"] < 0.3 and rows["test_sleeps"]["wall"] >= 1.0, rows
    assert "test_spin.py" in cpuprof.summary(tmp_path / "prof")
    assert set(cpuprof.CPUACCT.glob("course-cpuprof-*")) <= before, "the cgroup of a finished run was left behind"
