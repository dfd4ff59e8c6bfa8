"""Exercise 7.1's torchrun jobs: does a right answer end cleanly under the checks' wrapper?"""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.slow


def test_the_group_of_a_right_answer_is_gone_before_its_process_exits(tmp_path):
    """After the instructor's main(), do the ranks exit with no gloo thread left running (the rare SIGABRT at exit)?

    DDP's constructor imports torch.distributed.nn, whose functions keep the default group as a
    default argument when it is imported after init_process_group: the group and its gloo
    threads then outlive destroy_process_group(), and the interpreter's teardown beside them
    now and then ended a correct rank with SIGABRT. The checks' wrapper imports it first.
    """
    import importlib.util

    from autograder.lesson07 import run_script
    from autograder.scratch import solution_source

    if not os.path.isdir("/proc/self/task"):
        pytest.skip("thread names come from /proc (Linux)")
    path = tmp_path / "instructors_answer.py"
    path.write_text("import os\nimport torch, torch.distributed as dist\nimport torch.nn.functional as F\n"
                    "from torch.nn.parallel import DistributedDataParallel as DDP\n"
                    "from torch.utils.data import DataLoader, DistributedSampler\n"
                    "from autograder.lesson07 import make_model, make_dataset, EPOCHS, BATCH_SIZE, LR, CHECKPOINT\n\n"
                    + solution_source("07-launching-at-scale", "ex7_1-main") + "\n")
    spec = importlib.util.spec_from_file_location("instructors_answer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = run_script(module.main, 1, 2)
    assert run.codes == [0], run.tail()
    assert sorted(run.threads) == ["0", "1"]
    for rank, names in run.threads.items():
        assert not [n for n in names if "gloo" in n], f"rank {rank} still ran {names} at exit"
