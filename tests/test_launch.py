"""Tests of ``helpers.launch`` run in this process: results, environment, failures, hangs, output.

Every worker function is defined inside its test, so it travels to the ranks by value
(cloudpickle), the way a notebook-defined function does. After each test no process may
remain under the rank factory (the ``no_leftover_ranks`` fixture).
"""

from __future__ import annotations

import os
import pickle
import re
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import helpers
from conftest import children_of, is_gone, proc_state, rank_children, wait_until
from helpers import BackendUnavailableError, Cluster, LaunchError, LaunchResult, LaunchTimeoutError, RankFailedError

pytestmark = pytest.mark.usefixtures("no_leftover_ranks")


def launch(fn, world_size, *args, **kwargs):
    """``helpers.launch`` on gloo unless the test says otherwise: the workers use CPU tensors,
    and backend="auto" would pick nccl on a machine with enough GPUs."""
    kwargs.setdefault("backend", "gloo")
    return helpers.launch(fn, world_size, *args, **kwargs)

THIS_FILE = Path(__file__).resolve()


def line_of(marker: str) -> int:
    """The line number in this file of the (single) line that ends with the comment ``marker``."""
    hits = [i for i, line in enumerate(THIS_FILE.read_text().splitlines(), 1) if line.rstrip().endswith(f"# {marker}")]
    assert len(hits) == 1, f"marker {marker!r} found on lines {hits}"
    return hits[0]


@pytest.fixture
def spawned(factory, monkeypatch):
    """Record (and refuse) every request to the factory to start ranks during the test."""
    calls: list = []

    def spawn(self, *args, **kwargs):
        calls.append(args)
        raise AssertionError("ranks were started for a launch that cannot work")

    monkeypatch.setattr(type(factory), "spawn", spawn)
    return calls


# --------------------------------------------------------------------------- results


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_all_reduce_results_come_back_in_rank_order(world_size):
    """Does an all_reduce on 1, 2 and 4 ranks return every rank's value, as CPU tensors, in rank order, with args and kwargs passed?"""

    def work(rank, ws, scale, *, offset=0.0):
        t = torch.tensor([rank + 1.0]) * scale + offset
        dist.all_reduce(t)
        return rank, ws, t

    result = launch(work, world_size, args=(2.0,), kwargs={"offset": 1.0}, output="quiet")

    expected = sum((r + 1.0) * 2.0 + 1.0 for r in range(world_size))
    assert isinstance(result, LaunchResult) and isinstance(result, list)
    assert len(result) == world_size
    assert [r for r, _, _ in result] == list(range(world_size))
    assert all(ws == world_size for _, ws, _ in result)
    for _, _, t in result:
        assert isinstance(t, torch.Tensor) and t.device.type == "cpu"
        assert t.tolist() == [expected]
    assert result.backend == "gloo"
    assert 0 < result.seconds < 30
    assert sorted(result.output) == list(range(world_size))


@pytest.mark.parametrize("init", [True, False])
def test_environment_matches_torchrun_with_simulated_hosts(init):
    """With nnodes=2 and world_size=4, does every rank see torchrun's variables with the right values?"""

    names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"]

    def work(rank, ws):

        return {name: os.environ.get(name) for name in names}

    envs = launch(work, 4, nnodes=2, init=init, output="quiet")

    for rank, env in enumerate(envs):
        assert env["RANK"] == str(rank)
        assert env["LOCAL_RANK"] == str(rank % 2)
        assert env["GROUP_RANK"] == str(rank // 2)
        assert env["WORLD_SIZE"] == "4"
        assert env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] in ("127.0.0.1", "localhost")
    ports = {env["MASTER_PORT"] for env in envs}
    assert len(ports) == 1, f"ranks disagree on MASTER_PORT: {ports}"
    port = ports.pop()
    assert port is not None and port.isdigit() and 0 < int(port) < 65536


def test_init_false_lets_fn_create_its_own_group():
    """With init=False, can fn call init_process_group(init_method='env://') itself and all_reduce?"""

    def work(rank, ws):
        was = dist.is_initialized()
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=ws)
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        return was, t.item()

    assert launch(work, 3, init=False, output="quiet") == [(False, 6.0)] * 3


def test_init_true_has_the_group_ready():
    """With init=True, is the default process group initialised, with the right rank and size, when fn starts?"""

    def work(rank, ws):
        return dist.is_initialized(), dist.get_rank(), dist.get_world_size(), dist.get_backend()

    assert launch(work, 2, output="quiet") == [(True, 0, 2, "gloo"), (True, 1, 2, "gloo")]


# --------------------------------------------------------------------------- failures


def test_raising_rank_is_named_and_the_blocked_others_are_stopped():
    """Does a rank that raises get named with its exception and line, and are the others, blocked for good, stopped
    because of it (not left to the timeout) with no process left?"""

    def work(rank, ws):
        if rank == 1:
            time.sleep(0.3)  # the others are blocked by now
            print(f"raising at {time.time()!r}", flush=True)
            raise ValueError("bad shape on rank 1")  # RAISE-HERE
        if rank == 0:
            dist.barrier()
        else:
            dist.recv(torch.zeros(1), src=1)
        return rank

    # Time from the raise, not from the start, which includes forking and the rendezvous.
    raised_at = []

    def sink(rank, stream, line):
        if line.startswith("raising at "):
            raised_at.append(float(line.split()[-1]))

    timeout = 60
    with pytest.raises(RankFailedError) as info:
        launch(work, 4, output=sink, timeout=timeout)
    elapsed = time.time() - raised_at[0]

    err = info.value
    assert err.rank == 1 and err.world_size == 4
    assert err.exc_type == "ValueError"
    assert err.exc_message == "bad shape on rank 1"
    assert isinstance(err.original, ValueError)
    assert err.exitcode is None
    assert sorted(err.stopped) == [0, 2, 3]
    line = line_of("RAISE-HERE")
    for text in (err.rank_traceback, str(err)):
        assert 'raise ValueError("bad shape on rank 1")' in text
        assert f"line {line}" in text
    assert "rank 1 of 4 raised ValueError: bad shape on rank 1" in str(err)
    # The others wait in calls no rank will ever answer: only being stopped ends them before the timeout (the
    # stop takes a second or so, more on a loaded machine; not measured here, as it depends on the machine's load).
    assert elapsed < timeout, f"the blocked ranks were stopped {elapsed:.2f} s after the raise, not before the timeout"
    assert rank_children() == []
    copy = pickle.loads(pickle.dumps(err))  # errors travel, e.g. from grading subprocesses
    assert isinstance(copy, RankFailedError) and (copy.rank, copy.exc_type, str(copy)) == (1, "ValueError", str(err))


@pytest.mark.parametrize(
    "how, exitcode, exc_type, phrase",
    [
        ("os_exit", 3, None, "exited with code 3"),
        ("sigkill", -9, None, "SIGKILL"),
        ("sys_exit", None, "SystemExit", "sys.exit(2)"),
    ],
)
def test_rank_that_exits_or_dies_is_reported(how, exitcode, exc_type, phrase):
    """Are os._exit(3), a SIGKILL and sys.exit(2) in a rank each reported with the rank and what ended it?"""

    def work(rank, ws):
        import signal
        import sys

        if rank == 1:
            if how == "os_exit":
                os._exit(3)
            elif how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                sys.exit(2)
        dist.barrier()

    with pytest.raises(RankFailedError) as info:
        launch(work, 2, output="quiet")

    err = info.value
    assert err.rank == 1
    assert err.exitcode == exitcode
    assert err.exc_type == exc_type
    assert phrase in str(err)
    assert err.stopped == [0]


def test_a_killed_rank_is_the_cause_not_its_peers_broken_collectives():
    """When a rank is SIGKILLed while 3 peers wait in a barrier, is the killed rank named, not a peer whose barrier broke ('Connection closed by peer')?"""

    def work(rank, ws):
        import signal

        if rank == 1:
            time.sleep(0.05)  # the peers are in the barrier by now
            os.kill(os.getpid(), signal.SIGKILL)
        dist.barrier()

    for attempt in range(6):  # the peers' errors race the report of the death
        with pytest.raises(RankFailedError) as info:
            launch(work, 4, output="quiet")
        err = info.value
        assert (err.rank, err.exitcode, sorted(err.stopped)) == (1, -9, [0, 2, 3]), f"attempt {attempt}: {err}"


class _Model:
    def forward(self, x):
        return x + 1


def test_code_sent_by_value_keeps_its_file_name():
    """Do a nested function, a lambda and a notebook class's method sent to the ranks keep their code's file name
    (cloudpickle 3.1.3 and later write '<dynamic-code>'), so that a rank's traceback can point at the learner's line?"""
    from helpers.launcher import serialize

    def outer(rank, world_size):
        def inner():
            return rank
        return inner

    square = lambda x: x * x  # noqa: E731
    _Model.__module__ = "__main__"  # as a notebook's class: sent by value, methods and all
    try:
        fn, model_class = pickle.loads(serialize((outer, _Model), "test"))
        inner, lam = fn(0, 1), pickle.loads(serialize(square, "test"))
    finally:
        _Model.__module__ = __name__
    for code in (fn.__code__, inner.__code__, lam.__code__, model_class.forward.__code__):
        assert code.co_filename == str(THIS_FILE), code.co_filename
    assert fn.__code__.co_firstlineno == outer.__code__.co_firstlineno
    assert lam(3) == 9 and model_class().forward(1) == 2


@pytest.mark.slow
def test_deadlock_times_out_with_every_rank_stack():
    """When every rank receives first, does the launch end before its timeout (a DeadlockError, found as it forms)
    with each rank's recv line and a deadlock diagnosis?"""

    def ring(rank, ws):
        t = torch.zeros(1)
        dist.recv(t, src=(rank - 1) % ws)  # DEADLOCK-HERE
        dist.send(t, dst=(rank + 1) % ws)

    # A DeadlockError is raised only before the timeout, which therefore need not be short: a short one (it was
    # 3 s) made the test depend on the machine's load, a slow deadlock watch turning it into a plain timeout.
    timeout = 60.0
    line = line_of("DEADLOCK-HERE")
    with pytest.raises(helpers.DeadlockError) as info:
        launch(ring, 3, timeout=timeout, output="quiet")
    err = info.value
    assert err.timeout == timeout and err.unstarted == []
    assert sorted(err.stacks) == [0, 1, 2]
    assert sorted(err.waiting) == [0, 1, 2]
    assert err.finished == []
    for rank, summary in err.waiting.items():
        assert "recv" in summary, summary
        assert f"line {line}" in summary and "test_launch.py" in summary, summary
        assert "dist.recv(t, src=(rank - 1) % ws)" in err.stacks[rank]
    assert re.search(r"every (running )?rank is receiving", str(err), re.I), str(err)
    copy = pickle.loads(pickle.dumps(err))
    assert isinstance(copy, LaunchTimeoutError) and copy.waiting == err.waiting and str(copy) == str(err)
    assert type(copy) is type(err)
    assert rank_children() == []


def test_ranks_stuck_joining_the_group_are_described_as_still_starting():
    """Are ranks that hang before their function runs (in the rendezvous) described as still starting?"""
    import dataclasses

    from helpers._runtime.factory import get_factory
    from helpers._runtime.group import RankGroup
    from helpers._runtime.report import outcome_error
    from helpers.settings import LaunchSettings

    class WaitsForAThirdRank(RankGroup):  # two ranks told the group has three: nobody can join
        def _group_spec(self):
            return dataclasses.replace(super()._group_spec(), world_size=self.world_size + 1)

    group = WaitsForAThirdRank(get_factory(), LaunchSettings(2, backend="gloo", timeout=5.0), init_backend="gloo")
    try:
        group.start()
        outcome = group.wait_ready(1.5)
        assert outcome.pending == outcome.unstarted == [0, 1] and not outcome.failures
        assert [record.phase for record in outcome.board] == ["starting", "starting"]
        err = outcome_error(outcome, 2, 1.5)
    finally:
        group.stop()
        group.close()
    for rank in (0, 1):
        assert "still starting" in err.waiting[rank] and "<string>" not in err.waiting[rank], err.waiting
    assert str(err).startswith("The ranks did not start within 1.5 s: ranks 0, 1 of 2 had not started."), str(err)
    assert err.unstarted == [0, 1]
    assert rank_children() == []


def test_board_shows_each_rank_ready_running_or_in_a_call():
    """Does the board say 'ready' between requests, 'running' in the learner's code, and the call inside one?"""
    with Cluster(2, output="quiet") as cluster:
        group = cluster._group
        assert [r.phase for r in group.read_board()] == ["ready", "ready"]
        with pytest.raises(LaunchTimeoutError) as info:
            cluster.exec("import time\nif rank == 0:\n    time.sleep(30)\nelse:\n    dist.recv(torch.zeros(1), 0)",
                         timeout=1.0)
        assert "rank 0 is running" in info.value.waiting[0], info.value.waiting
        assert "rank 1 waits in recv(src=0)" in info.value.waiting[1], info.value.waiting


def test_unpicklable_return_value_is_named():
    """Does a rank that returns something unpicklable (a generator) fail with a message saying what to return instead?"""

    def work(rank, ws):
        return (i for i in range(3))

    with pytest.raises(RankFailedError) as info:
        launch(work, 2, output="quiet")
    assert "could not be sent back" in str(info.value) and "generator" in str(info.value)
    assert "Return tensors" in str(info.value)


def test_unpicklable_argument_fails_before_any_rank_starts(spawned):
    """Does a function that captures a lock fail at once, naming the problem, without starting ranks?"""
    lock = threading.Lock()

    def work(rank, ws):
        return lock.locked()

    with pytest.raises(LaunchError) as info:
        launch(work, 2, output="quiet")
    assert "lock" in str(info.value) and "picklable" in str(info.value)
    assert spawned == []


def test_subprocesses_of_a_rank_die_with_it():
    """Is a process a rank started (and left running) killed when the rank's launch ends?"""

    def work(rank, ws):
        import subprocess

        return subprocess.Popen(["sleep", "60"]).pid

    pids = launch(work, 2, output="quiet")
    assert wait_until(lambda: all(is_gone(pid) for pid in pids), 2.0), {pid: proc_state(pid) for pid in pids}


# --------------------------------------------------------------------------- robustness


@pytest.mark.slow
def test_200_launches_back_to_back():
    """Do 200 quick launches in a row all succeed, without 'address already in use' or leftover ranks?"""

    def work(rank, ws):
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t)
        return t.item()

    for i in range(200):
        assert launch(work, 2, output="quiet") == [3.0, 3.0], f"launch {i}"
    assert rank_children() == []


def test_two_launches_at_once_from_two_threads():
    """Do two launches running at the same time from two threads each get their own right answers?"""

    def work(rank, ws, scale):
        t = torch.tensor([(rank + 1.0) * scale])
        dist.all_reduce(t)
        time.sleep(0.05)  # keep both groups alive at the same time
        return t.item()

    gate = threading.Barrier(2)
    results: dict[str, list] = {"a": [], "b": []}
    errors: list[BaseException] = []

    def run(name, world_size, scale):
        try:
            gate.wait()
            for _ in range(5):
                results[name].append(list(launch(work, world_size, args=(scale,), output="quiet")))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=("a", 2, 1.0)), threading.Thread(target=run, args=("b", 3, 10.0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a launch thread hung"
    assert errors == []
    assert results["a"] == [[3.0, 3.0]] * 5
    assert results["b"] == [[60.0, 60.0, 60.0]] * 5


# --------------------------------------------------------------------------- bad arguments


def _noop(rank, ws):
    return rank


@pytest.mark.parametrize(
    "backend, world_size, info, name, init_backend",
    [
        ("auto", 4, {"gloo": True, "nccl": False, "cuda_count": 0}, "gloo", "gloo"),
        ("auto", 4, {"gloo": True, "nccl": True, "cuda_count": 2}, "gloo", "gloo"),
        ("auto", 2, {"gloo": True, "nccl": True, "cuda_count": 2}, "nccl", "cpu:gloo,cuda:nccl"),
        ("nccl", 2, {"gloo": True, "nccl": True, "cuda_count": 4}, "nccl", "nccl"),
        ("GLOO", 2, {"gloo": True, "nccl": True, "cuda_count": 4}, "gloo", "gloo"),
    ],
    ids=["cpu-only", "too-few-gpus", "gpu-per-rank", "explicit-nccl", "explicit-gloo"],
)
def test_backend_choice_for_each_machine(backend, world_size, info, name, init_backend):
    """Does backend='auto' on a machine with a GPU per rank make a group where CPU tensors go through gloo (the
    lessons' CPU code must run there too), while an explicit 'nccl' stays nccl alone, and too few GPUs give gloo?"""
    from helpers.backend import resolve_backend

    choice = resolve_backend(backend, world_size, info)
    assert (choice.name, choice.init_backend) == (name, init_backend)
    described = choice.describe(world_size)
    assert ("CPU tensors through gloo" in described) == (init_backend == "cpu:gloo,cuda:nccl"), described
    if info["cuda_count"] and world_size > info["cuda_count"]:
        assert "too few for nccl" in described, described


@pytest.mark.parametrize(
    "call, error, fix",
    [
        (dict(world_size=0), ValueError, "launch(fn, 4)"),
        (dict(world_size=-1), ValueError, "launch(fn, 4)"),
        (dict(world_size=2.5), ValueError, "launch(fn, 4)"),
        (dict(world_size="4"), ValueError, "launch(fn, 4)"),
        (dict(fn=42, world_size=2), TypeError, "def work(rank, world_size)"),
        (dict(world_size=4, nnodes=3), ValueError, "Pass nnodes as one of [1, 2, 4]"),
        (dict(world_size=2, backend="bogus"), ValueError, "'gloo'"),
        (dict(world_size="gpus+1", backend="nccl"), BackendUnavailableError, "backend='gloo'"),
    ],
    ids=["ws0", "ws-1", "ws2.5", "ws-str", "not-callable", "nnodes3", "bogus-backend", "nccl"],
)
def test_bad_arguments_fail_at_once_without_starting_ranks(factory, spawned, call, error, fix):
    """Does a bad argument raise within 1 s, with a message naming what to pass, before any rank starts?"""
    call = dict(call)
    fn = call.pop("fn", _noop)
    if call["world_size"] == "gpus+1":  # one rank more than this machine has GPUs
        call["world_size"] = int(factory.info.get("cuda_count") or 0) + 1

    started = time.monotonic()
    with pytest.raises(error) as info:
        launch(fn, **call)
    elapsed = time.monotonic() - started

    assert fix in str(info.value)
    assert elapsed < 1.0
    assert spawned == [], "a rank was started for a launch that cannot work"
    assert rank_children() == []


# --------------------------------------------------------------------------- output


def test_worker_output_is_labelled_on_stdout_and_nothing_on_stderr(capfd):
    """Do the ranks' prints, stderr writes, C-level writes and warnings all arrive labelled on stdout, with nothing on stderr?"""

    def work(rank, ws):
        import sys
        import warnings

        print(f"hello from {rank}")
        print(f"python stderr {rank}", file=sys.stderr)
        os.write(2, f"c-level stderr {rank}\n".encode())
        os.write(1, f"c-level stdout {rank}\n".encode())
        warnings.warn(f"careful {rank}")
        sys.stdout.write(f"no newline at the end {rank}")
        return rank

    result = launch(work, 2)
    out, err = capfd.readouterr()

    assert err == ""
    for rank in range(2):
        assert f"[rank {rank}] no newline at the end {rank}\n" in out
        assert f"[rank {rank}] hello from {rank}\n" in out
        assert f"[rank {rank}] c-level stdout {rank}\n" in out
        assert f"[rank {rank}:err] python stderr {rank}\n" in out
        assert f"[rank {rank}:err] c-level stderr {rank}\n" in out
        warning = [line for line in out.splitlines() if f"careful {rank}" in line]
        assert warning and all(line.startswith(f"[rank {rank}:err] ") for line in warning), out
        assert "UserWarning" in warning[0]
        assert f"hello from {rank}" in result.output[rank]


def test_quiet_output_prints_nothing_but_keeps_the_text(capfd):
    """With output='quiet', is nothing printed while .output still holds each rank's text?"""

    def work(rank, ws):
        import sys

        print(f"quiet hello {rank}")
        print(f"quiet complaint {rank}", file=sys.stderr)
        return rank

    result = launch(work, 2, output="quiet")
    out, err = capfd.readouterr()

    assert out == "" and err == ""
    for rank in range(2):
        assert f"quiet hello {rank}\n" in result.output[rank]
        assert f"quiet complaint {rank}\n" in result.output[rank]


def test_stderr_mode_and_sink_route_lines_by_stream(capfd):
    """With output='stderr' do a rank's stderr lines go to stderr (and stdout lines to stdout), and does a sink get (rank, stream, line)?"""

    def work(rank, ws):
        import sys

        print(f"to out {rank}")
        print(f"to err {rank}", file=sys.stderr)

    launch(work, 2, output="stderr")
    out, err = capfd.readouterr()
    for rank in range(2):
        assert f"[rank {rank}] to out {rank}\n" in out and f"to err {rank}" not in out
        assert f"[rank {rank}:err] to err {rank}\n" in err and f"to out {rank}" not in err

    seen = []
    launch(work, 2, output=lambda rank, stream, line: seen.append((rank, stream, line)))
    out, err = capfd.readouterr()
    assert "to out" not in out and err == ""
    assert sorted(seen) == [(0, "stderr", "to err 0"), (0, "stdout", "to out 0"), (1, "stderr", "to err 1"), (1, "stdout", "to out 1")]


def test_max_lines_truncates_with_one_notice(capfd):
    """Does max_lines cap each rank's printed lines, with a single notice, while .output keeps them all?"""

    def work(rank, ws):
        for i in range(30):
            print(f"line {i} of rank {rank}")

    result = launch(work, 2, max_lines=5)
    out, err = capfd.readouterr()

    assert err == ""
    for rank in range(2):
        shown = [line for line in out.splitlines() if line.startswith(f"[rank {rank}] line ")]
        assert shown == [f"[rank {rank}] line {i} of rank {rank}" for i in range(5)]
        notices = [line for line in out.splitlines() if line.startswith(f"[rank {rank}]") and "more output than 5 lines" in line]
        assert len(notices) == 1, out
        assert result.output[rank].count("\n") == 30
        assert f"line 29 of rank {rank}" in result.output[rank]


# --------------------------------------------------------------------------- owner death

_OWNER_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading, time
    import helpers
    from helpers._runtime.factory import get_factory

    def sleeper(rank, world_size):
        import time
        time.sleep(60)

    def children(pid):
        kids = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(k) for k in f.read().split()]
        return kids

    factory = get_factory()
    threading.Thread(target=helpers.launch, args=(sleeper, 2), kwargs=dict(output="quiet", timeout=120), daemon=True).start()
    deadline = time.monotonic() + 20
    while len(children(factory.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    print(factory.pid, *children(factory.pid), flush=True)
    time.sleep(120)
    """
)


@pytest.mark.slow
def test_factory_and_ranks_die_with_their_owner():
    """When the process that owns the factory is SIGKILLed, are the factory and its ranks gone within 5 s?"""
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER_SCRIPT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=THIS_FILE.parents[1],
    )
    try:
        ready, _, _ = select.select([owner.stdout], [], [], 60)
        assert ready, "the owner process did not report its factory and ranks within 60 s"
        line = owner.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 3, f"expected a factory and 2 ranks, got {line!r}; stderr: {owner.stderr.read() if owner.poll() is not None else ''}"
        factory, ranks = pids[0], pids[1:]
        assert sorted(children_of(factory)) == sorted(ranks)
        assert all(proc_state(pid) in ("R", "S", "D") for pid in pids)
    finally:
        owner.send_signal(signal.SIGKILL)  # the one process this test started
        owner.wait(10)
        owner.stdout.close()
        owner.stderr.close()

    assert wait_until(lambda: all(is_gone(pid) for pid in pids), 5.0), {pid: proc_state(pid) for pid in pids}


def _has_dynamo(rank, world_size):
    import sys

    return "torch._dynamo" in sys.modules


def test_idle_factory_preloads_what_optimizers_import():
    """Once the factory has been idle, do new ranks start with torch._dynamo already imported (the first optimizer otherwise imports it, a second or more per rank)?"""
    assert wait_until(lambda: launch(_has_dynamo, 1, output="quiet")[0], timeout=20, interval=0.5)
    assert launch(_has_dynamo, 2, output="quiet") == [True, True]


_WARM_UP_PROBE = """
import sys, time
from helpers import launch
def has_dynamo(rank, world_size):
    import sys
    return "torch._dynamo" in sys.modules
first = launch(has_dynamo, 2, output="quiet")
time.sleep(1.5)  # idle: five times what the factory waits before it warms up
print(first, launch(has_dynamo, 2, output="quiet"))
"""


@pytest.mark.parametrize("setting, expected", [("now", "[True, True] [True, True]"), ("off", "[False, False] [False, False]")])
def test_warm_up_setting_says_when_the_factory_imports_what_optimizers_import(setting, expected):
    """HELPERS_WARM_UP=now: do the first ranks already start with torch._dynamo imported; =off (the grader's setting for
    lessons whose ranks build no optimizer): do ranks still start without it after the factory sat idle?"""
    env = {**os.environ, "HELPERS_WARM_UP": setting, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", _WARM_UP_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == expected, (done.stdout, done.stderr[-2000:])


_FORKED_FACTORY = """
import os, sys
keep_r, keep_w = os.pipe()  # a pipe of this process's own: a forked factory must not hold it
from helpers._runtime.factory import fork_factory
factory = fork_factory()
factory.wait_ready()
from helpers import launch, DeadlockError
def pass_right(rank, world_size):
    import torch, torch.distributed as dist
    t = torch.zeros(2)
    dist.recv(t, (rank - 1) % world_size)
def total(rank, world_size):
    import torch, torch.distributed as dist
    t = torch.ones(2) * rank
    dist.all_reduce(t)
    return t.tolist()
try:
    launch(pass_right, 2, timeout=60, output="quiet")
except DeadlockError as err:
    print("STACK", repr(err.stacks[0]))
    print("REPORT", repr(str(err)))
print("TOTAL", launch(total, 3, output="quiet")[2])
print("FORKED", factory.forked, open(f"/proc/{factory.pid}/cmdline", "rb").read() == open("/proc/self/cmdline", "rb").read())
def held():
    found = []
    for fd in os.listdir(f"/proc/{factory.pid}/fd"):
        try:
            found.append(os.readlink(f"/proc/{factory.pid}/fd/{fd}"))
        except OSError:  # closed since the listing
            pass
    return sorted(found)
# Once the last rank of a launch is reaped, the factory removes that group's rendezvous folder (shutil.rmtree holds
# the folder open for a moment): wait for that to end, so that only a file the factory keeps fails the test.
import time
deadline = time.monotonic() + 10
while not all(f == "/dev/null" or f.startswith(("socket:", "pipe:", "anon_inode:")) for f in held()) \
        and time.monotonic() < deadline:
    time.sleep(0.05)
print("FDS", held())
print("MINE", os.readlink(f"/proc/self/fd/{keep_w}"))
"""


def test_a_factory_forked_from_its_process_runs_and_reports_ranks_as_a_fresh_one(tmp_path):
    """fork_factory (the grader's clean re-grade: torch imported once for the process and its factory): do its
    ranks compute, is a deadlock reported with the learner's frame and none of the parent's frames, and does the
    factory hold none of the parent's files, only /dev/null and what it made itself?"""
    script = tmp_path / "parent_script.py"
    script.write_text(_FORKED_FACTORY)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line[:1].isupper() and " " in line)
    assert out["FORKED"] == "True True", done.stdout
    assert out["TOTAL"] == "[3.0, 3.0]", done.stdout
    assert out["STACK"].startswith("'  ") and "parent_script.py, line 11, in pass_right" in out["STACK"].split("\\n")[0], out["STACK"]
    assert "<module>" not in out["STACK"] and "fork_factory" not in out["STACK"], out["STACK"]
    assert "rank 0 waits in recv(src=1)" in out["REPORT"] and "pass_right" in out["REPORT"], out["REPORT"]
    fds = eval(out["FDS"])  # noqa: S307 - our own script's printed list
    assert out["MINE"] not in fds, (out["MINE"], fds)
    assert fds.count("/dev/null") >= 3 and all(f == "/dev/null" or f.startswith(("socket:", "pipe:", "anon_inode:"))
                                               for f in fds), fds


_STAND_IN_FOR_A_HUNG_RANK = """
import signal, time
signal.signal(signal.SIGUSR1, lambda *_: print("SIGUSR1", flush=True))
print("handler installed", flush=True)
time.sleep(120)
"""


def test_the_factory_serves_signals_and_exits_while_it_warms_up(tmp_path, monkeypatch):
    """While the factory imports its warm-up modules (seconds on a busy machine, with ranks alive), does a signal the
    kernel asks for reach the rank at once, is a rank that exited reported, and do a Stop and what follows it wait?"""
    import socket

    from helpers._runtime import factory_process
    from helpers._runtime.protocol import Exited, Signal, Stop
    from helpers._runtime.wire import send_message

    (tmp_path / "warm_first.py").write_text("import warm_second\n")
    (tmp_path / "warm_second.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(factory_process, "_WARM_UP_MODULES", ("warm_first",))
    kernel_end, factory_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = factory_process._Server(factory_end)
    # Stand-ins for two ranks: one hung, which says when a SIGUSR1 reaches it (a rank would dump its stack) and lives
    # on, so that the server never reaps it; and one that has exited and waits to be reaped.
    hung = subprocess.Popen([sys.executable, "-c", _STAND_IN_FOR_A_HUNG_RANK], stdout=subprocess.PIPE,
                            start_new_session=True)
    done = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    try:
        assert hung.stdout.readline() == b"handler installed\n"
        os.waitid(os.P_PID, done.pid, os.WEXITED | os.WNOWAIT)  # a zombie now
        server.ranks.update({hung.pid: (7, 0), done.pid: (8, 1)})
        os.write(server.wake_w, bytes([signal.SIGCHLD]))  # what the factory's SIGCHLD handler writes
        send_message(kernel_end, Signal(7, signal.SIGUSR1, [0]))  # a hang report's request for stacks
        send_message(kernel_end, Stop())
        send_message(kernel_end, Signal(7, signal.SIGTERM))
        hooks = list(sys.meta_path)
        factory_process._warm_up(server)
        assert "warm_second" in sys.modules and sys.meta_path == hooks
        # Sent during the import, not after it: the loop that would send it later has not run.
        assert select.select([hung.stdout], [], [], 30)[0] and hung.stdout.readline() == b"SIGUSR1\n"
        assert hung.poll() is None
        kernel_end.settimeout(30)  # bounds a failure: nothing sent
        assert pickle.loads(kernel_end.recv(1 << 16)) == Exited(8, 1, done.pid, 0) and list(server.ranks) == [hung.pid]
        assert server.deferred == [(Stop(), [])]
        assert select.select([factory_end], [], [], 0)[0], "the message after the Stop was read before it"
        assert server._handle(server.deferred.pop(0)) is False
    finally:
        for child in (hung, done):
            child.kill()
            child.wait()
        hung.stdout.close()
        for end in (kernel_end, factory_end):
            end.close()
        os.close(server.wake_r)
        os.close(server.wake_w)
        for name in ("warm_first", "warm_second"):
            sys.modules.pop(name, None)


def _calls_all_reduce_three_ways(rank, world_size, how):
    import torch
    import torch.distributed as dist

    t = torch.ones(2)
    if how == "function":
        dist.all_reduce(t)
    elif how == "process group":
        dist.distributed_c10d._get_default_group().allreduce([t]).wait()
    elif how == "ddp":
        torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
    return t.tolist()


@pytest.mark.parametrize("how, call", [
    ("function", "torch.distributed.all_reduce"),
    ("process group", "allreduce"),
    ("ddp", "torch.nn.parallel.DistributedDataParallel"),
])
def test_forbidden_calls_raise_forbidden_call_error_with_the_launchs_reason(how, call):
    """Does a switched-off call (the function, the process-group method, or DDP) raise ForbiddenCallError on the rank, with the reason the launch gave?"""
    forbid = {helpers.DDP: "build it by hand"} if how == "ddp" else dict.fromkeys(helpers.DATA_COLLECTIVES, "build it by hand")
    with pytest.raises(RankFailedError) as info:
        launch(_calls_all_reduce_three_ways, 2, args=(how,), forbid=forbid, output="quiet")
    err = info.value
    assert isinstance(err.original, helpers.ForbiddenCallError), err
    assert call in err.original.call and err.original.reason == "build it by hand"
    family, name = ("ddp", helpers.DDP) if how == "ddp" else ("collective", "all_reduce")
    assert (err.original.family, err.original.name) == (family, name)  # what grading words its feedback on
    assert "switched off here: build it by hand" in str(err)
    assert rank_children() == []


def test_forbid_names_are_checked_before_any_rank_starts(spawned):
    """Does forbid= with a name the helpers cannot switch off fail at once, naming where valid names are?"""
    with pytest.raises(ValueError, match="helpers.COLLECTIVES"):
        launch(_calls_all_reduce_three_ways, 2, args=("function",), forbid=["allreduce_everything"])
    with pytest.raises(TypeError, match="list of call names"):
        launch(_calls_all_reduce_three_ways, 2, args=("function",), forbid="all_reduce")
    assert spawned == []


def test_a_launch_carrying_megabytes_reaches_its_ranks_whole(no_leftover_ranks):
    """Does a launch whose arguments are 16 MB (256 pipe-fulls) reach every rank whole?"""
    def total(rank, ws, x):
        return float(x.sum()), x.numel()

    big = torch.ones(1 << 22)  # 16 MB of float32
    assert launch(total, 2, (big,), output="quiet") == [(float(1 << 22), 1 << 22)] * 2


def test_a_request_larger_than_a_pipe_is_written_as_soon_as_there_is_room(factory):
    """With part of a 1 MB request waiting and the command pipe emptied by its reader, does the group's next wait
    write more at once, rather than at its end (which, at up to 0.25 s per 64 KB, made a 16 MB launch take 9 s)?
    The wait is given 60 s: returning before that means it woke up for the room, which is what is checked."""
    from helpers._runtime.board import Board
    from helpers._runtime.group import RankGroup
    from helpers._runtime.protocol import FD_NAMES, Push
    from helpers._runtime.wire import FrameReader
    from helpers.settings import LaunchSettings

    group = RankGroup(factory, LaunchSettings(1, backend="gloo"), init_backend="gloo")  # no rank: the test reads
    group.board = Board.create(1)
    theirs = group._open_pipes(group.ranks[0])
    cmd = theirs[FD_NAMES.index("cmd")]
    os.set_blocking(cmd, False)
    reader, waits = FrameReader(), 0
    try:
        group.send(0, Push(1, bytes(1 << 20)))
        while True:
            try:
                while chunk := os.read(cmd, 1 << 16):  # the rank's part: read all the pipe holds
                    reader.feed(chunk)
            except BlockingIOError:
                pass
            if not group.ranks[0].writer.waiting:
                break
            started = time.monotonic()
            group.poll(60.0)
            assert time.monotonic() - started < 60.0, "the wait did not wake up when the pipe had room"
            waits += 1
        assert waits >= 8  # the pipe takes at most 64 KB at a time (1 << 20 is 16 pipe-fulls)
        assert [message.payload for message in reader.messages()] == [bytes(1 << 20)]
    finally:
        for fd in theirs:
            os.close(fd)
        group.ranks[0].state = "exited"  # no process to wait for
        group.close()


def test_launch_settings_check_themselves_and_say_what_each_setting_does():
    """Do LaunchSettings reject a bad value before anything starts, and carry each setting's help text?"""
    import dataclasses
    import doctest

    import helpers.settings
    from helpers.settings import LaunchSettings

    result = doctest.testmod(helpers.settings)
    assert result.attempted > 0 and result.failed == 0
    for f in dataclasses.fields(LaunchSettings):
        assert LaunchSettings.help(f.name), f.name
    with pytest.raises(ValueError, match="forbid names 'all_reduse'"):
        LaunchSettings(2, forbid=["all_reduse"])
    assert LaunchSettings(2, timeout=3).replace(world_size=4).timeout == 3.0
