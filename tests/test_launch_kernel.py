"""Tests of ``helpers.launch`` run from cells of a real Jupyter kernel (ipykernel, this venv).

These check what only a notebook shows: functions and classes defined in cells, what the
cell's iopub stream carries (nothing on stderr), how errors render, the stop button, and
that nothing outlives the kernel. The tests that keep the kernel usable share one kernel.
"""

from __future__ import annotations

import textwrap

import pytest

from conftest import children_of, descendants_of, is_gone, proc_state, start_kernel, wait_until

pytestmark = pytest.mark.slow

SETUP = """
import torch
import torch.distributed as dist
import helpers
from helpers import launch
import helpers._runtime.factory as f
print(f.get_factory().pid)
"""


@pytest.fixture(scope="module")
def kernel():
    """One kernel with helpers imported and its rank factory warm; ``kernel.factory_pid`` is set."""
    k = start_kernel()
    try:
        k.factory_pid = int(k.run(SETUP, timeout=120).split()[-1])
        assert proc_state(k.factory_pid) in ("R", "S", "D")
        yield k
    finally:
        k.close()


@pytest.fixture
def no_ranks_left(kernel):
    """No process may remain under the kernel's rank factory after the test."""
    yield
    left = descendants_of(kernel.factory_pid)
    assert left == [], f"rank processes left under the kernel's factory: {left}"


def cell(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


def test_notebook_function_closure_and_class_run_on_4_ranks(kernel, no_ranks_left):
    """Do a cell's function, a closure over a notebook variable, and a notebook-defined class all work on 4 ranks?"""
    kernel.run(
        cell(
            """
            offset = 100.0

            class Accumulator:
                def __init__(self, start):
                    self.total = start
                def add(self, x):
                    self.total += x
                    return self

            def plain(rank, world_size):
                t = torch.tensor([rank + 1.0])
                dist.all_reduce(t)
                return t.item()

            def make_closure(k):
                def closed(rank, world_size):
                    return rank * k + offset
                return closed

            def uses_class(rank, world_size):
                return Accumulator(rank).add(10)
            """
        )
    )
    values = kernel.value(
        "(launch(plain, 4, output='quiet', backend='gloo'), launch(make_closure(3), 4, output='quiet'), "
        "[(type(a).__name__, a.total) for a in launch(uses_class, 4, output='quiet')])"
    )
    assert values == (
        [10.0] * 4,
        [100.0, 103.0, 106.0, 109.0],
        [("Accumulator", 10 + r) for r in range(4)],
    )


def test_worker_stderr_never_reaches_the_cells_stderr(kernel, no_ranks_left):
    """Do a worker's print(file=sys.stderr), os.write(2, ...) and warnings.warn arrive as labelled stdout, with no stderr stream message in the cell?"""
    out = kernel.execute(
        cell(
            """
            def noisy(rank, world_size):
                import os, sys, warnings
                print(f"py-err {rank}", file=sys.stderr)
                os.write(2, f"c-err {rank}\\n".encode())
                warnings.warn(f"careful {rank}")
                print(f"py-out {rank}")
                return rank

            result = launch(noisy, 4)
            """
        )
    )
    assert out["error"] is None and out["status"] == "ok"
    assert out["stderr_messages"] == [], f"stderr in the cell: {out['stderr']!r}"
    lines = out["stdout"].splitlines()
    for rank in range(4):
        assert f"[rank {rank}] py-out {rank}" in lines
        assert f"[rank {rank}:err] py-err {rank}" in lines
        assert f"[rank {rank}:err] c-err {rank}" in lines
        warning = [line for line in lines if f"careful {rank}" in line]
        assert warning and all(line.startswith(f"[rank {rank}:err] ") for line in warning)


def test_rank_error_renders_with_the_cell_line_and_the_kernel_stays_usable(kernel, no_ranks_left):
    """Does a rank's exception show as RankFailedError pointing at 'Cell In[N]' and the raising line, with the kernel usable after?"""
    out = kernel.execute(
        cell(
            """
            def broken(rank, world_size):
                if rank == 1:
                    raise ValueError("bad shape in a cell")
                dist.barrier()

            launch(broken, 4)
            """
        )
    )
    error = out["error"]
    assert error is not None and error["ename"] == "RankFailedError"
    assert "rank 1 of 4 raised ValueError: bad shape in a cell" in error["evalue"]
    traceback = "\n".join(error["traceback"])
    assert f"Cell In[{out['execution_count']}], line 3" in traceback, traceback
    assert 'raise ValueError("bad shape in a cell")' in traceback
    # The launcher's own frames are not shown, only the rank's.
    assert "launcher.py" not in traceback and "_runtime" not in traceback
    assert out["stderr_messages"] == []
    assert kernel.value("1 + 1") == 2


def test_interrupt_stops_the_ranks_and_the_kernel_stays_usable(kernel, no_ranks_left):
    """Does the stop button (a kernel interrupt) end a launch of sleeping ranks within 5 s, leave no rank behind, and keep the kernel usable?"""
    out = kernel.execute(
        cell(
            """
            def sleeper(rank, world_size):
                import time
                print(f"sleeping {rank}", flush=True)
                time.sleep(60)

            launch(sleeper, 3)
            """
        ),
        timeout=40,
        interrupt_after=2.0,
        # ...and not before every rank sleeps, however slowly they start.
        interrupt_when=lambda out: all(f"sleeping {r}" in out for r in range(3)),
    )
    # One line, a KeyboardInterrupt that says what was stopped, not a traceback through the helpers.
    assert out["error"] is not None and out["error"]["ename"] == "Interrupted", out["error"]
    assert out["error"]["evalue"] == "the launch was interrupted; stopped ranks 0, 1, 2.", out["error"]
    assert len(out["error"]["traceback"]) == 1 and "KeyboardInterrupt" in out["error"]["traceback"][0], out["error"]
    assert out["finished_at"] - kernel.interrupted_at < 5.0
    for rank in range(3):
        assert f"[rank {rank}] sleeping {rank}" in out["stdout"]  # they had started
    assert "Interrupted: stopped ranks 0, 1, 2." in out["stdout"]
    assert descendants_of(kernel.factory_pid) == []
    assert kernel.value("launch(plain, 2, output='quiet', backend='gloo')") == [3.0, 3.0]


@pytest.mark.parametrize("how", ["kill", "shutdown"])
def test_ranks_and_factory_die_with_the_kernel(make_kernel, how):
    """When the kernel is killed (or shut down) while ranks run, are its factory and ranks gone within 5 s?"""
    k = make_kernel()
    factory = int(
        k.run(
            cell(
                """
                import threading, helpers, helpers._runtime.factory as f

                def sleeper(rank, world_size):
                    import time
                    time.sleep(60)

                threading.Thread(target=helpers.launch, args=(sleeper, 2),
                                 kwargs=dict(output="quiet", timeout=120), daemon=True).start()
                print(f.get_factory().pid)
                """
            ),
            timeout=120,
        ).split()[-1]
    )
    assert wait_until(lambda: len(children_of(factory)) == 2, 20), children_of(factory)
    pids = [factory, *children_of(factory)]
    assert all(proc_state(pid) in ("R", "S", "D") for pid in pids)

    if how == "kill":
        k.km.shutdown_kernel(now=True)  # SIGKILL to the kernel process
    else:
        k.km.shutdown_kernel(now=False)  # a shutdown request; the kernel exits by itself
    assert not k.km.is_alive()

    assert wait_until(lambda: all(is_gone(pid) for pid in pids), 5.0), {pid: proc_state(pid) for pid in pids}
