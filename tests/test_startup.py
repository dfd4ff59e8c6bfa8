"""Start-up is not the learner's time: a request's timeout counts from the moment every rank has started it.

Ranks start in steps that can each take seconds on a busy machine: the rank factory forks them
(after its warm-up import, if one is under way), they join the process group, and they unpickle
what was sent, which imports the modules the function and its arguments use. None of that is
the learner's code, so it has a limit of its own, reported apart ("did not start within"), and a
hang report only ever speaks of ranks that all started. A rank that fails while starting still
fails at once, with its own error. And a rank asked for its stack (SIGUSR1) before it can give
one ignores the signal instead of dying of it.

The slow starts here are arguments whose unpickling on a rank sleeps, as a slow import would;
everything is defined inside the tests, so it travels by value, as a notebook's code does.

Before all that, the rank factory itself has to start (a fresh interpreter importing torch, seconds
on a busy machine). ``import helpers`` starts no process; a notebook kernel starts the factory once
the cell that imported helpers has run, so that it is warm by the first launch, and any other
process starts it at its first launch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import helpers
from conftest import ROOT, children_of, rank_children, wait_until
from helpers import LaunchTimeoutError, RankFailedError
from helpers._runtime.diagnose import dump_complete

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def loaded_slowly(seconds: float, ranks: tuple[int, ...] | None = None, fail: str | None = None):
    """An argument whose unpickling on a rank (of ``ranks``; all when None) sleeps ``seconds``,
    or raises ValueError(``fail``); it arrives as ``seconds``."""

    def arrive(seconds):
        import os
        import time

        if ranks is None or int(os.environ["RANK"]) in ranks:
            if fail is not None:
                raise ValueError(fail)
            time.sleep(seconds)  # LOADING
        return seconds

    class LoadedSlowly:
        def __reduce__(self):
            return arrive, (seconds,)

    return LoadedSlowly()


def test_loading_longer_than_the_timeout_is_not_counted():
    """Does a launch whose argument takes 4 s to load on every rank, then returns at once, succeed with timeout=2?"""

    def work(rank, world_size, value):
        return rank, value

    results = helpers.launch(work, 2, (loaded_slowly(4.0),), timeout=2, backend="gloo", output="quiet")
    assert results == [(0, 4.0), (1, 4.0)]


def test_a_persistent_ranks_call_counts_from_its_start_too():
    """On a Cluster, does a call whose argument takes 3 s to load succeed with timeout=1?"""

    def work(rank, world_size, value):
        return value

    with helpers.Cluster(2, backend="gloo", output="quiet", view="text") as cluster:
        assert cluster.run(work, loaded_slowly(3.0), timeout=1) == [3.0, 3.0]


def test_ranks_that_do_not_start_in_time_are_reported_as_not_started(monkeypatch):
    """With the start-up limit at 3 s and loading taking a minute, is the error a start-up report (unstarted ranks,
    "did not start within 3 s"), not a hang report about the learner's code, with every rank stopped?"""
    import helpers._runtime.group as group_module

    def work(rank, world_size, value):
        return value

    monkeypatch.setattr(group_module, "START_LIMIT", 3.0)
    with pytest.raises(LaunchTimeoutError) as info:
        helpers.launch(work, 2, (loaded_slowly(60.0),), timeout=1, backend="gloo", output="quiet")
    err = info.value
    assert err.unstarted == [0, 1] and err.timeout == 3.0 and sorted(err.waiting) == [0, 1], err
    head = str(err).splitlines()[0]
    assert head == "The ranks did not start within 3 s: ranks 0, 1 of 2 had not started. All ranks were stopped.", head
    assert "timeout= counts only your code" in str(err) and "did not finish" not in str(err)
    assert rank_children() == []


def test_a_rank_still_loading_is_named_with_the_line_it_is_in(factory):
    """After the ranks joined, is a rank still loading its call at the start-up limit described as loading, at the line
    that runs during its unpickling, while the rank that started is named as started?"""
    from helpers._runtime.group import RankGroup
    from helpers._runtime.protocol import Call
    from helpers._runtime.report import outcome_error
    from helpers.launcher import serialize_call
    from helpers.settings import LaunchSettings

    def work(rank, world_size, value):
        import time

        time.sleep(60)

    group = RankGroup(factory, LaunchSettings(2, backend="gloo", timeout=1.0), init_backend="gloo")
    try:
        group.start()
        assert group.wait_ready(60).ok
        outcome = group.request(Call(0, serialize_call(work, (loaded_slowly(60.0, ranks=(1,)),))), [0, 1], 1.0,
                                start=5.0)
        if outcome.unstarted == [0, 1]:  # rank 0 too starved of CPU to load a few bytes in 5 s: say so
            pytest.fail(f"rank 0 did not load its call within 5 s: {outcome_error(outcome, 2, 1.0)}")
        err = outcome_error(outcome, 2, 1.0)
    finally:
        group.stop()
        group.close()
    assert outcome.unstarted == [1] and outcome.pending == [0, 1] and not outcome.failures
    assert err.unstarted == [1] and sorted(err.waiting) == [1]
    assert str(err).startswith("The ranks did not start within 5 s: rank 1 of 2 had not started."), str(err)
    assert "started: rank 0 (running, maybe waiting for the others)" in str(err)
    assert err.waiting[1].startswith("rank 1 was still loading what was sent to it"), err.waiting
    assert "in arrive: time.sleep(seconds)  # LOADING" in err.waiting[1], err.waiting


def test_a_rank_that_fails_to_load_fails_at_once_with_its_error():
    """Does a rank whose argument cannot be loaded fail the launch with its own error, said to be while loading,
    and the other rank stopped, rather than a timeout?"""

    def work(rank, world_size, value):
        import torch.distributed as dist

        dist.barrier()

    with pytest.raises(RankFailedError) as info:
        helpers.launch(work, 2, (loaded_slowly(0.0, ranks=(1,), fail="no such dataset"),), timeout=60,
                       backend="gloo", output="quiet")
    err = info.value
    assert (err.rank, err.exc_type, err.exc_message, err.stopped) == (1, "ValueError", "no such dataset", [0])
    assert str(err).startswith("rank 1 of 2 raised ValueError while loading what was sent to it: no such dataset")


# --------------------------------------------------------------------------- where the rank factory starts

_IMPORT_ONLY = """
import os, sys, time
import helpers
import helpers._runtime.factory as factory
time.sleep(1.0)  # a factory started at import would be a child by now
with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
    print("CHILDREN", f.read().split())
print("FACTORY", factory._factory)
print("TORCH", "torch" in sys.modules)
"""


def test_importing_helpers_starts_no_process():
    """In a plain Python process (a script, a grading worker), does `import helpers` start no process, no rank
    factory, and leave torch unimported?"""
    done = subprocess.run([sys.executable, "-c", _IMPORT_ONLY], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    said = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert said == {"CHILDREN": "[]", "FACTORY": "None", "TORCH": "False"}, done.stdout


def test_a_notebook_starts_the_factory_once_its_set_up_cell_has_run(make_kernel):
    """In a kernel, is there no factory while the cell importing helpers runs, one running (a child of the kernel)
    right after that cell, the very one the first launch uses; and after `helpers.shutdown()`, does
    `%load_ext helpers` start one at once?"""
    kernel = make_kernel()
    during = kernel.run("import torch\nfrom helpers import launch, shutdown\nimport helpers._runtime.factory as f\n"
                        "print(f._factory)")
    assert during.split() == ["None"], during
    pid = kernel.value("f._factory and f._factory.pid")
    assert pid in children_of(kernel.pid), (pid, children_of(kernel.pid))
    assert kernel.value("launch(lambda rank, world_size: rank, 2, output='quiet')") == [0, 1]
    assert kernel.value("f.get_factory().pid") == pid
    assert kernel.value("shutdown() or f._factory") is None
    started = kernel.value("get_ipython().run_line_magic('load_ext', 'helpers') or (f._factory and f._factory.pid)")
    assert started in children_of(kernel.pid), (started, children_of(kernel.pid))


def test_a_kernel_told_not_to_start_ahead_starts_the_factory_at_its_first_launch(make_kernel):
    """With HELPERS_START_AHEAD=0 (grading's kernel, which launches nothing), is there still no factory after the
    set-up cell has run, and does a launch then start one and run?"""
    kernel = make_kernel()
    kernel.run("import os\nos.environ['HELPERS_START_AHEAD'] = '0'\nimport torch\nfrom helpers import launch\n"
               "import helpers._runtime.factory as f")
    assert kernel.value("f._factory") is None
    assert kernel.value("launch(lambda rank, world_size: rank, 2, output='quiet')") == [0, 1]
    assert kernel.value("f._factory.pid") in children_of(kernel.pid)


# --------------------------------------------------------------------------- SIGUSR1 during start-up

#: Run in the factory before its loop: rank 0 of each group waits, just forked, before anything of
#: its own start-up (its faulthandler among it), until the file GATE exists.
_HOLD_RANK_0 = """
import os, time
from helpers._runtime import rank as _rank
_main = _rank.main
def _held(spec, group, fds, parent):
    while spec.rank == 0 and not os.path.exists(GATE):
        time.sleep(0.01)
    _main(spec, group, fds, parent)
_rank.main = _held
"""


def test_a_rank_asked_for_its_stack_before_it_can_give_one_lives_on(tmp_path):
    """Is a SIGUSR1 (a hang report's request for stacks) sent through the factory to a rank held just after its fork
    ignored, so that the rank then starts, runs a call and answers the next SIGUSR1 with its stack?"""
    from helpers._runtime.factory import Factory
    from helpers._runtime.group import RankGroup
    from helpers._runtime.protocol import Call
    from helpers.launcher import serialize_call
    from helpers.settings import LaunchSettings

    gate = tmp_path / "open"
    factory = Factory(prelude=f"GATE = {str(gate)!r}\n" + textwrap.dedent(_HOLD_RANK_0))
    group = None
    try:
        factory.wait_ready()
        group = RankGroup(factory, LaunchSettings(2, backend="gloo", init=False), init_backend="gloo")
        group.start()

        def rank_1_ready():
            group.poll(0.05)
            return group.ranks[1].state == "idle"

        assert wait_until(rank_1_ready, 60), "rank 1 did not start"
        assert group.ranks[0].state == "starting" and group.ranks[0].pid is not None
        # The factory signals the ranks in the order it forked them: once rank 1's stack has come, rank 0 (held
        # before it could install any handler) has had its signal.
        group.signal(signal.SIGUSR1, [0, 1])

        def rank_1_dumped():
            group.poll(0.05)
            return dump_complete(bytes(group.ranks[1].diag))

        assert wait_until(rank_1_dumped, 30), f"rank 1 sent no stack: {bytes(group.ranks[1].diag)!r}"
        gate.touch()
        ready = group.wait_ready(60)
        assert ready.ok, f"rank 0 did not survive the signal: {ready.failures}"
        outcome = group.request(Call(0, serialize_call(lambda rank, world_size: os.getpid(), ())), [0, 1], 30)
        assert outcome.ok and [outcome.replies[r].value() for r in (0, 1)] == [group.ranks[0].pid, group.ranks[1].pid]
        assert dump_complete(group.dump_stacks([0])[0].encode()), "rank 0 gives no stack once started"
    finally:
        if group is not None:
            group.stop()
            group.close()
        factory.close()
