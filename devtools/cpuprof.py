"""CPU seconds per test, children included: where the suite's time really goes on a busy machine.

pytest's ``--durations`` gives wall time, which on 2 cores shared by two pytest-xdist workers
says little: a test that waits looks as slow as one that computes, and a test whose work runs in
processes it starts (kernels, ranks, grading workers, a hub) looks cheap. This plugin puts each
pytest process (each xdist worker) in a cgroup of its own (cgroup v1's ``cpuacct``, which the
processes it starts inherit) and writes, for every test, the CPU seconds that cgroup used while
the test ran and its wall seconds, one JSON line per test::

    make test PYTEST_ARGS="-p devtools.cpuprof --cpu-profile=cpu-profile"
    .venv/bin/python -m devtools.cpuprof cpu-profile        # totals per module, then the costliest tests

Processes a test leaves running are counted with the next test of the same worker. It needs
root and a writable ``/sys/fs/cgroup/cpuacct`` (this course's CI machines have both); elsewhere it
says why once and measures nothing.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_state: dict[str, Any] = {}


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--cpu-profile", metavar="DIR", default=None,
                     help="write each test's CPU seconds (its processes included) to DIR/<worker>.jsonl")


def why_not() -> str | None:
    """Why CPU cannot be counted per test here, or None when it can."""
    if not (CPUACCT / "cpuacct.usage").is_file():
        return f"no cgroup v1 cpuacct at {CPUACCT} (cgroup v2 only, or not mounted)"
    if not os.access(CPUACCT, os.W_OK):
        return f"{CPUACCT} is not writable by this user: run as root"
    return None


def pytest_configure(config: Any) -> None:
    folder = config.getoption("--cpu-profile", default=None)
    if not folder:
        return
    reason = why_not()
    if reason is not None:
        print(f"devtools.cpuprof: not counting CPU per test: {reason}", file=sys.stderr)
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None and getattr(config.option, "numprocesses", None):
        return  # the pytest-xdist controller runs no test: its workers count
    worker = worker or "main"
    group = CPUACCT / f"course-cpuprof-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    Path(folder).mkdir(parents=True, exist_ok=True)
    _state.update(group=group, out=open(Path(folder) / f"{worker}.jsonl", "a", encoding="utf-8"))


def pytest_unconfigure(config: Any) -> None:
    group = _state.pop("group", None)
    if group is None:
        return
    _state.pop("out").close()
    try:
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        group.rmdir()  # fails while a process it started still runs: then the cgroup stays, harmless
    except OSError:
        pass


def _usage() -> float:
    return int((_state["group"] / "cpuacct.usage").read_text()) / 1e9


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any):
    if "group" not in _state:
        yield
        return
    cpu, start = _usage(), time.time()
    yield
    record = {"test": item.nodeid, "cpu": round(_usage() - cpu, 2), "wall": round(time.time() - start, 2),
              "start": round(start, 2)}
    _state["out"].write(json.dumps(record) + "\n")
    _state["out"].flush()


def summary(folder: Path, top: int = 25) -> str:
    """Totals per test module (CPU, wall, tests), then the ``top`` tests by CPU, from every worker's file."""
    rows = [json.loads(line) for path in sorted(Path(folder).glob("*.jsonl"))
            for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        return f"no test was counted in {folder}"
    cpu, wall, count = collections.Counter(), collections.Counter(), collections.Counter()
    for row in rows:
        module = row["test"].split("::")[0]
        cpu[module] += row["cpu"]
        wall[module] += row["wall"]
        count[module] += 1
    lines = [f"{sum(r['cpu'] for r in rows):.0f} CPU seconds and {sum(r['wall'] for r in rows):.0f} test-seconds of "
             f"wall time over {len(rows)} tests", "", f"{'CPU s':>8} {'wall s':>8} {'tests':>6}  module"]
    lines += [f"{cpu[m]:8.1f} {wall[m]:8.1f} {count[m]:6d}  {m}" for m, _ in cpu.most_common()]
    lines += ["", f"{'CPU s':>8} {'wall s':>8}  test"]
    lines += [f"{r['cpu']:8.1f} {r['wall']:8.1f}  {r['test']}" for r in sorted(rows, key=lambda r: -r["cpu"])[:top]]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m devtools.cpuprof DIR   (the folder given to --cpu-profile)")
    print(summary(Path(sys.argv[1])))
