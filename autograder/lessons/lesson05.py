"""Lesson 05's graded exercises: 5.1 ``average_gradients(model)`` and 5.2 ``train(...)``.

Exercise 5.1: after ``loss.backward()`` on every rank, replace each parameter's ``.grad``,
in place, with its mean over all ranks of the default group. Frozen parameters, and
parameters with no gradient on any rank, are left alone; a parameter with a gradient on
some ranks only counts as zero on the others. Parameters themselves must not change.

Exercise 5.2: ``train(rank, world_size, dataset, model, epochs, batch_size, lr)`` trains
``model`` in place with data-parallel SGD on this rank's shard of ``dataset`` and returns
this rank's loss at each step. In every epoch the ranks together see every sample once,
each rank the same number, in a new shuffle each epoch (the same on every rank).
DistributedDataParallel is switched off.

How the checks judge, without trusting the learner's kernel: every number is computed in
fresh rank processes from data drawn at grading time, against a single-process reference
computed there too. For 5.1 each rank also gets a *signature* gradient, 2 to the power of
its rank, so the value it ends with says which ranks were summed and what it was divided
by. For 5.2 the model records the inputs of every training forward pass, so the check
knows which samples each rank used at each step, whatever sampler the learner chose, and
replays those steps in one process.

Hidden test cells and visible self-checks::

    from autograder import exercise
    from autograder.hidden import grade           # the hidden tests: the instructor's copy only
    grade("5.1", average_gradients, "correct")      # "unused_frozen_tied", "parameters_unchanged", "training"
    exercise("5.1").self_check(average_gradients)
    grade("5.2", train, "same_steps")               # "sharding"
    exercise("5.2").self_check(train)

"""

from __future__ import annotations

from typing import Callable

from helpers import DDP

from .gradcheck import grad_worker, judge_signature, signature_worker
from ..kit.exercise import Attempt, Exercise, Part, fresh_seed
from ..kit.pieces import HALF_FINISHED, plural

__all__ = ["EXERCISES", "exercise_5_1", "exercise_5_2"]

TIMEOUT = 10.0
# Parts where a learner's mismatched calls (a parameter skipped on some ranks only) hang:
# a correct answer finishes in well under a second, so a hang costs less.
TIMEOUT_UNUSED = 8.0
_MODEL_WORDS = {
    "mlp": "a two-layer model",
    "frozen": "a model whose first layer's bias is frozen (requires_grad=False)",
    "unused_everywhere": "a model with a second head no rank uses (its .grad stays None everywhere)",
    "unused_on_rank_0": "a model with a second head that only rank 0's data goes through",
    "tied": "a model whose two layers share one weight (tied weights)",
}


# -- judging 5.1 ---------------------------------------------------------------------------


def _judge_grads(attempt: Attempt, kind: str, dtype_name: str, world_size: int, replies: list[dict]) -> None:
    import torch

    reference = replies[0]["reference"]  # computed on rank 0, in one process, before the learner's code ran
    tol = 1e-5 if dtype_name == "float32" else 1e-10
    where = f"on {plural(world_size, 'rank')}, {_MODEL_WORDS[kind]} in {dtype_name}"
    for rank, reply in enumerate(replies):
        for name, want in reference.items():
            got = reply["grads"][name]
            if want is None and got is not None:
                attempt.fail(f"{where}, rank {rank}: {name}.grad should stay None (no rank computed a gradient "
                             "for it), but it became a tensor. Leave parameters without a gradient alone.")
            if want is None:
                continue
            if got is None:
                attempt.fail(f"{where}, rank {rank}: {name}.grad is None, but it should hold the mean over the "
                             "ranks" + (" (this rank did not use it: count its gradient as zero)."
                                        if kind == "unused_on_rank_0" else "."))
            if not torch.allclose(got, want, rtol=tol, atol=tol):
                ratio = (got.double().norm() / want.double().norm()).item() if want.norm() > 0 else float("nan")
                hint = ""
                if abs(ratio - world_size) < 1e-3 and world_size > 1:
                    hint = f" It is {world_size} times too large: did you divide by the world size?"
                if reply["changed"]:
                    hint += (f" The parameter {reply['changed'][0]} itself changed too: average the gradients "
                             "(each p.grad), not the weights.")
                if reply["asynchronous"]:
                    hint += "\n  " + HALF_FINISHED
                attempt.fail(f"{where}, rank {rank}: {name}.grad differs from one process on the whole batch.\n"
                             f"  expected {want.reshape(-1)[:4].tolist()}\n  actual   {got.reshape(-1)[:4].tolist()}"
                             + hint)
        first = replies[0]["grads"]
        for name, got in reply["grads"].items():
            if got is not None and first[name] is not None and not torch.allclose(got, first[name], rtol=1e-6, atol=1e-7):
                attempt.fail(f"{where}: rank {rank}'s {name}.grad differs from rank 0's; every rank must end "
                             "with the same averaged gradient.")


def _run_grads(attempt: Attempt, kind: str, dtype_name: str, world_size: int, *, spread: bool = False) -> list[dict]:
    seed, per_rank = fresh_seed(), 3
    timeout = TIMEOUT_UNUSED if kind.startswith("unused") else TIMEOUT
    result = attempt.run(grad_worker, world_size, (attempt.fn, kind, dtype_name, seed, per_rank, spread),
                         timeout=timeout, context=_MODEL_WORDS[kind])
    if not spread:
        _judge_grads(attempt, kind, dtype_name, world_size, list(result))
    return list(result)


def _signatures(attempt: Attempt, world_sizes: tuple[int, ...]) -> None:
    for world_size in world_sizes:
        values = attempt.run(signature_worker, world_size, (attempt.fn,), timeout=TIMEOUT,
                             context="each rank's gradient set to 2**rank")
        judge_signature(attempt, world_size, list(values))


def _visible_5_1(attempt: Attempt) -> str:
    _signatures(attempt, (2, 3))
    for kind, world_size in (("mlp", 2), ("mlp", 3), ("frozen", 2), ("unused_everywhere", 2),
                             ("unused_on_rank_0", 3), ("tied", 2)):
        _run_grads(attempt, kind, "float32", world_size)
    return ("Self-check passed: on 2 and 3 ranks every gradient equals one process on the whole batch, "
            "including a frozen parameter, an unused head, a head used on rank 0 only and tied weights. "
            "The hidden tests also try 1 to 8 ranks, float64, that the weights stay unchanged, and 5 "
            "training steps with SGD, momentum and Adam.")


exercise_5_1 = Exercise(
    number="5.1",
    function="average_gradients",
    title="average gradients over the ranks",
    parts=(
        Part("correct", 2, "the gradients equal one process on the whole batch, on 1 to 8 ranks."),
        Part("unused_frozen_tied", 1, "frozen, unused and tied parameters."),
        Part("parameters_unchanged", 1, "only the gradients change."),
        Part("training", 2, "k steps of SGD, momentum and Adam end where one process ends."),
    ),
    visible_check=_visible_5_1,
    hints=dict.fromkeys(("AttributeError", "TypeError"), "A parameter's .grad is None when it is frozen or no data "
                        "went through it: skip those (see the exercise for a parameter unused on some ranks only)."),
)


# -- Exercise 5.2 --------------------------------------------------------------------------

# (world size, batch per rank, steps per epoch, epochs)
TRAIN_CASES = ((2, 4, 3, 2), (3, 2, 2, 3), (4, 3, 2, 2))
LR = 0.2


def _train_data(seed: int, n: int):
    """Inputs with distinct rows (so each recorded row names its sample) and labels."""
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g, dtype=torch.float64)
    return TensorDataset(x, torch.randint(0, 3, (n,), generator=g))


def _train_model(seed: int):
    import torch
    import torch.nn as nn

    torch.manual_seed(seed + 1)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def _train_worker(rank: int, world_size: int, fn: Callable, seed: int, n: int, epochs: int, batch_size: int) -> dict:
    """Run the learner's train; return which samples each training forward pass saw, and the weights."""
    import torch

    dataset = _train_data(seed, n)
    model = _train_model(seed)
    row_index = {tuple(row.tolist()): i for i, row in enumerate(dataset.tensors[0])}
    batches: list[list[int]] = []

    def record(module, inputs):
        if torch.is_grad_enabled():  # evaluation under no_grad is not a training step
            batches.append([row_index.get(tuple(row.tolist()), -1) for row in inputs[0].detach()])

    model.register_forward_pre_hook(record)
    losses = fn(rank, world_size, dataset, model, epochs, batch_size, LR)
    return {
        "batches": batches,
        "weights": [p.detach().clone() for p in model.parameters()],
        "losses": losses if isinstance(losses, list) else repr(losses)[:80],
    }


def _replay_worker(rank: int, world_size: int, seed: int, n: int, steps: list[list[int]]) -> list:
    """One process: the same model, each step on the union of the ranks' batches of that step."""
    import torch
    import torch.nn.functional as F

    dataset = _train_data(seed, n)
    model = _train_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = dataset.tensors
    for indices in steps:
        opt.zero_grad()
        F.cross_entropy(model(x[indices]), y[indices]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _run_train(attempt: Attempt, world_size: int, batch_size: int, steps_per_epoch: int, epochs: int):
    seed, n = fresh_seed(), world_size * batch_size * steps_per_epoch
    context = f"{n} samples, batches of {batch_size} per rank, {plural(epochs, 'epoch')}"
    result = attempt.run(_train_worker, world_size, (attempt.fn, seed, n, epochs, batch_size), timeout=TIMEOUT,
                         context=context)
    return seed, n, context, list(result)


def _why_not_these_steps(batches: list[list[int]], batch_size: int, world_size: int, n: int, epochs: int,
                         want_steps: int) -> str:
    """What a wrong number of training forward passes says about the loop."""
    sizes = sorted({len(b) for b in batches})
    if world_size > 1 and sum(len(b) for b in batches) == n * epochs:
        return (f" It trained on all {n} samples every epoch, not on its own {n // world_size}: give each rank its own "
                "shard, with DistributedSampler(dataset, num_replicas=world_size, rank=rank) or the split of "
                "section 4.1.")
    if len(batches) > want_steps and sizes and sizes[-1] < batch_size:
        return (f" Its batches hold {' or '.join(map(str, sizes))} samples, fewer than batch_size ({batch_size}), "
                "which is already the batch of one rank: each rank takes batch_size samples of its own shard per "
                "step. Do not split a batch between the ranks, or divide batch_size by the world size.")
    if len(batches) > want_steps:
        return " (Evaluate under torch.no_grad(), so that evaluation is not counted as training.)"
    return ""


def _judge_sharding(attempt: Attempt, world_size: int, batch_size: int, steps_per_epoch: int, epochs: int,
                    n: int, context: str, replies: list[dict]) -> None:
    where = f"on {plural(world_size, 'rank')}, {context}"
    want_steps = steps_per_epoch * epochs
    for rank, reply in enumerate(replies):
        if any(-1 in batch for batch in reply["batches"]):
            attempt.fail(f"{where}: rank {rank} fed the model inputs that are not samples of the dataset; "
                         "train on the dataset's inputs as they are.")
        if len(reply["batches"]) != want_steps:
            attempt.fail(f"{where}: rank {rank} made {len(reply['batches'])} training forward passes; with "
                         f"{n // world_size} samples per rank and batches of {batch_size} that is "
                         f"{steps_per_epoch} per epoch, {want_steps} in all."
                         + _why_not_these_steps(reply["batches"], batch_size, world_size, n, epochs, want_steps))
    orders = []  # per epoch, what each rank trained on, in order
    for epoch in range(epochs):
        owner: dict[int, int] = {}
        orders.append([])
        for rank, reply in enumerate(replies):
            seen = [i for batch in reply["batches"][epoch * steps_per_epoch:(epoch + 1) * steps_per_epoch] for i in batch]
            orders[-1].append(seen)
            if len(seen) != n // world_size:
                attempt.fail(f"{where}: in epoch {epoch}, rank {rank} trained on {len(seen)} samples; each rank "
                             f"should see its own {n // world_size} (= {n} / {world_size}).")
            for i in seen:
                if i in owner:
                    who = "twice" if owner[i] == rank else f"by ranks {owner[i]} and {rank}"
                    attempt.fail(f"{where}: in epoch {epoch}, sample {i} was used {who}. In every epoch each "
                                 "sample belongs to exactly one rank: give each rank its own shard "
                                 "(DistributedSampler, or the split of section 4.1).")
                owner[i] = rank
        missing = sorted(set(range(n)) - set(owner))
        if missing:
            attempt.fail(f"{where}: in epoch {epoch} no rank used samples {missing[:5]}.")
        if epoch and orders[-1] == orders[-2]:
            attempt.fail(f"{where}: epoch {epoch} gave every rank the same samples, in the same order, as epoch "
                         f"{epoch - 1}. Shuffle anew every epoch, the same way on every rank: call "
                         "sampler.set_epoch(epoch) at the start of each epoch (DistributedSampler shuffles with "
                         "seed + epoch; without it every epoch replays the first, as section 4.2 shows).")


def _judge_same_steps(attempt: Attempt, world_size: int, batch_size: int, steps: int, seed: int, n: int,
                      context: str, replies: list[dict]) -> None:
    where = f"on {plural(world_size, 'rank')}, {context}"
    for rank, reply in enumerate(replies):
        if len(reply["batches"]) != steps or any(len(b) != batch_size for b in reply["batches"]):
            sizes = [len(b) for b in reply["batches"]]
            attempt.fail(f"{where}: rank {rank} trained on batches of sizes {sizes[:8]}; expected {steps} "
                         f"batches of {batch_size} (batch_size is per rank).")
        if not isinstance(reply["losses"], list) or len(reply["losses"]) != steps:
            attempt.fail(f"{where}: rank {rank}'s train returned {reply['losses'] if not isinstance(reply['losses'], list) else plural(len(reply['losses']), 'loss', 'losses')}; "
                         f"it should return this rank's loss at each of its {steps} steps, as a list of floats.")
    union = [sorted(i for reply in replies for i in reply["batches"][t]) for t in range(steps)]
    reference = attempt.run(_replay_worker, 1, (seed, n, union), timeout=TIMEOUT, context="the one-process replay")[0]
    for rank, reply in enumerate(replies):
        worst = max((a - b).abs().max().item() for a, b in zip(reply["weights"], reference))
        if worst > 1e-9:
            attempt.fail(f"{where}: rank {rank}'s weights after training differ from one process that took the "
                         f"same steps on the same samples (each step on the ranks' batches together) by up to "
                         f"{worst:.3g}. Average the gradients with average_gradients after every backward, then "
                         "step plain SGD with the given lr.")


def _same_steps(attempt: Attempt, cases: tuple = TRAIN_CASES) -> None:
    for world_size, batch_size, steps_per_epoch, epochs in cases:
        seed, n, context, replies = _run_train(attempt, world_size, batch_size, steps_per_epoch, epochs)
        _judge_same_steps(attempt, world_size, batch_size, steps_per_epoch * epochs, seed, n, context, replies)


def _sharding(attempt: Attempt, cases: tuple = TRAIN_CASES) -> None:
    for world_size, batch_size, steps_per_epoch, epochs in cases:
        _, n, context, replies = _run_train(attempt, world_size, batch_size, steps_per_epoch, epochs)
        _judge_sharding(attempt, world_size, batch_size, steps_per_epoch, epochs, n, context, replies)


def _visible_5_2(attempt: Attempt) -> str:
    case = (2, 3, 2, 2)
    _sharding(attempt, (case,))
    _same_steps(attempt, (case,))
    return ("Self-check passed: on 2 ranks, every epoch gave each rank its own half of the samples, in a new "
            "shuffle each epoch, and the weights match one process taking the same steps. The hidden tests also "
            "try 3 and 4 ranks.")


exercise_5_2 = Exercise(
    number="5.2",
    function="train",
    title="a distributed training loop",
    parts=(
        Part("same_steps", 2, "the ranks end with the weights one process reaches."),
        Part("sharding", 2, "each epoch a new shuffle: every sample once, in equal shards."),
    ),
    visible_check=_visible_5_2,
    forbid=(DDP,),
    forbid_reason="Exercise 5.2 builds data parallelism by hand: average the gradients with your "
                  "average_gradients. DistributedDataParallel comes in lesson 6.",
)

# Its ranks build optimizers, in the notebook's cells and in the checks: their factory imports torch._dynamo once,
# ahead (autograder.kit.registry.warm_ranks).
WARM_RANKS = ("kernel", "checks")

EXERCISES = (exercise_5_1, exercise_5_2)
