"""Exercise 7.2's checks: does each usual mistake lose exactly the parts that name it, with feedback naming it,
while right answers of other shapes earn everything?

Every test runs answers under real ``torchrun`` agents with real SIGKILLs, as the hidden tests and the
self-check do (``autograder.hidden.grade("7.2", ...)``); the answers are the instructor's (``autograder/answers/lesson07.py``)
with one change each, or written another way. One fault seed for the module (``COURSE_FAULT_SEED``),
so that a failure here replays. Two more mistakes, the RNG restored on rank 0 only and a resume that
loads a half-written checkpoint, are graded with the whole lesson by tests/test_regrade_07.py.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from autograder.hidden import grade
from autograder.kit.registry import exercise
from autograder.kit.exercise import GradingFailure

pytestmark = pytest.mark.slow

PARTS = ("resumes", "no_repeat", "atomic", "reshard", "clean_exit")
REFERENCE = Path(__file__).resolve().parents[1] / "autograder" / "answers" / "lesson07.py"
IMPORTS = ("import os\nimport torch\nimport torch.distributed as dist\nimport torch.distributed.checkpoint as dcp\n"
           "import torch.nn.functional as F\n"
           "from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict\n"
           "from torch.nn.parallel import DistributedDataParallel as DDP\nfrom torch.utils.data import DistributedSampler\n"
           "from autograder.lessons.faults import CKPT_DIR, CKPT_EVERY, FINAL, GLOBAL_BATCH, LR, MOMENTUM, STEPS, "
           "make_dataset, make_dropout_model\n\n")

# Another right answer: rank 0 alone writes the whole state with torch.save, to a temporary name, then renames it.
ONE_WRITER = '''
def resilient_main():
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dataset = make_dataset()
    x_all, y_all = dataset.tensors
    per_rank, steps_per_epoch = GLOBAL_BATCH // world_size, len(dataset) // GLOBAL_BATCH
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    model = DDP(make_dropout_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    os.makedirs(CKPT_DIR, exist_ok=True)
    names = sorted(n for n in os.listdir(CKPT_DIR) if n.endswith(".pt"))
    start = 0
    if names:
        state = torch.load(os.path.join(CKPT_DIR, names[-1]), weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"])
        start = state["step"]
    for step in range(start, STEPS):
        epoch, position = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch)
        order = list(sampler)[position * per_rank:(position + 1) * per_rank]
        opt.zero_grad()
        F.cross_entropy(model(x_all[order]), y_all[order]).backward()
        opt.step()
        if (step + 1) % CKPT_EVERY == 0 and WRITER:
            path = os.path.join(CKPT_DIR, f"step-{step + 1:06d}.pt")
            torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(), "rng": torch.get_rng_state(),
                        "step": step + 1}, path + ".tmp")
            os.replace(path + ".tmp", path)
        dist.barrier()
    if rank == 0:
        model.eval()
        with torch.no_grad():
            print(f"final loss {F.cross_entropy(model(x_all), y_all).item():.6f}")
        torch.save({"model": model.module.state_dict()}, FINAL)
    dist.barrier()
    dist.destroy_process_group()
'''

# Another shape: every rank writes its own file into a temporary folder; after a barrier rank 0 renames the folder.
EVERY_RANK_ITS_FILE = '''
def resilient_main():
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dataset = make_dataset()
    x_all, y_all = dataset.tensors
    per_rank, steps_per_epoch = GLOBAL_BATCH // world_size, len(dataset) // GLOBAL_BATCH
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    model = DDP(make_dropout_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    os.makedirs(CKPT_DIR, exist_ok=True)
    done = sorted(n for n in os.listdir(CKPT_DIR) if not n.endswith(".tmp"))
    start = 0
    if done:
        folder = os.path.join(CKPT_DIR, done[-1])
        mine = os.path.join(folder, f"rank{rank}.pt")
        state = torch.load(mine if os.path.exists(mine) else os.path.join(folder, "rank0.pt"), weights_only=False)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"])
        start = state["step"]
    for step in range(start, STEPS):
        epoch, position = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch)
        order = list(sampler)[position * per_rank:(position + 1) * per_rank]
        opt.zero_grad()
        F.cross_entropy(model(x_all[order]), y_all[order]).backward()
        opt.step()
        if (step + 1) % CKPT_EVERY == 0:
            tmp = os.path.join(CKPT_DIR, f"step-{step + 1:06d}.tmp")
            os.makedirs(tmp, exist_ok=True)
            torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(), "rng": torch.get_rng_state(),
                        "step": step + 1}, os.path.join(tmp, f"rank{rank}.pt"))
            dist.barrier()
            if rank == 0:
                os.rename(tmp, tmp[:-4])
            dist.barrier()
    if rank == 0:
        model.eval()
        with torch.no_grad():
            print(f"final loss {F.cross_entropy(model(x_all), y_all).item():.6f}")
        torch.save({"model": model.module.state_dict()}, FINAL)
    dist.barrier()
    dist.destroy_process_group()
'''


@pytest.fixture(scope="module", autouse=True)
def one_seed():
    """One fault seed for the module: a failure here names it, and COURSE_FAULT_SEED replays it."""
    from autograder.lessons import faults

    os.environ.setdefault("COURSE_FAULT_SEED", "4242")
    faults._seed.clear()
    yield
    faults._seed.clear()


def _answer(tmp_path, name: str, source: str | None = None, *changes: tuple[str, str]):
    """An answer as a module's function (export_script reads its source): ``source``, or the instructor's
    answer, with each ``(old, new)`` of ``changes`` applied."""
    if source is None:
        source = REFERENCE.read_text().split("def resilient_main", 1)[1]
        source = "def resilient_main" + source
    for old, new in changes:
        assert old in source, f"the answer no longer contains {old!r}: update this test"
        source = source.replace(old, new)
    path = tmp_path / f"{name}.py"
    path.write_text(IMPORTS + source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.resilient_main


def _grades(fn, parts=PARTS) -> dict[str, str]:
    """Each part's verdict: "" when it passed, else its feedback."""
    verdicts = {}
    for part in parts:
        try:
            grade("7.2", fn, part)
            verdicts[part] = ""
        except GradingFailure as failure:
            verdicts[part] = str(failure)
    return verdicts


def test_right_answers_of_two_other_shapes_earn_every_part(tmp_path):
    """Do rank 0's torch.save with a rename, and every rank's own file marked after a barrier, earn all five parts?"""
    for name, source in (("one_writer", ONE_WRITER.replace("WRITER", "rank == 0")),
                         ("every_rank_its_file", EVERY_RANK_ITS_FILE)):
        verdicts = _grades(_answer(tmp_path, name, source))
        assert not any(verdicts.values()), f"{name}: {verdicts}"


def test_checkpoints_written_in_the_background_with_async_save_earn_every_part(tmp_path):
    """Does an answer that saves with DCP's async_save on a group of its own, waiting for each save before the next
    and before it ends, earn all five parts? Its write goes on beside the next steps: the grader counts a checkpoint
    complete once that write finished, not when async_save returned (before, it lost resumes, no_repeat and
    atomic for resuming, rightly, from the checkpoint before)."""
    save = '            dcp.save(state, checkpoint_id=os.path.join(CKPT_DIR, f"step-{step + 1:06d}"))'
    main = _answer(tmp_path, "async_save", None,
                   (save, "            if pending is not None:\n                pending.result()\n"
                          "            pending = dcp.async_save(state, checkpoint_id=os.path.join(CKPT_DIR, "
                          'f"step-{step + 1:06d}"), process_group=checkpoints)'),
                   ("    for step in range(start, STEPS):",
                    '    pending, checkpoints = None, dist.new_group(backend="gloo")  # DCP\'s collectives, apart\n'
                    "    for step in range(start, STEPS):"),
                   ("    if rank == 0:\n        model.eval()",
                    "    if pending is not None:\n        pending.result()\n    if rank == 0:\n        model.eval()"))
    verdicts = _grades(main)
    assert not any(verdicts.values()), verdicts


def test_resuming_the_model_but_not_the_optimizer_loses_resumes_and_reshard_naming_the_optimizer(tmp_path):
    """Does a checkpoint without the optimizer's state lose 'resumes' (and 'reshard', which resumes too), the feedback
    naming the optimizer, while the data order, the atomicity and the clean exit still earn their points?"""
    fn = _answer(tmp_path, "no_optimizer", None, ('"optim": opt_state, "step": step + 1', '"step": step + 1'),
                 ('"optim": opt_state, "step": 0', '"step": 0'),
                 ('optim_state_dict=state["optim"]', "optim_state_dict=opt_state"))
    verdicts = _grades(fn)
    assert verdicts["resumes"] and "the optimizer's state (SGD's momentum) was not the checkpoint's" in verdicts["resumes"]
    assert "fault seed 4242" in verdicts["resumes"]
    assert verdicts["reshard"] and not verdicts["no_repeat"] and not verdicts["atomic"] and not verdicts["clean_exit"], \
        verdicts


def test_restarting_the_epoch_from_its_first_batch_loses_no_repeat_naming_the_repeated_batch(tmp_path):
    """Does a resume that starts the epoch's batches over (the sampler's position not restored) lose 'no_repeat' and
    'resumes', the feedback naming the batch seen twice and the sampler?"""
    position = "order = list(sampler)[position * per_rank:(position + 1) * per_rank]"
    restart = ("order = list(sampler)[((step - start) % steps_per_epoch) * per_rank:"
               "((step - start) % steps_per_epoch + 1) * per_rank]")
    verdicts = _grades(_answer(tmp_path, "position_lost", None, (position, restart)), ("resumes", "no_repeat"))
    assert "seen twice" in verdicts["no_repeat"] and "sampler" in verdicts["no_repeat"], verdicts
    assert "the sampler's epoch or position was not restored" in verdicts["resumes"], verdicts


def test_every_rank_saving_to_one_file_loses_atomic_naming_it(tmp_path):
    """Does every process torch.saving the whole state to one file lose 'atomic', the feedback naming the ranks?"""
    verdicts = _grades(_answer(tmp_path, "one_file", ONE_WRITER.replace("WRITER", "True")), ("atomic",))
    assert "all wrote step-" in verdicts["atomic"] and "processes writing one file at once" in verdicts["atomic"], verdicts


def test_marking_a_checkpoint_complete_without_a_barrier_loses_atomic_naming_the_barrier(tmp_path):
    """When every rank writes its own file and rank 0 marks the checkpoint complete (a DONE file it renames into
    place) without waiting at a barrier, does the process killed while writing its file cost 'atomic', the feedback
    naming the missing barrier?

    The mark is a file in the folder, not the folder renamed: renaming the folder without a barrier could also take
    it away from under a slower rank about to open its file, which then crashes at a checkpoint before the planned
    fault (a different mistake's symptom, which made this test fail now and then under load)."""
    source = EVERY_RANK_ITS_FILE
    for old, new in (
            ('done = sorted(n for n in os.listdir(CKPT_DIR) if not n.endswith(".tmp"))',
             'done = sorted(n for n in os.listdir(CKPT_DIR) if os.path.exists(os.path.join(CKPT_DIR, n, "DONE")))'),
            ('tmp = os.path.join(CKPT_DIR, f"step-{step + 1:06d}.tmp")',
             'tmp = os.path.join(CKPT_DIR, f"step-{step + 1:06d}")'),
            ('''            dist.barrier()
            if rank == 0:
                os.rename(tmp, tmp[:-4])''', '''            if rank == 0:
                open(os.path.join(tmp, "DONE.tmp"), "w").close()
                os.replace(os.path.join(tmp, "DONE.tmp"), os.path.join(tmp, "DONE"))''')):
        assert old in source, old
        source = source.replace(old, new)
    verdicts = _grades(_answer(tmp_path, "no_barrier", source), ("atomic",))
    assert "call dist.barrier() before marking the newest checkpoint complete" in verdicts["atomic"], verdicts


def test_a_group_left_alive_or_a_process_left_running_loses_clean_exit_only(tmp_path):
    """Does a script that never destroys its process group, or one that leaves a child process running, lose
    'clean_exit' (naming destroy_process_group, or the process left), and keep 'resumes'?"""
    no_destroy = _answer(tmp_path, "no_destroy", None, ("    dist.destroy_process_group()\n", ""))
    verdicts = _grades(no_destroy, ("resumes", "clean_exit"))
    assert not verdicts["resumes"] and "dist.destroy_process_group()" in verdicts["clean_exit"], verdicts
    child = _answer(tmp_path, "child_left", None, ("    dist.barrier()                                      #",
                                                   "    __import__('subprocess').Popen(['sleep', '20'])\n"
                                                   "    dist.barrier()                                      #"))
    verdicts = _grades(child, ("clean_exit",))
    assert "left 1 process(es) running" in verdicts["clean_exit"] and "sleep 20" in verdicts["clean_exit"], verdicts


def resilient_does_nothing():
    pass


def test_a_script_that_does_nothing_loses_clean_exit_too():
    """Does a resilient_main() that returns at once (no group left alive, no process left running) lose 'clean_exit',
    naming the process group it never made?"""
    verdicts = _grades(resilient_does_nothing, ("clean_exit",))
    assert "exited without ever making a process group (dist.init_process_group)" in verdicts["clean_exit"], verdicts


def test_the_self_check_passes_the_instructors_answer_and_names_its_seed(tmp_path, capsys):
    """Does the visible self-check (2 processes, one killed) pass the instructor's answer and name the fault's seed?"""
    exercise("7.2").self_check(_answer(tmp_path, "instructors", None))
    out = capsys.readouterr().out
    assert "Self-check passed" in out and "fault seed 4242" in out, out


def test_no_process_of_these_jobs_is_left():
    """After every job above (killed processes, restarts, torn writes), is no agent or worker of theirs still running
    under this test process?"""
    from helpers._runtime.supervise import descendants

    left = []
    for pid in descendants(os.getpid()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it ended while we looked
            continue
        if "graded_agent.py" in command or "graded_run.py" in command or "torchrun" in command:
            left.append((pid, command[:120]))
    assert not left, left
