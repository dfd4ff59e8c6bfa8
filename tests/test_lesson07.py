"""Exercise 7.1's checks when a process fails: does the feedback carry the failing process's own words?

Every test runs a wrong ``main()`` under real ``torchrun`` agents, as the hidden tests and the
self-check do (``autograder.exercise("7.1")``), and reads the feedback a learner would read.
Before, a failed job showed only torchrun's ``ChildFailedError:`` line: the rank, its
exception and the learner's line were lost, and a process that died without an exception
left nothing at all.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
import torch.distributed as dist

from autograder.kit.exercise import GradingFailure
from autograder.kit.registry import exercise
from autograder.hidden import grade

pytestmark = pytest.mark.slow


def raises_on_rank_one():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    if rank == 1:
        raise ValueError(f"rank {rank} found a bad batch")
    dist.barrier()
    dist.destroy_process_group()


def leaves_with_os_exit():
    rank = int(os.environ["RANK"])
    if rank == 1:
        print("rank 1 saved nothing", flush=True)
        print("rank 1 leaves now", file=sys.stderr, flush=True)
        os._exit(3)
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()


def killed_by_a_signal():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    if rank == 1:
        print("rank 1 is about to be killed", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    dist.destroy_process_group()


def raises_a_long_message_naming_a_course_file():
    from autograder.paths import ROOT

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    if rank == 1:  # the recorded message's 2000 characters end in the middle of the course's folder
        path = f'File "{ROOT}/autograder/kit/harness.py", line 3'
        cut = 2000 - len('File "') - len(str(ROOT)) // 2
        raise RuntimeError(" ".join(["word"] * (cut // 5)).ljust(cut - 1) + " " + path + " and more" * 20)
    dist.barrier()
    dist.destroy_process_group()


def does_nothing():
    pass  # every process exits 0, and none ever had a process group to leave alive


def _feedback(fn, part: str = "runs") -> str:
    with pytest.raises(GradingFailure) as failed:
        if part == "self-check":
            exercise("7.1").self_check(fn)
        else:
            grade("7.1", fn, part)
    return str(failed.value)


def test_a_rank_that_raises_is_named_with_its_exception_and_line():
    """Under two agents, does 'runs' name rank 1, its ValueError and the learner's line, not only ChildFailedError?"""
    text = _feedback(raises_on_rank_one)
    first = text.split("The first to fail:\n", 1)[1]
    assert first.startswith("rank 1 (local rank 1 under torchrun agent 0) raised ValueError: rank 1 found a bad batch"), text
    assert 'at train.py line' in first and 'in raises_on_rank_one: raise ValueError(f"rank {rank} found a bad batch")' in first
    assert "Its traceback ends:" in first and 'File "train.py"' in first
    assert "graded_run.py" not in text and "runpy" not in text  # the course's wrapper is not the learner's code


def test_the_self_check_shows_the_same():
    """Does the self-check (two agents of one process each) show the failing rank's exception and line too?"""
    text = _feedback(raises_on_rank_one, "self-check")
    assert "2 torchrun agents (simulated hosts) of 1 process each" in text
    assert "rank 1 (local rank 0 under torchrun agent 1) raised ValueError: rank 1 found a bad batch" in text
    assert 'raise ValueError(f"rank {rank} found a bad batch")' in text


def _answer_with(tmp_path, name: str, old: str, new: str):
    """The instructor's main() with ``old`` replaced by ``new``, as a module's function (export_script reads its source)."""
    import importlib.util

    from devtools.scratch import solution_source

    source = solution_source("07-launching-at-scale", "ex7_1-main")
    assert old in source, f"the solution no longer contains {old!r}: update this test"
    path = tmp_path / f"{name}.py"
    path.write_text("import os\nimport torch, torch.distributed as dist\nimport torch.nn.functional as F\n"
                    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                    "from torch.utils.data import DataLoader, DistributedSampler\n"
                    "from autograder.lessons.lesson07 import make_model, make_dataset, EPOCHS, BATCH_SIZE, LR, CHECKPOINT\n\n"
                    + source.replace(old, new) + "\n")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_the_self_check_catches_local_rank_used_as_the_global_rank(tmp_path):
    """Does the visible self-check (two simulated hosts, LOCAL_RANK 0 on both) fail a main() that takes LOCAL_RANK
    for RANK, naming the global RANK, as the hidden tests do?"""
    main = _answer_with(tmp_path, "local_rank_as_rank", 'rank = int(os.environ["RANK"])', 'rank = int(os.environ["LOCAL_RANK"])')
    text = _feedback(main, "self-check")
    assert "the saved weights differ from one process" in text and "the global RANK (not LOCAL_RANK)" in text, text


def test_a_main_without_the_barrier_loses_clean_exit(tmp_path):
    """Does a main() that never waits at a barrier after rank 0's save fail 'clean_exit', saying which ranks did not wait?"""
    main = _answer_with(tmp_path, "no_barrier", "    dist.barrier()  ", "    pass  ")
    text = _feedback(main, "clean_exit")
    assert "did not wait at a dist.barrier() for rank 0's checkpoint" in text, text


@pytest.mark.parametrize("part", ["runs", "clean_exit"])
def test_a_main_that_does_nothing_earns_neither_runs_nor_clean_exit(part):
    """Does a main() that returns at once lose 'runs' (every process exits 0) and 'clean_exit' (no group is left
    alive), each naming the process group it never made?"""
    text = _feedback(does_nothing, part)
    assert "rank 0 exited without ever making a process group (dist.init_process_group)" in text, text


@pytest.mark.parametrize("made_by", [
    'dist.distributed_c10d.init_process_group("gloo")',
    'from torch.distributed.device_mesh import init_device_mesh\n    mesh = init_device_mesh("cpu", (world_size,))'],
    ids=["distributed_c10d", "init_device_mesh"])
def test_a_group_made_through_torchs_own_module_earns_runs_and_clean_exit(tmp_path, made_by):
    """Does a main() that makes its group through torch.distributed.distributed_c10d, or with init_device_mesh (not
    the dist.init_process_group the job's wrapper replaces), still count as having joined the job, earning 'runs' and
    'clean_exit'? Before the wrapper held every group however it was made, the init_device_mesh answer's DeviceMesh
    or DDP freed the group's last reference as main() returned, and 4 of 10 jobs hung (torch 2.13)."""
    main = _answer_with(tmp_path, "own_group", 'dist.init_process_group("gloo")', made_by)
    grade("7.1", main, "runs")
    grade("7.1", main, "clean_exit")


def test_a_long_message_is_cut_between_words_so_the_feedback_names_no_folder_of_the_grader():
    """When a rank's exception is longer than what is recorded of it, is it cut where a word ends, so that the
    feedback's redaction still finds the course's folder (a path cut in half once reached a learner's page)?"""
    from autograder.grading.verdicts import redact
    from autograder.paths import ROOT

    text = redact(_feedback(raises_a_long_message_naming_a_course_file))
    assert "raised RuntimeError: word word" in text and " ..." in text, text
    assert str(ROOT)[:len(str(ROOT)) // 2 + 1] not in text, text


def test_a_rank_that_exits_without_an_exception_shows_its_code_and_last_output():
    """Does os._exit(3) on rank 1 show as rank 1's exit code 3 and its last stderr line, before the ranks stopped for it?"""
    text = _feedback(leaves_with_os_exit)
    first = text.split("The first to fail:\n", 1)[1]
    assert first.startswith("rank 1 (local rank 1 under torchrun agent 0) exited with code 3 without a Python exception"), text
    assert "Its last lines on stderr:\n  rank 1 leaves now" in first


def test_a_rank_killed_by_a_signal_says_so():
    """Does a SIGKILL on rank 1 show as 'killed by SIGKILL' with the rank's last stderr line?"""
    text = _feedback(killed_by_a_signal)
    first = text.split("The first to fail:\n", 1)[1]
    assert first.startswith("rank 1 (local rank 1 under torchrun agent 0) was killed by SIGKILL (exit code -9)"), text
    assert "rank 1 is about to be killed" in first


def test_the_group_of_a_right_answer_is_gone_before_its_process_exits(tmp_path):
    """After the instructor's main(), do the ranks exit with no gloo thread left running (the rare SIGABRT at exit)?

    A gloo worker thread lets go of each collective's Python state, taking the GIL, just after
    the collective returns. With the group alive at exit (kept by torch.distributed.nn's default
    arguments, which DDP imports) that ended a correct rank with SIGABRT now and then; with
    DDP's Reducer freeing the group's last reference at main()'s return (GIL held), the rank
    deadlocked. The wrapper keeps the groups and ends them itself once the script returned.
    Two agents of two processes: the shape where the deadlock showed (2 jobs in 15).
    """
    import importlib.util

    from autograder.lessons.lesson07 import COURSE
    from autograder.kit.torchrun import run_script
    from devtools.scratch import solution_source

    if not os.path.isdir("/proc/self/task"):
        pytest.skip("thread names come from /proc (Linux)")
    path = tmp_path / "instructors_answer.py"
    path.write_text("import os\nimport torch, torch.distributed as dist\nimport torch.nn.functional as F\n"
                    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                    "from torch.utils.data import DataLoader, DistributedSampler\n"
                    "from autograder.lessons.lesson07 import make_model, make_dataset, EPOCHS, BATCH_SIZE, LR, CHECKPOINT\n\n"
                    + solution_source("07-launching-at-scale", "ex7_1-main") + "\n")
    spec = importlib.util.spec_from_file_location("instructors_answer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = run_script(module.main, 2, 2, replace=COURSE)
    assert run.codes == [0, 0], run.tail()
    assert sorted(run.threads) == ["0", "1", "2", "3"]
    for rank, names in run.threads.items():
        assert not [n for n in names if "gloo" in n], f"rank {rank} still ran {names} at exit"


def test_a_peer_that_lost_its_connection_comes_after_the_rank_whose_end_caused_it(tmp_path):
    """From the records a job leaves: rank 1 killed (its agent noticed it late, in whole seconds) and rank 3 raising
    gloo's 'Connection reset by peer' a moment before that: is rank 1 the first to fail, rank 3 after it, and one
    stopped by its agent (SIGTERM) last? (Under load the agent's late time once put rank 3 first.)"""
    from autograder.kit.torchrun import ScriptRun, _read_records

    (tmp_path / "failures-0.json").write_text(json.dumps([
        {"rank": 1, "local_rank": 1, "exitcode": -9, "timestamp": 1700000002},
        {"rank": 0, "local_rank": 0, "exitcode": -15, "timestamp": 1700000002}]))
    (tmp_path / "failures-1.json").write_text(json.dumps([{"rank": 3, "local_rank": 1, "exitcode": 1,
                                                           "timestamp": 1700000003}]))
    error = tmp_path / "error-3-0.json"
    error.write_text(json.dumps({"type": "RuntimeError", "frames": [], "message": "[../gloo/transport/tcp/pair.cc:537] "
                                 "Read error [127.0.0.1]:22253: Connection reset by peer. This is typically caused by a "
                                 "remote worker hanging"}))
    os.utime(error, (1700000001.5, 1700000001.5))  # before the agent's time for rank 1
    run = ScriptRun(nnodes=2, nproc=2, folder=tmp_path, codes=[1, 1], output=[])
    _read_records(run)
    assert [(f.rank, f.signal) for f in run.failures] == [(1, "SIGKILL"), (3, None), (0, "SIGTERM")], run.failures
