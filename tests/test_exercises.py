"""The declared exercises: do the notebooks' graded cells match them, and who gets the blame when a check breaks?

Fast: no nbgrader run. The checks that start ranks use the course's own launcher, on 1-3
ranks, a second or so each.
"""

from __future__ import annotations

import doctest
import importlib
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from autograder import exercise, exercises
from autograder.notebooks.cells import graded_cells, problems, hidden_test_source
from autograder.kit.harness import CheckError, GradingFailure, course_frame
from autograder.kit.exercise import Exercise, Part
from autograder.kit.pieces import by_world_size, call_learner, first_difference, plural, seeded_tensor
from autograder.answers.lesson04 import chunk_bounds, ring_allreduce
from helpers import APIS, COLLECTIVES, POINT_TO_POINT
from helpers._runtime.protocol import Frame
from autograder.hidden import grade

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "solutions").glob("*/*.ipynb"))


# -- the notebooks against the declarations ------------------------------------------------


def test_every_lesson_has_its_module_and_every_module_its_lesson():
    """Is there an autograder/lessons/lessonNN.py for every lesson notebook with graded cells, and a notebook for every module?"""
    modules = {int(p.stem[len("lesson"):]) for p in (ROOT / "autograder" / "lessons").glob("lesson[0-9][0-9].py")}
    notebooks = {int(p.name.split("-")[0]) for p in NOTEBOOKS}
    graded = {int(p.name.split("-")[0]) for p in NOTEBOOKS if graded_cells(p)}
    assert graded <= modules, f"lessons with graded cells but no autograder module: {sorted(graded - modules)}"
    assert modules <= notebooks, f"autograder modules without a lesson notebook: {sorted(modules - notebooks)}"
    assert {ex.lesson for ex in exercises()} == modules


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.parent.name)
def test_graded_cells_match_the_declared_exercises(notebook):
    """Does every graded cell name a declared part with its declared points, in the one uniform shape, and does every part have exactly one cell?"""
    found = problems(notebook)
    assert found == [], "\n\n".join(found)


# Lessons 09 and 10 came after this rule; 9.2's measured check sits between its answer and its graded cells.
LAYOUT_CHECKED = [p for p in NOTEBOOKS if int(p.name[:2]) <= 8]


@pytest.mark.parametrize("notebook", LAYOUT_CHECKED, ids=lambda p: p.parent.name)
def test_the_first_code_cell_after_an_answer_runs_its_self_check(notebook):
    """As lesson 00 tells learners: is the first code cell after each exercise's answer cell the one that runs its
    visible self-check (a markdown note may sit between), so that demonstrations come after the checks?"""
    cells = json.loads(notebook.read_text())["cells"]
    wrong = []
    for i, cell in enumerate(cells):
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
        if not (cell.get("metadata", {}).get("nbgrader", {}).get("solution") and grade_id.startswith("ex")):
            continue
        number = grade_id.split("-")[0][len("ex"):].replace("_", ".")
        after = next((c for c in cells[i + 1:] if c["cell_type"] == "code"), None)
        if after is None or f'exercise("{number}").self_check(' not in "".join(after["source"]):
            wrong.append(f"{grade_id}: the next code cell is {''.join(after['source']).splitlines()[0] if after else None!r}")
    assert not wrong, "\n".join(wrong)


def test_a_mismatched_notebook_is_reported(tmp_path):
    """Would the check above catch wrong points, a missing part, a duplicated part and an old-style cell?"""
    nb = json.loads((ROOT / "solutions" / "04-ring-all-reduce" / "04-ring-all-reduce.ipynb").read_text())
    by_id = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id"): c for c in nb["cells"]}
    by_id["test-ex4_4-correct"]["metadata"]["nbgrader"]["points"] = 5
    by_id["test-ex4_4-bandwidth"]["source"] = by_id["test-ex4_4-no-hang"]["source"]  # no_hang twice, bandwidth never
    by_id["test-ex4_4-point-to-point"]["source"] = [
        "### BEGIN HIDDEN TESTS\n", "from autograder.lessons.lesson04 import check_ring_allreduce\n",
        'check_ring_allreduce(ring_allreduce, part="point_to_point")\n', "### END HIDDEN TESTS"]
    copy = tmp_path / "04-ring-all-reduce.ipynb"
    copy.write_text(json.dumps(nb))
    found = "\n".join(problems(copy))
    assert "nbgrader gives it 5 points, Exercise 4.4 declares 4" in found
    assert "part 'bandwidth' has 0 graded cells" in found
    assert "part 'no_hang' has 2 graded cells" in found
    assert "(test-ex4_4-point-to-point): a graded cell must make exactly one call" in found


def test_the_uniform_cell_names_everything_once():
    """Is a hidden test cell one heading, the exercise's import, and inside the hidden region the hidden checks' import
    and one grade call, all taken from the declaration?"""
    ex = exercise("4.4")
    lines = hidden_test_source(ex, "bandwidth").splitlines()
    assert lines == [
        '# Exercise 4.4, part "bandwidth" (3 points): each rank sends exactly 2(p-1) messages of at most '
        "ceil(n/p) elements (to any peer).",
        "from autograder import exercise",
        "### BEGIN HIDDEN TESTS",
        "from autograder.hidden import grade",
        'grade("4.4", ring_allreduce, "bandwidth")',
        "### END HIDDEN TESTS",
    ]


# -- the declarations themselves -------------------------------------------------------------


@pytest.mark.parametrize("ex", exercises(), ids=lambda ex: ex.number)
def test_declarations_are_complete(ex):
    """Does each exercise have a title, a self-check, parts with whole positive points and a heading sentence, and known switched-off calls with a reason?"""
    assert ex.title and ex.function.isidentifier()
    assert ex.visible_check is not None, f"{ex.label} has no visible self-check"
    for part in ex.parts:
        assert isinstance(part.points, int) and part.points > 0, (ex.label, part)
        assert part.name.isidentifier() and part.says.endswith("."), (ex.label, part.name)
    assert set(ex.forbid) <= set(COLLECTIVES) | set(POINT_TO_POINT) | set(APIS), sorted(
        set(ex.forbid) - set(COLLECTIVES) - set(POINT_TO_POINT) - set(APIS))
    assert bool(ex.forbid) == bool(ex.forbid_reason)


def test_points_per_lesson_are_unchanged():
    """Are the points per part what the lessons give (0: 1, 1: 4, 2: 4, 3: 12, 4: 18, 5: 10, 6: 16, 7: 20, 8: 6, 9: 10, 10: 19, 11: 14, 12: 19)?"""
    points = {ex.number: {p.name: p.points for p in ex.parts} for ex in exercises()}
    assert points == {
        "0.1": {"hello": 1},
        "1.1": {"one_host": 1, "several_hosts": 1},
        "1.2": {"share_run_id": 2},
        "2.1": {"correct": 2, "point_to_point": 1, "no_hang": 1},
        "3.1": {"correct": 2, "point_to_point": 1, "no_hang": 1},
        "3.2": {"correct": 2, "point_to_point": 1, "no_hang": 1},
        "3.3": {"correct": 2, "hierarchy": 2},
        "4.1": {"reduce_scatter": 1, "all_gather": 1},
        "4.2": {"correct": 2, "ring": 1},
        "4.3": {"correct": 2, "ring": 1},
        "4.4": {"correct": 4, "point_to_point": 2, "bandwidth": 3, "no_hang": 1},
        "5.1": {"correct": 2, "unused_frozen_tied": 1, "parameters_unchanged": 1, "training": 2},
        "5.2": {"same_steps": 2, "sharding": 2},
        "6.1": {"broadcast": 1, "gradients": 2, "per_parameter": 2, "unused": 1},
        "6.2": {"broadcast": 2, "gradients": 3, "waits": 1, "buckets": 2, "overlap": 1, "unused": 1},
        "7.1": {"runs": 2, "same_result": 3, "rank_zero_only": 2, "clean_exit": 1, "any_topology": 2},
        "7.2": {"resumes": 3, "no_repeat": 2, "atomic": 2, "reshard": 2, "clean_exit": 1},
        "8.1": {"hang": 2, "wrong_result": 2, "crash": 2},
        "9.1": {"sgd": 3, "adamw": 2, "state": 2, "traffic": 3},
        "10.1": {"forward": 2, "backward": 2, "communication": 2, "shards": 1},
        "10.2": {"gradients": 3, "messages": 2, "bubble": 3, "no_hang": 1},
        "10.3": {"gradients": 1, "memory": 1, "bubble": 1},
        "10.4": {"gradients": 1, "bubble": 1},
        "11.1": {"correct": 3, "ring": 2, "memory": 2, "no_hang": 1},
        "11.2": {"correct": 2, "balanced": 2},
        "11.3": {"correct": 1, "exchange": 1},
        "12.1": {"small": 3, "large": 3, "recompute": 2},
        "12.2": {"small": 3, "large": 3},
        "12.3": {"fits": 2, "fast": 3},
    }


def test_lookups_that_fail_say_what_exists():
    """Does asking for an unknown exercise or part name what there is instead?"""
    with pytest.raises(LookupError, match=r"autograder/lessons/lesson97\.py"):
        exercise("97.1")
    with pytest.raises(LookupError, match=r"declares no exercise 4\.9 \(it has 4\.1, 4\.2, 4\.3, 4\.4\)"):
        exercise("4.9")
    with pytest.raises(ValueError, match="look like '4.1'"):
        exercise("four")
    with pytest.raises(ValueError, match="correct, point_to_point, bandwidth, no_hang"):
        grade("4.4", ring_allreduce, "speed")


def test_a_new_lesson_module_is_found_without_registering_it(tmp_path, monkeypatch):
    """Does a lessonNN.py placed in the exercises package, with its checks in the hidden package, show up in
    exercise(), exercises() and grade() with nothing else changed?"""
    import autograder.lessons
    import autograder.hidden

    (tmp_path / "shipped").mkdir()
    (tmp_path / "hidden").mkdir()
    (tmp_path / "shipped" / "lesson97.py").write_text(
        "from autograder.kit.exercise import Exercise, Part\n"
        "EXERCISES = (Exercise(number='97.1', function='me', title='me', parts=(Part('right', 1, 'ranks.'),),"
        " visible_check=lambda attempt: 'passed'),)\n"
    )
    (tmp_path / "hidden" / "lesson97.py").write_text(
        "from autograder.kit.pieces import call_learner\n"
        "def _check(attempt):\n"
        "    if list(attempt.run(call_learner, 2, (attempt.fn,))) != [0, 1]:\n"
        "        attempt.fail('every rank should return its rank.')\n"
        "CHECKS = {'97.1': {'right': _check}}\n"
    )
    monkeypatch.setattr(autograder.lessons, "__path__", [*autograder.lessons.__path__, str(tmp_path / "shipped")])
    monkeypatch.setattr(autograder.hidden, "__path__", [*autograder.hidden.__path__, str(tmp_path / "hidden")])
    try:
        assert exercise("97.1").points == 1
        assert "97.1" in [ex.number for ex in exercises()]
        grade("97.1", lambda rank, world_size: rank, "right")
        with pytest.raises(GradingFailure, match="right: every rank should return its rank"):
            grade("97.1", lambda rank, world_size: 0, "right")
    finally:
        sys.modules.pop("autograder.lessons.lesson97", None)
        sys.modules.pop("autograder.hidden.lesson97", None)


# -- what the lesson 03 and 04 checks accept ---------------------------------------------------


def _direct_reduce_scatter(tensor):
    """Not a ring: every rank sends chunk j straight to rank j (bandwidth-optimal all the same)."""
    import torch

    rank, p = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)
    bounds = chunk_bounds(flat.numel(), p)
    mine = slice(*bounds[rank])
    incoming = {j: torch.empty(mine.stop - mine.start, dtype=flat.dtype) for j in range(p) if j != rank}
    requests = [dist.isend(flat[slice(*bounds[j])], j) for j in incoming]
    requests += [dist.irecv(buf, j) for j, buf in incoming.items()]
    for request in requests:
        request.wait()
    for buf in incoming.values():
        flat[mine] += buf
    return tensor


def _direct_allreduce(tensor):
    """Direct reduce-scatter, then every rank sends its finished chunk straight to every other rank."""
    rank, p = dist.get_rank(), dist.get_world_size()
    _direct_reduce_scatter(tensor)
    flat = tensor.view(-1)
    bounds = chunk_bounds(flat.numel(), p)
    requests = [dist.isend(flat[slice(*bounds[rank])], j) for j in range(p) if j != rank]
    requests += [dist.irecv(flat[slice(*bounds[j])], j) for j in range(p) if j != rank]
    for request in requests:
        request.wait()
    return tensor


def test_an_exchange_that_is_not_a_ring_passes_4_4_but_not_the_ring_steps():
    """As the exercise text says: does a bandwidth-optimal direct exchange earn 4.4's bandwidth part, and fail 4.2's ring part?"""
    grade("4.4", _direct_allreduce, "bandwidth")
    grade("4.2", _direct_reduce_scatter, "correct")
    with pytest.raises(GradingFailure, match=r"ring: on 3 ranks with 10 elements, rank 0 sent a message to rank 2; "
                                             r"in a ring each rank sends only to its right neighbour, rank 1"):
        grade("4.2", _direct_reduce_scatter, "ring")


def test_the_ring_self_checks_count_messages_like_the_hidden_tests():
    """Does 4.4's visible self-check fail the whole-tensor ring on its message sizes, as the hidden bandwidth part does?"""
    import torch

    from devtools.scratch import RING_ANSWERS

    namespace = {"dist": dist, "torch": torch}
    exec(RING_ANSWERS["whole_tensor"], namespace)  # the tutorial ring the grading tests also hand in
    whole_tensor_ring = namespace["ring_allreduce"]

    grade("4.4", whole_tensor_ring, "correct")
    with pytest.raises(GradingFailure, match=r"self-check: on 3 ranks with 10 elements, rank 0 sent 2 messages "
                                             r"carrying 20 elements \(the largest 10\)"):
        exercise("4.4").self_check(whole_tensor_ring)


def test_the_schedule_must_leave_rank_r_owning_chunk_r():
    """Does the textbook schedule shifted by one chunk (owner r+1) fail 4.1, saying which chunk came out complete?"""
    from autograder.answers.lesson04 import ring_chunks

    def shifted(phase, step, rank, world_size):
        send, recv = ring_chunks(phase, step, rank, world_size)
        return (send + 1) % world_size, (recv + 1) % world_size

    exercise("4.1").self_check(ring_chunks)
    with pytest.raises(GradingFailure, match=r"reduce_scatter: after the reduce-scatter on 2 ranks, rank 0's chunk 0 "
                                             r"holds the sum of ranks \[0\] only.* Its chunk 1 is complete instead"):
        grade("4.1", shifted, "reduce_scatter")
    with pytest.raises(GradingFailure, match=r"all_gather: on 2 ranks, at all-gather step 0, rank 0 sends chunk 1, "
                                             r"which it does not hold yet"):
        grade("4.1", shifted, "all_gather")


# Answers to Exercises 4.4 and 8.1 with the mistakes learners make, each a few lines away from a working one
# (defined outside this module, so that the ranks receive them by value instead of importing this file).
_RING_MISTAKES = '''
import torch
import torch.distributed as dist


def _bounds(n, p):
    size = -(-n // p)
    return [(min(i * size, n), min((i + 1) * size, n)) for i in range(p)]


def _steps(rank, p, flat, chunks, exchange):
    for step in range(p - 1):
        send, recv = (rank - step - 1) % p, (rank - step - 2) % p
        chunks[recv] += exchange(chunks[send], chunks[recv])


def _gather(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)
    bounds = _bounds(flat.numel(), p)
    for step in range(p - 1):
        send, recv = (rank - step) % p, (rank - step - 1) % p
        request = dist.isend(flat[slice(*bounds[send])], (rank + 1) % p)
        dist.recv(flat[slice(*bounds[recv])], (rank - 1) % p)
        request.wait()
    return tensor


def _isend_recv(rank, p):
    def exchange(outgoing, like):
        incoming = torch.empty_like(like)
        request = dist.isend(outgoing.clone(), (rank + 1) % p)
        dist.recv(incoming, (rank - 1) % p)
        request.wait()
        return incoming
    return exchange


def chunked_with_torch_chunk(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.view(-1).chunk(p))          # fewer than p chunks when the elements run out
    _steps(rank, p, tensor, chunks, _isend_recv(rank, p))
    return _gather(tensor)


def works_on_a_copy(tensor):
    tensor = tensor.clone()                          # the caller's tensor is never touched again
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)
    chunks = [flat[slice(*b)] for b in _bounds(flat.numel(), p)]
    _steps(rank, p, flat, chunks, _isend_recv(rank, p))
    return _gather(tensor)


def returns_nothing(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)
    chunks = [flat[slice(*b)] for b in _bounds(flat.numel(), p)]
    _steps(rank, p, flat, chunks, _isend_recv(rank, p))
    _gather(tensor)                                  # the sum is in place, but nothing is returned


def sends_first(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)
    chunks = [flat[slice(*b)] for b in _bounds(flat.numel(), p)]

    def exchange(outgoing, like):
        incoming = torch.empty_like(like)
        dist.send(outgoing.clone(), (rank + 1) % p)  # every rank sends first: nobody receives
        dist.recv(incoming, (rank - 1) % p)
        return incoming
    _steps(rank, p, flat, chunks, exchange)
    return _gather(tensor)


def reads_before_wait(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)
    chunks = [flat[slice(*b)] for b in _bounds(flat.numel(), p)]

    def exchange(outgoing, like):
        incoming = torch.zeros_like(like)
        sent, received = dist.isend(outgoing.clone(), (rank + 1) % p), dist.irecv(incoming, (rank - 1) % p)
        early = incoming.clone()                     # read before received.wait(): often still zeros
        received.wait()
        sent.wait()
        return early
    _steps(rank, p, flat, chunks, exchange)
    return _gather(tensor)


class _Repaired8Wrongly:
    """Exercise 8.1's programs with two of the lesson's mistakes left in: every rank sends first, and the
    gather pads each rank's tensor to its own length (plus one) instead of the longest."""

    @staticmethod
    def pass_right(rank, world_size, x):
        incoming = torch.empty_like(x)
        dist.send(x, dst=(rank + 1) % world_size)
        dist.recv(incoming, src=(rank - 1) % world_size)
        return incoming

    @staticmethod
    def global_mean(rank, world_size, x):
        return x.mean()

    @staticmethod
    def gather_all(rank, world_size, x):
        length = torch.tensor([x.numel()])
        lengths = [torch.zeros_like(length) for _ in range(world_size)]
        dist.all_gather(lengths, length)
        padded = torch.cat([x, torch.zeros(1, dtype=x.dtype)])
        pieces = [torch.empty_like(padded) for _ in range(world_size)]
        dist.all_gather(pieces, padded)
        return torch.cat([piece[: int(n)] for piece, n in zip(pieces, lengths)])
'''
_RINGS = {"__name__": "lesson04_test_mistakes"}
exec(compile(_RING_MISTAKES, "<4.4 test mistakes>", "exec"), _RINGS)


@pytest.mark.parametrize("mistake, says", [
    ("chunked_with_torch_chunk", r"(?s)raised IndexError.*torch\.chunk\(t, p\).*returns fewer than p.*chunk_bounds\(n, p\)"),
    ("works_on_a_copy", r"the tensor passed in was not changed"),
    ("returns_nothing", r"the function returned None instead of the tensor it was given"),
    ("sends_first", r"(?s)deadlocked.*every rank is sending before anyone receives.*dist\.isend.*even ranks send first"),
    ("reads_before_wait", r"(?s)a partial sum.*half-finished exchange.*Call wait\(\) before you read"),
])
def test_4_4_feedback_names_the_fix(mistake, says):
    """Does 4.4's self-check answer each usual mistake (torch.chunk's short list, a copy, no return, every rank
    sending first, a buffer read before its wait()) with the fix, not only with the values or a raw exception?"""
    with pytest.raises(GradingFailure, match=says):
        exercise("4.4").self_check(_RINGS[mistake])


def test_8_1_feedback_names_the_fix():
    """Does 8.1 answer a send-first pass_right with isend or the odd/even order, and a gather of unequal sizes
    (gloo aborts the rank: SIGABRT) with the rule that the ranks agree on the longest length first?"""
    with pytest.raises(GradingFailure, match=r"(?s)hang \(pass_right\): your code deadlocked.*dist\.isend.*even ranks send first"):
        grade("8.1", _RINGS["_Repaired8Wrongly"], "hang")
    with pytest.raises(GradingFailure, match=r"(?s)crash \(gather_all\): rank \d was killed by SIGABRT.*gloo's all_gather needs "
                                             r"every rank's tensor to have the same number of elements.*longest"):
        grade("8.1", _RINGS["_Repaired8Wrongly"], "crash")


# Answers to Exercises 5.1 and 5.2 with the mistakes the feedback must name (run by value on the ranks).
_LESSON05_MISTAKES = '''
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler


def averages_the_weights(model):
    with torch.no_grad():
        for p in model.parameters():
            dist.all_reduce(p)
            p /= dist.get_world_size()


def sums_in_float32(model):
    params = [p for p in model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1).float() for p in params])    # the float64 gradients lose digits here
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    for p, part in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(part.view_as(p.grad))


def divides_before_wait(model):
    works = []
    for p in model.parameters():
        if p.grad is not None:
            works.append(dist.all_reduce(p.grad, async_op=True))
            p.grad /= dist.get_world_size()                            # the sum has not arrived yet
    for work in works:
        work.wait()


def does_nothing(model):
    pass                                                                # the weights stay, and so do the gradients


def reduce_to_rank_0(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.reduce(p.grad, dst=0)                                  # only rank 0 gets the sum
            p.grad /= dist.get_world_size()


def forgets_to_divide(model):
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)


def _average(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def _loop(model, loader, epochs, lr, sampler=None, split=None):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for epoch in range(epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            if split is not None:
                x, y = x[split[0]::split[1]], y[split[0]::split[1]]
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            _average(model)
            opt.step()
            losses.append(loss.item())
    return losses


def no_set_epoch(rank, world_size, dataset, model, epochs, batch_size, lr):
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
    return _loop(model, DataLoader(dataset, batch_size=batch_size, sampler=sampler), epochs, lr)


def not_sharded(rank, world_size, dataset, model, epochs, batch_size, lr):
    return _loop(model, DataLoader(dataset, batch_size=batch_size, shuffle=True), epochs, lr)


def splits_each_batch(rank, world_size, dataset, model, epochs, batch_size, lr):
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    return _loop(model, loader, epochs, lr, split=(rank, world_size))
'''
_LESSON05 = {"__name__": "lesson05_test_mistakes"}
exec(compile(_LESSON05_MISTAKES, "<5.1 and 5.2 test mistakes>", "exec"), _LESSON05)


@pytest.mark.parametrize("number, mistake, says", [
    ("5.1", "averages_the_weights", r"the weights \(the parameters themselves\) changed: your code averaged the weights "
                                    r"instead of the gradients"),
    # The float32 sum is within a millionth of the mean: the numbers shown must not read as the mean itself.
    ("5.1", "sums_in_float32", r"rank 0 ended with 2\.33333325\d+; .*within a millionth of the mean but not on it "
                               r"\(the mean is 2\.3333333333333335\).*float32"),
    ("5.1", "divides_before_wait", r"half-finished exchange.*Call wait\(\) before you read, add, copy or divide"),
    ("5.2", "no_set_epoch", r"epoch 1 gave every rank the same samples, in the same order, as epoch 0.*"
                            r"sampler\.set_epoch\(epoch\)"),
    ("5.2", "not_sharded", r"It trained on all 12 samples every epoch, not on its own 6: give each rank its own shard"),
    ("5.2", "splits_each_batch", r"fewer than batch_size \(3\), which is already the batch of one rank"),
])
def test_5_1_and_5_2_feedback_names_the_mistake(number, mistake, says):
    """Do 5.1's and 5.2's self-checks name weights averaged instead of gradients, a sum that lost precision (without
    printing numbers that look like the mean), a division before wait(), a loop without set_epoch, an unsharded
    loop and a batch split between the ranks, instead of a number or an unrelated hint?"""
    with pytest.raises(GradingFailure, match=says):
        exercise(number).self_check(_LESSON05[mistake])


def test_a_ring_that_exchanges_nothing_earns_no_hang():
    """Does 4.4's "no_hang" refuse a ring_allreduce that returns at once (it cannot deadlock), naming what the rank
    never did, and still pay the instructor's ring?"""
    def returns_at_once(tensor):
        return tensor

    with pytest.raises(GradingFailure, match=r"no_hang: on 2 ranks with 7 elements, rank 0 finished, but it sent no "
                                             r"point-to-point message"):
        grade("4.4", returns_at_once, "no_hang")
    grade("4.4", ring_allreduce, "no_hang")


@pytest.mark.parametrize("mistake, says", [
    ("does_nothing", r"each rank with slightly different weights: after average_gradients rank 1's \S+\.grad differs "
                     r"from rank 0's\. Every rank still holds the gradient it computed itself: nothing was averaged\."),
    ("reduce_to_rank_0", r"rank 1's \S+\.grad differs from rank 0's\. This part pays for gradients averaged over the "
                         r"ranks with the weights left alone"),
])
def test_5_1_weights_part_pays_only_when_the_gradients_were_exchanged(mistake, says):
    """Does 5.1's "parameters_unchanged" (only the gradients change) refuse an answer that changes nothing, and one
    that leaves the ranks with different gradients, though neither touches the weights?"""
    with pytest.raises(GradingFailure, match=says):
        grade("5.1", _LESSON05[mistake], "parameters_unchanged")


def test_5_1_weights_part_pays_a_sum_that_forgets_to_divide():
    """Does an average that forgets the division keep "parameters_unchanged" (its gradients are exchanged and its
    weights untouched; the division is judged by "correct") while losing "correct"?"""
    grade("5.1", _LESSON05["forgets_to_divide"], "parameters_unchanged")
    with pytest.raises(GradingFailure, match=r"(?i)did you divide by the world size\?"):
        grade("5.1", _LESSON05["forgets_to_divide"], "correct")


def test_a_flat_all_reduce_is_correct_but_not_hierarchical():
    """Does Exercise 3.3 (collectives allowed) accept the reference, and give a plain dist.all_reduce the sums but not the hierarchy part?"""
    from autograder.answers.lesson03 import hierarchical_all_reduce

    def flat(tensor, ranks_per_node):
        dist.all_reduce(tensor)

    grade("3.3", hierarchical_all_reduce, "hierarchy")
    grade("3.3", flat, "correct")
    with pytest.raises(GradingFailure, match=r"hierarchy: on 4 ranks with ranks_per_node=2, rank 0 called all_reduce "
                                             r"on the whole world \(the default group\); its all_reduce belongs on "
                                             r"the leaders' group, \[0, 2\]"):
        grade("3.3", flat, "hierarchy")


# -- whose fault is it? -------------------------------------------------------------------------


class _BrokenOnPurpose:
    """An exercise whose one part's check is ``check`` (the hidden package's role)."""

    def __init__(self, check) -> None:
        self.exercise = Exercise(number="9.1", function="ring_allreduce", title="broken on purpose",
                                 parts=(Part("broken", 1, "a check with a bug in it."),))
        self.check = check

    def grade(self, fn, part: str) -> None:
        self.exercise.grade(fn, part, self.check)


def _exercise_with(check) -> _BrokenOnPurpose:
    return _BrokenOnPurpose(check)


def test_a_check_that_breaks_in_the_notebook_raises_the_courses_error():
    """Does a bug in a check's own notebook-side code come out as CheckError, blaming the course, not the learner?"""

    def buggy(attempt):
        return {}["no such key"]  # a check with a bug

    with pytest.raises(CheckError) as info:
        _exercise_with(buggy).grade(ring_allreduce, "broken")
    err = info.value
    assert not isinstance(err, GradingFailure)
    text = str(err)
    assert 'Exercise 9.1, part "broken"' in text and "KeyError: 'no such key'" in text
    assert "not in your answer" in text and "tell your instructor" in text
    assert isinstance(err.__cause__, KeyError)


def test_a_check_that_breaks_inside_a_rank_raises_the_courses_error():
    """Does a rank failing inside the autograder's own files (a typo in a case table) come out as CheckError?"""
    ringcheck = importlib.import_module("autograder.lessons.ringcheck")

    def typo_in_cases(attempt):
        attempt.run(ringcheck.all_reduce_worker, 2, (attempt.fn, [((3,), "float23")], 1), timeout=10.0)

    with pytest.raises(CheckError) as info:
        _exercise_with(typo_in_cases).grade(ring_allreduce, "broken")
    text = str(info.value)
    assert 'Exercise 9.1, part "broken"' in text and "AttributeError" in text and "float23" in text
    assert "not in your answer" in text and "autograder" in text  # the frame, for the instructor


def test_a_learner_exception_is_still_the_learners():
    """Does an exception raised in the learner's own code stay a GradingFailure naming it?"""

    def raises(tensor):
        raise ValueError("my mistake")

    with pytest.raises(GradingFailure, match=r"correct: rank \d raised ValueError: my mistake on 1 rank"):
        grade("4.4", raises, "correct")


def test_a_learner_error_inside_torch_is_still_the_learners():
    """Does a wrong torch.distributed call by the learner (failing inside torch) stay the learner's fault?"""

    def bad_peer(tensor):
        dist.send(tensor, dst=dist.get_world_size() + 3)

    with pytest.raises(GradingFailure) as info:
        grade("4.4", bad_peer, "no_hang")
    assert not isinstance(info.value, CheckError)


def test_an_untouched_stub_gets_the_stub_feedback():
    """Does the stub's NotImplementedError give the 'replace the raise line' feedback, naming the exercise?"""

    def stub(tensor):
        raise NotImplementedError("Exercise 4.4: ring all-reduce")

    with pytest.raises(GradingFailure, match=r"bandwidth: `ring_allreduce` still raises NotImplementedError "
                                             r"\(Exercise 4\.4: ring all-reduce\)\. Replace the"):
        grade("4.4", stub, "bandwidth")


def test_a_switched_off_call_gives_the_lessons_own_reason():
    """Does calling dist.all_reduce in the ring say it is switched off, with lesson 04's reason?"""

    def builtin(tensor):
        dist.all_reduce(tensor)

    ex = exercise("4.4")
    with pytest.raises(GradingFailure) as info:
        grade(ex.number, builtin, "point_to_point")
    text = str(info.value)
    assert "called a built-in collective" in text and "switched off here" in text and ex.forbid_reason in text


def test_a_function_the_ranks_cannot_receive_is_the_learners_fault():
    """Does a function that cannot be pickled (it holds a lock) get learner feedback, not the course's error?"""
    import threading

    lock = threading.Lock()

    def locked(tensor):
        with lock:
            tensor += 0

    with pytest.raises(GradingFailure, match="correct: `ring_allreduce` cannot be sent to the fresh processes"):
        grade("4.4", locked, "correct")


def _local_sum_with_dummy_messages(rank, world_size, value):
    # Talks round the ring, but works the total out alone.
    if world_size > 1:
        request = dist.isend(torch.zeros(1), (rank + 1) % world_size)
        dist.recv(torch.zeros(1), (rank - 1) % world_size)
        request.wait()
    return value * world_size


def _star_sum(rank, world_size, value):
    # The right total, gathered at rank 0 and sent back: not a ring.
    token = torch.tensor([value])
    if rank == 0:
        total = value
        for peer in range(1, world_size):
            dist.recv(token, src=peer)
            total += int(token)
        for peer in range(1, world_size):
            dist.send(torch.tensor([total]), dst=peer)
        return total
    dist.send(token, dst=0)
    dist.recv(token, src=0)
    return token


def test_a_ring_sum_worked_out_alone_fails_even_with_ring_messages():
    """Does a ring_sum that sends dummy messages round the ring but computes its total alone fail the totals, the pattern part and the self-check?"""
    ex = exercise("2.1")
    for part in ("correct", "point_to_point"):
        with pytest.raises(GradingFailure, match=rf"(?s){part}: on 2 ranks the values were .*Each rank knows only its own value"):
            grade(ex.number, _local_sum_with_dummy_messages, part)
    with pytest.raises(GradingFailure, match="every rank should return their sum"):
        ex.self_check(_local_sum_with_dummy_messages)


def test_a_star_shaped_sum_is_right_but_not_a_ring():
    """Does a sum gathered at rank 0 earn the totals but fail the ring pattern, naming the rank and the wrong peer?"""
    ex = exercise("2.1")
    grade(ex.number, _star_sum, "correct")
    with pytest.raises(GradingFailure, match=r"point_to_point: on 3 ranks, rank \d (sent a message \(send\) to|received a "
                                             r"message \(recv\) from) rank \d\. In the ring"):
        grade(ex.number, _star_sum, "point_to_point")
    with pytest.raises(GradingFailure, match="self-check: on 3 ranks"):
        ex.self_check(_star_sum)


# Answers to Exercise 9.1 that the checks must judge, defined outside this module so that the ranks receive
# them by value (cloudpickle) instead of importing this test file, whose imports would eat the checks' timeouts.
_ANSWERS_9_1 = '''
import torch
import torch.distributed as dist


class _RingShardedOptimizer:
    """ZeRO-1 whose two exchanges are lesson 4's ring, by hand, with point-to-point calls only."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.params = list(params)
        self.p, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(q.numel() for q in self.params)
        self.shard = -(-self.numel // self.p)
        mine = self._flatten([q.detach() for q in self.params])[self.rank * self.shard:(self.rank + 1) * self.shard]
        self.local = torch.nn.Parameter(mine.clone())
        self.optimizer = optimizer_cls([self.local], **kwargs)

    def _flatten(self, tensors):
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.nn.functional.pad(flat, (0, self.shard * self.p - self.numel))

    def _ring(self, flat, add):
        """p-1 steps: send a chunk right, receive one from the left (reduce-scatter when add, else all-gather)."""
        right, left, n = (self.rank + 1) % self.p, (self.rank - 1) % self.p, self.shard
        incoming = torch.empty(n, dtype=flat.dtype)
        for step in range(self.p - 1):
            send = (self.rank - step - (1 if add else 0)) % self.p
            recv = (send - 1) % self.p
            request = dist.isend(flat[send * n:(send + 1) * n].clone(), right)
            dist.recv(incoming, left)
            request.wait()
            if add:
                flat[recv * n:(recv + 1) * n] += incoming
            else:
                flat[recv * n:(recv + 1) * n] = incoming

    @torch.no_grad()
    def step(self):
        flat = self._flatten([q.grad if q.grad is not None else torch.zeros_like(q) for q in self.params])
        mine = slice(self.rank * self.shard, (self.rank + 1) * self.shard)
        self._ring(flat, add=True)                      # chunk `rank` now holds its sum over the ranks
        self.local.grad = flat[mine] / self.p
        self.optimizer.step()
        flat[mine] = self.local.detach()
        self._ring(flat, add=False)
        offset = 0
        for q in self.params:
            q.copy_(flat[offset:offset + q.numel()].view_as(q))
            offset += q.numel()


class _SubclassShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1 as a torch optimizer (schedulers and state_dict see its param_groups), stepping an inner one over one
    flat slice of the trainable parameters and putting back the values of those that had no gradient."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.params = [q for q in params if q.requires_grad]
        super().__init__(self.params, kwargs)
        self.p, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(q.numel() for q in self.params)
        self.shard = -(-self.numel // self.p)
        flat = self._flatten([q.detach() for q in self.params])
        self.local = torch.nn.Parameter(flat[self.rank * self.shard:(self.rank + 1) * self.shard].clone())
        self.inner = optimizer_cls([self.local], **kwargs)

    def _flatten(self, tensors):
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.nn.functional.pad(flat, (0, self.shard * self.p - self.numel))

    @torch.no_grad()
    def step(self, closure=None):
        grads = self._flatten([q.grad if q.grad is not None else torch.zeros_like(q) for q in self.params])
        idle = self._flatten([torch.full_like(q, q.grad is None) for q in self.params]).bool()
        idle = idle[self.rank * self.shard:(self.rank + 1) * self.shard]
        mean = torch.empty_like(self.local)
        dist.reduce_scatter_tensor(mean, grads)
        self.local.grad = mean / self.p
        before = self.local.detach().clone()
        self.inner.step()
        self.local[idle] = before[idle]
        flat = torch.empty_like(grads)
        dist.all_gather_into_tensor(flat, self.local.detach())
        offset = 0
        for q in self.params:
            q.copy_(flat[offset:offset + q.numel()].view_as(q))
            offset += q.numel()


class _GathersGradients:
    """Right numbers, not ZeRO-1: all-gathers the averaged gradients, then every rank steps the whole model."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.params = list(params)
        self.p, self.rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(q.numel() for q in self.params)
        self.shard = -(-self.numel // self.p)
        self.optimizer = optimizer_cls(self.params, **kwargs)

    @torch.no_grad()
    def step(self):
        flat = torch.cat([(q.grad if q.grad is not None else torch.zeros_like(q)).reshape(-1) for q in self.params])
        flat = torch.nn.functional.pad(flat, (0, self.shard * self.p - self.numel))
        mine = torch.empty(self.shard, dtype=flat.dtype)
        dist.reduce_scatter_tensor(mine, flat)
        dist.all_gather_into_tensor(flat, mine / self.p)      # the mean gradient, whole, on every rank
        offset = 0
        for q in self.params:
            if q.grad is not None:                            # a parameter without a gradient stays without one
                q.grad = flat[offset:offset + q.numel()].view_as(q).clone()
            offset += q.numel()
        self.optimizer.step()                                 # every rank steps everything


class _WrapsZeroRedundancy:
    def __init__(self, params, optimizer_cls, **kwargs):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self.opt = ZeroRedundancyOptimizer(list(params), optimizer_class=optimizer_cls, **kwargs)


class _UsesFullyShard:
    def __init__(self, params, optimizer_cls, **kwargs):
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:  # before torch 2.6 it lived here only (switched off there too)
            from torch.distributed._composable.fsdp import fully_shard

        fully_shard(torch.nn.Linear(2, 2))
'''
_ANSWERS = {"__name__": "lesson09_test_answers"}
exec(compile(_ANSWERS_9_1, "<9.1 test answers>", "exec"), _ANSWERS)


def test_9_1_accepts_a_hand_made_ring_and_refuses_torchs_own_sharding(factory):
    """Does a ZeRO-1 whose exchanges are hand-made rings earn 9.1's traffic part, and do torch's ZeroRedundancyOptimizer and fully_shard raise with the exercise's reason?"""
    from autograder.lessons.shardcheck import model_sizes, sharded_worker
    from helpers import launch

    ex = exercise("9.1")
    vocab, width = model_sizes(1)
    case = {"seed": 1, "vocab": vocab, "width": width, "dtype": "float32", "optimizer": "sgd", "steps": 1, "per_rank": 2}
    # A first run without the checks' short timeout: a fresh test process's first ranks import what
    # the optimizers need, which on a loaded machine alone can outlast it (grading starts warm).
    launch(sharded_worker, 2, args=(_ANSWERS["_RingShardedOptimizer"], case), timeout=120, output="quiet")
    grade(ex.number, _ANSWERS["_RingShardedOptimizer"], "traffic")
    with pytest.raises(GradingFailure, match=r"sgd: rank 0 called torch's own ZeroRedundancyOptimizer on 1 rank.*"
                                             r"ZeroRedundancyOptimizer is switched off here: Exercise 9.1 asks you to "
                                             r"build the sharded optimizer"):
        grade(ex.number, _ANSWERS["_WrapsZeroRedundancy"], "sgd")
    with pytest.raises(GradingFailure, match=r"sgd: rank 0 called torch's own FSDP on 1 rank.*fully_shard is switched "
                                             r"off here: Exercise 9.1 asks you to build the sharded optimizer"):
        grade(ex.number, _ANSWERS["_UsesFullyShard"], "sgd")


def test_9_1_judges_the_state_held_and_what_the_all_gather_carries(factory):
    """Does a ZeRO-1 that subclasses torch.optim.Optimizer (its param_groups list the whole model, an inner optimizer
    steps its shard) earn every part, and does one that all-gathers the averaged gradients and steps the whole model
    on every rank, right numbers and right call sizes, lose "state" and "traffic", each saying why?"""
    ex = exercise("9.1")
    for part in ("sgd", "adamw", "state", "traffic"):
        grade(ex.number, _ANSWERS["_SubclassShardedOptimizer"], part)
    grade(ex.number, _ANSWERS["_GathersGradients"], "sgd")
    with pytest.raises(GradingFailure, match=r"optimizer keeps state for \d+ elements, the whole model"):
        grade(ex.number, _ANSWERS["_GathersGradients"], "state")
    with pytest.raises(GradingFailure, match=r"the all-gather carried \d+ values that are not a slice of the parameters"
                                             r".*ZeRO-1 gathers the \*updated parameters\*"):
        grade(ex.number, _ANSWERS["_GathersGradients"], "traffic")


def test_9_1_adamw_passes_a_right_answer_on_the_seed_that_drifted_in_float32(factory, monkeypatch):
    """Does the instructor's ZeRO-1 earn "adamw" on seed 1417764502 with 2 ranks? In float32 Adam's division by the
    root of the second moment turned a reordered sum's last bit into a 5e-4 drift there, past the old 1e-4: a right
    answer lost 2 points about once in 6000 runs, so the part now runs in float64."""
    from autograder.answers.lesson09 import ShardedOptimizer
    from autograder.lessons import lesson09

    monkeypatch.setattr(lesson09, "fresh_seed", lambda: 1417764502)
    exercise("9.1").grade(ShardedOptimizer, "adamw", check=lambda attempt: lesson09._adamw(attempt, (2,)))


def test_a_missing_function_is_named():
    """Does grading something that is not a function ask for the function by name?"""
    with pytest.raises(GradingFailure, match="Exercise 2.1: define a function named `ring_sum`"):
        grade("2.1", None, "correct")


def test_course_frame_finds_the_innermost_frame_that_is_not_a_library():
    """Is a traceback blamed on the course only when its innermost non-library frame is in autograder/?"""
    grader = ROOT / "autograder" / "lessons" / "ringcheck.py"
    torch_file = Path(dist.__file__)
    learner = [Frame("/tmp/ipykernel_7/12.py", 4, "ring_allreduce")]
    ours = [Frame(str(grader), 70, "all_reduce_worker")]
    library = [Frame(str(torch_file), 9, "send")]
    assert course_frame(ours + learner) is None
    assert course_frame(ours + learner + library) is None
    assert course_frame(ours + library) is not None and "all_reduce_worker" in course_frame(ours + library)
    assert course_frame([]) is None


# -- the shared pieces --------------------------------------------------------------------------


def test_shared_pieces():
    """Do the kit's small helpers give what the checks rely on?"""
    assert plural(1, "rank") == "1 rank" and plural(3, "rank") == "3 ranks"
    assert by_world_size([(3, "a"), (1, "b"), (3, "c")]) == [(1, [("b",)]), (3, [("a",), ("c",)])]
    a = seeded_tensor((4,), "float32", 5, 2)
    assert a.equal(seeded_tensor((4,), "float32", 5, 2)) and not a.equal(seeded_tensor((4,), "float32", 5, 3))
    small = seeded_tensor((50,), "int64", 5, 0, int_range=(-50, 50))
    assert int(small.abs().max()) <= 50
    diff = first_difference(a + 1e-7, a, tolerance=1e-4)
    assert diff is None
    wrong = a.clone()
    wrong[2] = 99.0
    diff = first_difference(wrong, a)
    assert diff.what == "first wrong element at flat index 2" and "expected" in diff.excerpt
    assert "shape" in first_difference(a[:2], a).what


@pytest.mark.parametrize("module", ["autograder"] + [f"autograder.{name}" for name in (
    "kit.exercise", "kit.harness", "kit.pieces", "kit.registry", "kit.torchrun_programs", "notebooks.cells",
    "notebooks.preprocessors", "notebooks.imports", "answers.lesson04", "release", "grading.sandbox", "learner.definitions",
    "grading.summary", "grading.unused", "grading.verdicts", "hidden", "hidden.lesson00", "hidden.lesson01", "hidden.lesson02",
    "hidden.lesson04", "hidden.lesson09", "hidden.planparts", "lessons.lesson03", "lessons.lesson08", "lessons.ringcheck",
    "lessons.shardcheck", "lessons.tpcheck", "lessons.tpdata", "lessons.pipecheck", "lessons.cpcheck",
    "lessons.cpdata")]
    + ["devtools.scratch"])
def test_docstring_examples_run(module):
    """Do the runnable examples in the autograder's docstrings give what they show?"""
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{module} shows no runnable example"
    assert result.failed == 0, f"{result.failed} docstring examples of {module} failed"


# -- an answer that does nothing earns nothing ------------------------------------------------------


def _returns_its_input(*args, **kwargs):
    return args[0] if args else None


@pytest.mark.parametrize("number", [ex.number for ex in exercises()])
def test_no_part_pays_an_answer_that_does_nothing(number):
    """Does every graded part of every exercise refuse an answer that does nothing (it hands back its first argument
    untouched: a tensor, a model, the parameters, a rank), as the learner's failure? A part that pays one pays for
    something the answer never did (it cannot deadlock, corrupt a checkpoint or touch the weights), and a check
    that breaks on one (a "class" whose object lacks the method the check calls) would tell the learner the course
    is at fault. (An answer that gives None: kit.pieces.usable's example, and the parts' own tests.)"""
    paid, blamed = [], []
    for part in exercise(number).parts:
        try:
            grade(number, _returns_its_input, part.name)
        except GradingFailure:
            continue
        except CheckError as err:
            blamed.append(f"{part.name}: {str(err).splitlines()[0]}")
            continue
        paid.append(part.name)
    assert not paid, f"Exercise {number} pays an answer that does nothing on: {paid}"
    assert not blamed, f"Exercise {number}'s checks blame the course for an answer that does nothing: {blamed}"
