"""Exercise 7.2's course pieces and what its checks read: a training job that survives a lost process.

- the course's data (Exercises 7.1 and 7.2), model, constants and data order (:func:`make_dropout_model`, :func:`schedule`), and a
  single process taking the same global batches (:func:`reference`);
- the grading's faults: a seed (:func:`fault_seed`; ``COURSE_FAULT_SEED`` replays one) and the plan
  it draws (:func:`step_kill`, :func:`write_kill`), and the jobs that carry them (:func:`job`);
- what every process recorded (:mod:`autograder.lessons.faultpoints`), read back as a
  :class:`Timeline`: the steps each attempt took, their batches and digests, the checkpoints
  saved and loaded, the kill;
- judgements the visible self-check and the hidden parts share: :func:`judge_run`,
  :func:`judge_resume`, :func:`judge_order`.

It ships with the kit (the self-check uses it); the hidden parts' own checks are elsewhere.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..kit.torchrun import JobSpec, ScriptRun

__all__ = ["course_72", "STEPS", "GLOBAL_BATCH", "CKPT_EVERY", "CKPT_DIR", "FINAL", "LR", "MOMENTUM", "make_dropout_model",
           "make_dataset", "schedule", "reference", "fault_seed", "step_kill", "write_kill", "job", "where", "Timeline",
           "final_weights", "SAME", "CLOSE"]

SAMPLES, GLOBAL_BATCH, STEPS, CKPT_EVERY = 48, 12, 14, 3
LR, MOMENTUM = 0.1, 0.9
CKPT_DIR, FINAL = "checkpoints", "final.pt"
# What the checks accept. The state a restarted job restores (weights, optimizer state, RNG state, the batch) must
# equal the checkpointed one bit for bit (digests). Its final weights may differ from an uninterrupted job of the same
# size in the last bits: DDP's first step after a start all-reduces its gradient bucket in the parameters' order and
# rebuilds it afterwards in the order gradients arrived, so one step sums in another order (seen: 3e-8). Against one
# process (other sums' order every step), 1e-4.
SAME, CLOSE = 1e-6, 1e-4
STORE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # pytorch #135712: see the lesson's section 7


def make_dataset():
    """48 samples of 6 features in 3 classes, the same in every process."""
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(1)
    x = torch.randn(48, 6, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    return TensorDataset(x, y)


def course_72() -> dict[str, Any]:
    """What Exercise 7.2's script gets from the course instead of the notebook."""
    return {"make_dropout_model": make_dropout_model, "make_dataset": make_dataset, "STEPS": STEPS,
            "GLOBAL_BATCH": GLOBAL_BATCH, "CKPT_EVERY": CKPT_EVERY, "CKPT_DIR": CKPT_DIR, "FINAL": FINAL, "LR": LR,
            "MOMENTUM": MOMENTUM}


def make_dropout_model():
    """The model of Exercise 7.2: one dropout mask per step, drawn from torch's default generator.

    Every process seeds the generator the same way (seed 0), so every process draws the same
    mask at every step, whatever the number of processes: restoring the generator's state on
    every process is part of resuming.
    """
    import torch
    import torch.nn as nn

    class StepDropout(nn.Module):
        """Drops the same features for every sample of a step (p = 0.25), scaling the rest up."""

        def forward(self, x):
            if not self.training:
                return x
            keep = (torch.rand(x.shape[-1]) >= 0.25).to(x.dtype)
            return x * keep / 0.75

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), StepDropout(), nn.Linear(16, 3))


def schedule(step: int) -> list[int]:
    """The samples of global step ``step``: DistributedSampler's order (seed 0, epoch) cut in GLOBAL_BATCH pieces.

    >>> sorted(i for s in range(4) for i in schedule(s)) == list(range(48))   # one epoch: every sample once
    True
    """
    import torch

    epoch, position = divmod(step, SAMPLES // GLOBAL_BATCH)
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(epoch)).tolist()
    return sorted(order[position * GLOBAL_BATCH:(position + 1) * GLOBAL_BATCH])


def reference(steps: int) -> tuple[list, float]:
    """One process taking the same global batches for ``steps`` steps: its weights and final loss."""
    import torch
    import torch.nn.functional as F

    x, y = make_dataset().tensors
    model = make_dropout_model()
    sgd = torch.optim.SGD(model.parameters(), LR, MOMENTUM)
    for step in range(steps):
        ids = schedule(step)
        sgd.zero_grad()
        F.cross_entropy(model(x[ids]), y[ids]).backward()
        sgd.step()
    model.eval()
    with torch.no_grad():
        loss = F.cross_entropy(model(x), y).item()
    return [p.detach().clone() for p in model.state_dict().values()], loss


# -- the grading's faults ------------------------------------------------------------------------------

_seed: list[int] = []


def fault_seed() -> int:
    """This grading's seed: ``COURSE_FAULT_SEED`` when set (an instructor replaying a grading), else new."""
    if not _seed:
        given = os.environ.get("COURSE_FAULT_SEED", "").strip()
        _seed.append(int(given) if given.isdigit() else random.SystemRandom().randrange(1, 10**6))
    return _seed[0]


def step_kill(seed: int, world_size: int) -> dict:
    """Kill one process in the forward of a step after the first checkpoint and not just after one."""
    rng = random.Random(seed)
    steps = [s for s in range(CKPT_EVERY + 1, STEPS) if s % CKPT_EVERY]
    return {"kind": "step", "attempt": 0, "rank": rng.randrange(world_size), "step": rng.choice(steps)}


def write_kill(seed: int) -> dict:
    """Kill a process halfway through writing a checkpoint other than the first: one of those that wrote the first
    (each process draws the same one from the seed and the records), a rank other than 0 when one writes."""
    rng = random.Random(seed * 7 + 1)
    checkpoints = list(range(2 * CKPT_EVERY, STEPS + 1, CKPT_EVERY))
    return {"kind": "write", "attempt": 0, "arm": rng.choice(checkpoints) - 1, "first": CKPT_EVERY,
            "seed": rng.randrange(10**6), "sleep": 1.0}


def job(fn: Callable, nproc: int, replace: dict, *, kill: dict | None = None, steps: int = STEPS,
        resume_from: Path | None = None, label: str = "") -> JobSpec:
    """One agent of ``nproc`` processes (forked from it, up to 2 restarts), recording every step, with one planned fault."""
    plan = {"kill": kill, "ckpt_dir": CKPT_DIR, "data": "graded_data.pt"}  # paths relative to the job's folder

    def prepare(folder: Path) -> None:
        import torch

        torch.save(make_dataset().tensors[0], folder / "graded_data.pt")  # the rows each process finds its samples by
        shutil.copy(Path(__file__).with_name("faultpoints.py"), folder / "graded_faults.py")
        if resume_from is not None and (resume_from / CKPT_DIR).is_dir():
            shutil.copytree(resume_from / CKPT_DIR, folder / CKPT_DIR)

    env = {**STORE_ENV, "COURSE_FAULT_PLAN": json.dumps(plan)}
    return JobSpec(fn, 1, nproc, replace={**replace, "STEPS": steps}, fork=True, max_restarts=2, env=env,
                   prepare=prepare, label=label or f"a job of {nproc} processes", timeout=60.0)


def where(kill: dict | None, seed: int, rank: int | None = None, died: dict | None = None) -> str:
    """The fault in words, with the seed that replays it (``rank``: the process a write fault chose; ``died``: the
    kill as recorded, when a step fault was put off until a checkpoint was complete)."""
    if not kill:
        return ""
    if kill["kind"] == "step" and died is not None and died.get("n", kill["step"]) != kill["step"]:
        what = (f"rank {kill['rank']} was killed (SIGKILL) in the forward pass of its step {died['n']} (planned for "
                f"step {kill['step']}, put off until a checkpoint written in the background was complete)")
    elif kill["kind"] == "step":
        what = f"rank {kill['rank']} was killed (SIGKILL) in the forward pass of its step {kill['step']}"
    else:
        who = f"rank {rank}" if rank is not None else "a process that writes checkpoints"
        what = (f"{who} was killed (SIGKILL) halfway through writing the first checkpoint file it wrote after step "
                f"{kill['arm']}")
    return f"{what} (fault seed {seed}: COURSE_FAULT_SEED={seed} replays this grading's faults)"


# -- reading what the processes recorded ---------------------------------------------------------------


@dataclass
class Step:
    """One optimizer step one rank took: its samples, and digests of the state before and after."""

    before: str
    after: str
    opt: str
    rng: str
    ids: list[int] = field(default_factory=list)


@dataclass
class Timeline:
    """Every attempt's steps and checkpoints, per rank, from ``faults-RANK-ATTEMPT.jsonl``."""

    folder: Path
    events: dict[int, dict[int, list[dict]]]  # attempt -> rank -> events in order

    @classmethod
    def read(cls, folder: Path) -> "Timeline":
        events: dict[int, dict[int, list[dict]]] = {}
        for path in folder.glob("faults-*-*.jsonl"):
            _, rank, attempt = path.stem.split("-")
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            events.setdefault(int(attempt), {})[int(rank)] = rows
        return cls(folder, events)

    @property
    def attempts(self) -> list[int]:
        return sorted(self.events)

    def steps(self, attempt: int, rank: int = 0) -> list[Step]:
        """The steps ``rank`` took in ``attempt``, leaving out steps that changed nothing (torch's own
        optimizer-state set-up in ``get_state_dict`` takes one with a learning rate of 0)."""
        steps, batch = [], []
        for event in self.events.get(attempt, {}).get(rank, []):
            if event["ev"] == "batch":
                batch = event["ids"]
            elif event["ev"] == "step":
                steps.append(Step(event["before"], "", event["opt"], event["rng"], batch))
                batch = []
            elif event["ev"] == "stepped" and steps and not steps[-1].after:
                steps[-1].after = event["after"]
        return [s for s in steps if s.after and s.after != s.before]

    def global_ids(self, attempt: int, index: int) -> list[int]:
        """The samples every rank used at its ``index``-th step of ``attempt``, together."""
        ids: list[int] = []
        for rank in self.events.get(attempt, {}):
            steps = self.steps(attempt, rank)
            if index < len(steps):
                ids += steps[index].ids
        return sorted(ids)

    def of(self, kind: str, attempt: int | None = None) -> list[dict]:
        """Every event of ``kind`` (``save``, ``saved``, ``load``, ``rename``, ``kill``, ...), with its rank and attempt."""
        return [{**e, "rank": rank, "attempt": a} for a, ranks in sorted(self.events.items()) if attempt in (None, a)
                for rank, rows in sorted(ranks.items()) for e in rows if e["ev"] == kind]

    def in_checkpoints(self, path: str) -> bool:
        """Whether ``path`` is under the job's CKPT_DIR (the final weights, say, are not a checkpoint)."""
        return path.startswith(str(self.folder.resolve() / CKPT_DIR) + "/") or path.startswith(str(self.folder / CKPT_DIR) + "/")

    def kill(self) -> dict | None:
        kills = self.of("kill")
        return kills[0] if kills else None

    def checkpoints(self, attempt: int) -> list[int]:
        """The step counts at which a checkpoint save returned on every rank that began it, in ``attempt``."""
        began: dict[int, set] = {}
        ended: dict[int, set] = {}
        for kind, by_step in (("save", began), ("saved", ended)):
            for e in self.of(kind, attempt):
                if self.in_checkpoints(e["path"]):
                    by_step.setdefault(e["n"], set()).add(e["rank"])
        return sorted(n for n, ranks in began.items() if n > 0 and ended.get(n, set()) >= ranks)

    def resumed_after(self, attempt: int) -> int | None:
        """How many of the previous attempt's steps ``attempt`` started from (its weights' digest found
        after that step); 0 when it started from the initial weights; None when they match no step."""
        mine, before = self.steps(attempt), self.steps(attempt - 1)
        if not mine:
            return None
        first = mine[0].before
        if before and first == before[0].before:
            return 0
        for i, step in enumerate(before):
            if step.after == first:
                return i + 1
        return None


def final_weights(run: ScriptRun) -> list | None:
    import torch

    try:
        return list(torch.load(run.folder / FINAL, map_location="cpu", weights_only=True)["model"].values())
    except Exception:  # noqa: BLE001 - whatever the learner saved, or nothing
        return None
