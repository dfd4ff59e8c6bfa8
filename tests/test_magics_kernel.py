"""Tests of the ``%%distributed`` magics through a real Jupyter kernel (jupyter_client).

One kernel is shared by the module (starting one costs seconds); every test uses its own
variable names. The kernel has no ``JPY_SESSION_NAME``, like nbclient and nbgrader, so the
ranks' output is plain ``[rank N] ...`` text; one test forces the widget view. The last
test shuts the kernel down and checks that nothing of ours is left running.

The kernel's wait for its ranks is slowed by 0.2 s (:mod:`devtools.slowpoll`) whenever it
wakes: a rank that prints and replies in that gap is the race that once moved a rank's line
into the next cell, so every cell here meets it often, and one test every time.
"""

from __future__ import annotations


import pytest

from conftest import Kernel, is_gone, start_kernel, wait_until

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
RANK_PIDS = "[s['pid'] for s in __import__('helpers.magics', fromlist=['current']).current().status()]"


class _Shared:
    """The module's kernel, started on first use (and again if a test shut it down)."""

    def __init__(self) -> None:
        self.kernel: Kernel | None = None

    def get(self) -> Kernel:
        if self.kernel is None or not self.kernel.km.is_alive():
            self.kernel = start_kernel()
            self.kernel.run(
                "import os\n"
                "os.environ.pop('HELPERS_VIEW', None)\n"
                "os.environ.pop('JPY_SESSION_NAME', None)\n"
                "import devtools.slowpoll\n"
                "devtools.slowpoll.install(0.2)\n"
                "%load_ext helpers"
            )
        return self.kernel

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.close()
            self.kernel = None


@pytest.fixture(scope="module")
def shared():
    holder = _Shared()
    yield holder
    holder.close()


@pytest.fixture
def kernel(shared) -> Kernel:
    """The shared kernel with 2 ranks running (started if needed)."""
    k = shared.get()
    k.run("%dist_start -n 2")  # says "already running" when they are
    return k


def labelled(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("[rank ")]


def traceback_text(out: dict) -> str:
    err = out["error"] or {}
    return "\n".join(err.get("traceback", [])) + "\n" + str(err.get("evalue", ""))


# --------------------------------------------------------------------------- the basics


def test_distributed_before_dist_start_starts_2_ranks_with_one_line(shared):
    """Does a %%distributed cell run before %dist_start start 2 ranks, with a single one-line notice?"""
    k = shared.get()
    k.run("%dist_stop")
    out = k.run("%%distributed\nauto_started = world_size\nprint('hello from', rank)")
    lines = out.splitlines()
    notices = [line for line in lines if not line.startswith("[rank ")]
    assert len(notices) == 1, out
    assert notices[0].startswith("No ranks were running: starting 2")
    assert "[rank 0] hello from 0" in lines and "[rank 1] hello from 1" in lines
    assert "No ranks were running" not in k.run("%%distributed\nauto_started")  # only once


def test_state_persists_across_cells_and_last_expression_is_shown(kernel):
    """Do variables set in one %%distributed cell survive to the next, and does a last expression show as [rank N] Out: on each rank?"""
    assert kernel.run("%%distributed\nkept_val = rank * 3") == ""
    out = kernel.run("%%distributed\nkept_val += 1\nprint('kept_val is', kept_val)")
    assert sorted(labelled(out)) == ["[rank 0] kept_val is 1", "[rank 1] kept_val is 4"]
    out = kernel.run("%%distributed\nkept_val * 10")
    assert "[rank 0] Out: 10" in out.splitlines() and "[rank 1] Out: 40" in out.splitlines()
    # A cell ending in a statement shows no Out: line.
    assert "Out:" not in kernel.run("%%distributed\nkept_other = kept_val")


def test_isend_in_one_cell_recv_in_the_next(kernel):
    """Can rank 0 isend in one cell (--ranks 0), rank 1 recv in the next (--ranks 1), and rank 0 then wait?"""
    out = kernel.run("%%distributed --ranks 0\nbuf = torch.arange(3.0)\nreq = dist.isend(buf, 1)")
    assert out == ""
    out = kernel.run(
        "%%distributed --ranks 1\ninbox = torch.zeros(3)\ndist.recv(inbox, 0)\nprint('got', inbox.tolist())"
    )
    assert labelled(out) == ["[rank 1] got [0.0, 1.0, 2.0]"], out  # the whole stdout, to see what came instead
    out = kernel.run("%%distributed --ranks 0\nreq.wait()\nreq.is_completed()")
    assert labelled(out) == ["[rank 0] Out: True"]


def test_every_line_lands_in_its_own_cell(kernel):
    """Each rank waits a moment, prints and replies while the kernel's slowed wait is in its
    gap: does each cell show its own lines, and none of the cell before?"""
    for i, ranks in enumerate(["0", "1", "0,1", "1", "0"]):
        out = kernel.run(f"%%distributed --ranks {ranks}\nimport time; time.sleep(0.05)\nprint('cell {i} on rank', rank)")
        expected = [f"[rank {r}] cell {i} on rank {r}" for r in map(int, ranks.split(","))]
        assert sorted(labelled(out)) == expected, out


def test_output_is_labelled_and_nothing_reaches_stderr(kernel):
    """Is every line a rank prints, to stdout, stderr or straight to fd 2, labelled [rank N] on stdout, with no stderr stream message at all?"""
    out = kernel.execute(
        "%%distributed\n"
        "import os, sys\n"
        "print('plain', rank)\n"
        "print('warning', rank, file=sys.stderr)\n"
        "os.write(2, f'raw fd2 {rank}\\n'.encode())\n"
    )
    assert out["status"] == "ok" and out["error"] is None
    assert out["stderr_messages"] == [] and out["stderr"] == ""
    lines = out["stdout"].splitlines()
    assert lines and all(line.startswith("[rank ") for line in lines), lines
    for r in (0, 1):
        assert f"[rank {r}] plain {r}" in lines
        assert f"[rank {r}:err] warning {r}" in lines
        assert f"[rank {r}:err] raw fd2 {r}" in lines


def test_dist_status_shows_idle_ranks(kernel):
    """Does %dist_status list every rank as idle, with its pid?"""
    out = kernel.run("%dist_status")
    assert "2 ranks on gloo" in out
    for r in (0, 1):
        assert f"rank {r}: idle (pid " in out


# --------------------------------------------------------------------------- failures


def test_exception_on_one_rank_errors_the_cell_with_its_line(kernel):
    """Does an exception on rank 1 make the cell error, naming rank 1 and pointing at 'Cell In[' for the line, while the ranks keep their variables?"""
    kernel.run("%%distributed\nbefore_error = rank + 100")
    out = kernel.execute("%%distributed\nx = 1\nif rank == 1:\n    raise ValueError('boom on one')")
    assert out["status"] == "error"
    assert out["error"]["ename"] == "RankFailedError"
    text = traceback_text(out)
    assert "rank 1 of 2 raised ValueError: boom on one" in text
    # The cell as the notebook shows it: its own number, and line 4 counting the %%distributed line.
    assert f"Cell In[{out['execution_count']}], line 4" in text and "raise ValueError('boom on one')" in text, text
    assert out["stderr_messages"] == []
    out = kernel.run("%%distributed\nbefore_error")
    assert "[rank 0] Out: 100" in out and "[rank 1] Out: 101" in out


def test_hang_times_out_and_dist_restart_gives_working_ranks(kernel):
    """Does a recv-first deadlock in a cell with --timeout 30 error the cell as a DeadlockError (found as it forms,
    so before the timeout) naming recv, and does %dist_restart then give working ranks?"""
    # A DeadlockError is raised only before the timeout, at which the cell would end with a plain
    # LaunchTimeoutError: its name is the check that the cell did not wait for the timeout. (A bound on the
    # cell's seconds said the same, but depended on the machine's load; --timeout 2 made the deadlock race it.)
    out = kernel.execute("%%distributed --timeout 30\nt = torch.zeros(1)\ndist.recv(t, 1 - rank)", timeout=90)
    assert out["status"] == "error" and out["error"]["ename"] == "DeadlockError", out["error"]  # a LaunchTimeoutError
    error = "__import__('sys').last_value"
    assert kernel.value(f"({error}.timeout, {error}.ranks)") == (30.0, [0, 1])  # the cell's --timeout
    assert "recv" in traceback_text(out)
    where = f"at Cell In[{out['execution_count']}], line 3, in <module>: dist.recv(t, 1 - rank)"
    if where not in traceback_text(out):  # say what the ranks' stacks held, to find out why
        stacks = kernel.run("import sys; print(repr(getattr(sys.last_value, 'stacks', None)))")
        pytest.fail(f"the report does not point at the cell ({where!r}):\n{out['error']['evalue']}\nstacks: {stacks}")
    assert "busy" in kernel.run("%dist_status")
    refused = kernel.execute("%%distributed\n1")
    assert refused["status"] == "error" and refused["error"]["ename"] == "ClusterError"
    assert "restart" in traceback_text(refused)

    kernel.run("%dist_restart")
    out = kernel.run("%%distributed\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()")
    assert "[rank 0] Out: 2.0" in out and "[rank 1] Out: 2.0" in out


def test_interrupt_stops_the_cell_and_the_ranks_stay_usable(kernel):
    """Does interrupting the kernel during a cell that sleeps 30 s on the ranks end it with KeyboardInterrupt within 5 s, leaving the ranks usable with their variables?"""
    pids = kernel.value(RANK_PIDS)
    out = kernel.execute(
        "%%distributed\nimport time\nbefore_sleep = rank * 2\ntime.sleep(30)",
        timeout=40,
        interrupt_after=1.5,
    )
    assert out["status"] == "error" and out["error"]["ename"] == "Interrupted", out["error"]  # a KeyboardInterrupt
    assert out["error"]["evalue"] == "the cell was interrupted on ranks 0, 1.", out["error"]
    waited = out["finished_at"] - kernel.interrupted_at
    assert waited < 5.0, f"the cell ended {waited:.1f} s after the interrupt"
    assert "idle" in kernel.run("%dist_status") and "busy" not in kernel.run("%dist_status")
    out = kernel.run("%%distributed\nbefore_sleep")
    assert "[rank 0] Out: 0" in out and "[rank 1] Out: 2" in out
    assert kernel.value(RANK_PIDS) == pids


# --------------------------------------------------------------------------- views and shutdown


def test_widget_view_shows_a_widget_and_no_text(kernel):
    """With HELPERS_VIEW=widgets, does a %%distributed cell that prints show a widget (display_data) instead of labelled text on stdout, while each rank's Out: value and the start notice still show as text?"""
    kernel.run("os.environ['HELPERS_VIEW'] = 'widgets'")
    try:
        out = kernel.execute("%%distributed\nprint('into the widget', rank)")
        value = kernel.execute("%%distributed\nrank * 5")
        restarted = kernel.execute("%dist_restart")
    finally:
        kernel.run("os.environ.pop('HELPERS_VIEW', None)")
    assert out["status"] == "ok", traceback_text(out)
    shown = [m for m in out["messages"] if m["msg_type"] == "display_data"]
    assert any(WIDGET_MIME in m["content"]["data"] for m in shown), [m["msg_type"] for m in out["messages"]]
    assert "[rank" not in out["stdout"]
    assert out["stderr_messages"] == []
    # A value is a result, not printed output: it is never lost to the widget sink.
    assert value["status"] == "ok", traceback_text(value)
    assert "[rank 0] Out: 0" in value["stdout"] and "[rank 1] Out: 5" in value["stdout"]
    assert "Started 2 ranks" in restarted["stdout"]
    # Back to text once the variable is gone.
    assert "[rank 0] text again" in kernel.run("%%distributed\nprint('text again')")


def test_kernel_shutdown_leaves_no_process_behind(shared):
    """After the kernel is shut down, are its rank factory and every rank gone within 5 s?"""
    k = shared.get()
    k.run("%dist_start -n 2")
    k.run("from helpers._runtime.factory import get_factory\nfrom helpers.magics import current")
    pids = k.value("[get_factory().pid] + [s['pid'] for s in current().status()]")
    assert len(pids) == 3 and not any(is_gone(pid) for pid in pids)
    k.km.shutdown_kernel(now=True)
    shared.kernel = None
    k.kc.stop_channels()
    assert wait_until(lambda: all(is_gone(pid) for pid in pids), 5.0), [
        pid for pid in pids if not is_gone(pid)
    ]
