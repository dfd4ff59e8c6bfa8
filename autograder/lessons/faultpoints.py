"""Inside every process of a graded fault-tolerance job: what it trained on, and the faults the grader planned.

:mod:`autograder.kit.torchrun` copies this file into the job's folder as ``graded_faults.py``;
the course's wrapper (``torchrun_programs.WRAPPER``) imports it before the learner's script
runs when ``COURSE_FAULT_PLAN`` is set. It uses torch and the standard library only, and
appends one JSON line per event to ``faults-RANK-ATTEMPT.jsonl`` in the job's folder:

- ``batch``: the dataset rows of each training forward (``ids``, found by their values in
  ``graded_data.pt``) and a digest of torch's default RNG state at that moment;
- ``step`` and ``stepped``: around every optimizer step, digests of the parameters before and
  after, of the optimizer's state and of the RNG state (bitwise: equal digests, equal bytes);
- ``save``, ``saved``, ``load``: every ``torch.save``, ``torch.load`` and DCP ``save``,
  ``async_save`` and ``load``, with its path and the number of steps taken (``saved`` of an
  ``async_save`` once its background write has finished, not when the call returns);
- ``rename``: every ``os.rename`` and ``os.replace`` (how a checkpoint is often marked complete);
- ``kill``: the planned fault, just before this process sends itself ``SIGKILL``.

The plan (JSON) names at most one fault: ``{"kind": "step", "attempt": 0, "rank": 2, "step": 7}``
kills rank 2 in the forward of its step 7 (counted from 0 in this attempt), or of the first step after that
once a checkpoint is complete, when one was begun and none is yet (a save written in the background); ``{"kind": "write",
"attempt": 0, "rank": 1, "arm": 4, "sleep": 1.0}`` kills rank 1 halfway through the first write
of a checkpoint file under the plan's ``ckpt_dir`` once it has taken 4 steps: half the bytes
reach the file; it waits until every other process that writes checkpoints has recorded its
own part of this one saved (at most ``hold`` seconds, 3 by default: with DCP the others' save
waits for this one), then ``sleep`` seconds more, so that a process that does not wait for it
marks the checkpoint complete meanwhile however busy the machine is; and it dies. A kill from inside the process, at a counted
step, is what makes a grading's fault reproducible from its seed.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import os
import signal
import threading
import time

import torch

LOG = os.environ["COURSE_GRADING_LOG"]
RANK = int(os.environ.get("RANK", "0"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
PLAN = json.loads(os.environ["COURSE_FAULT_PLAN"])
KILL = PLAN.get("kill") or {}
CKPT_DIR = os.path.abspath(PLAN.get("ckpt_dir", "checkpoints"))
_out = open(os.path.join(LOG, f"faults-{RANK}-{ATTEMPT}.jsonl"), "a", buffering=1)
_steps = [0]  # optimizer steps taken by this process in this attempt
_writing = threading.Lock()
_depth = [0]  # nesting of module calls: only the outermost forward is a batch
_data = torch.load(os.path.join(LOG, PLAN.get("data", "graded_data.pt")), weights_only=True)
_ids = {bytes(row.numpy().tobytes()): i for i, row in enumerate(_data)}
_real_open, _real_save, _real_rename, _real_replace = io.open, torch.save, os.rename, os.replace


def record(**event) -> None:
    event["t"] = time.time()
    with _writing:  # DCP's async_save finishes in a thread of its own (see _recorded)
        _out.write(json.dumps(event) + "\n")
        _out.flush()


def digest(tensors) -> str:
    """Eight bytes of blake2b over the tensors' bytes, in order: equal digests mean equal tensors."""
    h = hashlib.blake2b(digest_size=8)
    for t in tensors:
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _die(where: str, **more) -> None:
    record(**{"ev": "kill", "where": where, "n": _steps[0], **more})
    with _writing:  # no other thread of this process is halfway through a record's line when it dies
        os.kill(os.getpid(), signal.SIGKILL)


def _mine(kind: str) -> bool:
    if KILL.get("kind") != kind or KILL.get("attempt", 0) != ATTEMPT:
        return False
    if "rank" not in KILL:  # a write fault's victim: drawn from the processes that wrote the first checkpoint
        KILL["rank"] = _writer_to_kill()
    return KILL.get("rank") == RANK


def _records():
    """``(rank, event)`` for every event every process of this attempt has recorded so far."""
    import glob

    for path in glob.glob(os.path.join(LOG, f"faults-*-{ATTEMPT}.jsonl")):
        rank = int(path.rsplit("-", 2)[1])
        with _real_open(path) as f:
            for line in f:
                try:
                    yield rank, json.loads(line)
                except ValueError:  # a line being written
                    continue


def _writers() -> set[int]:
    """The ranks that saved the first checkpoint (every process's records are complete by then)."""
    return {rank for rank, e in _records()
            if e["ev"] == "save" and 0 < e["n"] <= KILL.get("first", 1) and _under_ckpt(e["path"])}


def _writer_to_kill() -> int:
    """The process to kill while it writes: a seeded choice among the ranks that saved the first checkpoint, other
    than 0 when another rank writes too; so every process names the same one, and a rank 0 that marks a
    checkpoint before the others finish shows."""
    import random

    writers = _writers()
    others = sorted(writers - {0}) or sorted(writers) or [0]
    return random.Random(KILL.get("seed", 0)).choice(others)


def _hold_while_others_write(step: int) -> None:
    """Wait until every other writer has recorded its part of this checkpoint saved, at most ``hold`` seconds."""
    others = _writers() - {RANK}
    deadline = time.monotonic() + float(KILL.get("hold", 3.0))
    while others and time.monotonic() < deadline:
        saved = {rank for rank, e in _records() if e["ev"] == "saved" and e["n"] == step and _under_ckpt(e["path"])}
        if others <= saved:
            return
        time.sleep(0.05)


# -- what each step trained on -------------------------------------------------------------------


def _pre(module, args):
    _depth[0] += 1
    if _depth[0] != 1 or not torch.is_grad_enabled() or not module.training:
        return
    x = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if x is None or x.dim() != 2 or x.shape[-1] != _data.shape[-1] or not x.is_floating_point():
        return
    rows = x.detach().to(_data.dtype).cpu()
    record(ev="batch", n=_steps[0], ids=[_ids.get(bytes(r.numpy().tobytes()), -1) for r in rows],
           rng=digest([torch.get_rng_state()]))
    if _mine("step") and _steps[0] >= KILL.get("step", float("inf")) and not _checkpoint_pending():
        _die("forward", planned=KILL["step"])


def _checkpoint_pending() -> bool:
    """Whether a checkpoint has begun but none is complete yet (on every rank that began it): a save that runs in
    the background (DCP's async_save) can still be writing the first checkpoint at the planned step, and a kill
    then would judge a resume from nothing. The kill is put off to the first forward after one is complete; with
    nothing begun at all, it happens as planned (and the judgement names the missing checkpoint)."""
    began: dict[int, set] = {}
    ended: dict[int, set] = {}
    for rank, e in _records():
        if e["ev"] in ("save", "saved") and e.get("n", 0) > 0 and _under_ckpt(e.get("path", "")):
            (began if e["ev"] == "save" else ended).setdefault(e["n"], set()).add(rank)
    return bool(began) and not any(ended.get(n, set()) >= ranks for n, ranks in began.items())


def _post(module, args, output):
    _depth[0] = max(_depth[0] - 1, 0)


def _params(opt):
    return [p for group in opt.param_groups for p in group["params"]]


def _step_pre(opt, args, kwargs):
    params = _params(opt)
    state = [v for p in params for _, v in sorted(opt.state.get(p, {}).items()) if isinstance(v, torch.Tensor)]
    record(ev="step", n=_steps[0], before=digest(params), opt=digest(state), rng=digest([torch.get_rng_state()]))


def _step_post(opt, args, kwargs):
    _steps[0] += 1
    record(ev="stepped", n=_steps[0], after=digest(_params(opt)))


# -- checkpoints: what was saved and loaded, and the write that dies halfway ----------------------------


def _under_ckpt(path) -> bool:
    try:
        return os.path.abspath(os.fspath(path)).startswith(CKPT_DIR + os.sep)
    except TypeError:
        return False


_begun: list[tuple[str, int]] = []  # (path, steps taken) of every save this process began, in order


def _checkpoint_step(path) -> int:
    """The step count of the save that writes ``path`` (the save of that file or of a folder holding it): a save
    written in the background (DCP's async_save) writes its files while the next steps run."""
    path = os.path.abspath(os.fspath(path))
    for began, n in reversed(_begun):
        if path == began or path.startswith(began.rstrip(os.sep) + os.sep):
            return n
    return _steps[0]


def _write_armed(n: int) -> bool:
    # The step count first: the victim is drawn (_mine, once) from the first checkpoint's writers, whose records
    # are all written only once every process has passed a later step's all-reduce; drawn during the first
    # checkpoint itself, processes saw different writers, could each name another and none died.
    return n >= KILL.get("arm", 0) and _mine("write")


class _DyingFile:
    """A checkpoint file whose first write stops halfway: the process dies as a crashed machine would."""

    def __init__(self, f, path, n: int):
        self._f, self._path, self._n = f, os.path.abspath(os.fspath(path)), n

    def write(self, data):
        view = memoryview(data).cast("B")
        self._f.write(view[: len(view) // 2])
        self._f.flush()
        os.fsync(self._f.fileno())
        record(ev="writing", path=self._path, n=self._n)
        _hold_while_others_write(self._n)
        time.sleep(float(KILL.get("sleep", 1.0)))
        _die("write", path=self._path, n=self._n)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def __iter__(self):
        return iter(self._f)


def _open(file, mode="r", *args, **kwargs):
    f = _real_open(file, mode, *args, **kwargs)
    if isinstance(mode, str) and any(c in mode for c in "wax") and _under_ckpt(file):
        n = _checkpoint_step(file)
        if _write_armed(n):
            return _DyingFile(f, file, n)
    return f


def _path_of(obj) -> str:
    if isinstance(obj, (str, os.PathLike)):
        return os.path.abspath(os.fspath(obj))
    for name in ("path", "name", "checkpoint_id"):
        value = getattr(obj, name, None)
        if isinstance(value, (str, os.PathLike)):
            return os.path.abspath(os.fspath(value))
    return repr(obj)[:200]


def _save(obj, f, *args, **kwargs):
    path = _path_of(f)
    record(ev="save", api="torch.save", path=path, n=_steps[0])
    if isinstance(f, (str, os.PathLike)):
        _begun.append((path, _steps[0]))
    if isinstance(f, (str, os.PathLike)) and _under_ckpt(f) and _write_armed(_steps[0]):
        buffer = io.BytesIO()
        _real_save(obj, buffer, *args, **kwargs)
        with _real_open(f, "wb") as out:
            _DyingFile(out, f, _steps[0]).write(buffer.getvalue())
    result = _real_save(obj, f, *args, **kwargs)
    record(ev="saved", api="torch.save", path=path, n=_steps[0])
    return result


def _recorded(module, name: str, api: str, event: str):
    call = getattr(module, name, None)
    if call is None:
        return

    def recorded(*args, **kwargs):
        target = kwargs.get("checkpoint_id") or kwargs.get("storage_writer") or kwargs.get("storage_reader")
        if target is None and api == "torch.load" and args:
            target = args[0]
        path, n = (_path_of(target) if target is not None else ""), _steps[0]
        record(ev=event, api=api, path=path, n=n)
        if event == "save" and path:
            _begun.append((path, n))
        result = call(*args, **kwargs)
        # async_save returns while its thread still writes: the checkpoint is saved once that write ends (its future,
        # or the upload's of the AsyncSaveResponse newer torch returns with a stager), and only if it succeeded.
        finished = getattr(result, "upload_completion", result) if api == "dcp.async_save" else None
        if event == "save" and hasattr(finished, "add_done_callback"):
            finished.add_done_callback(
                lambda done: done.exception() is None and record(ev="saved", api=api, path=path, n=n))
        elif event == "save":
            record(ev="saved", api=api, path=path, n=n)
        return result

    setattr(module, name, recorded)


def _renamed(call, api):
    def renamed(src, dst, *args, **kwargs):
        result = call(src, dst, *args, **kwargs)
        record(ev="rename", api=api, src=_path_of(src), dst=_path_of(dst), n=_steps[0])
        return result
    return renamed


def install() -> None:
    """Put the hooks in place; the learner's script runs after this."""
    import torch.distributed.checkpoint as dcp
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_module_forward_pre_hook(_pre)
    register_module_forward_hook(_post)
    register_optimizer_step_pre_hook(_step_pre)
    register_optimizer_step_post_hook(_step_post)
    builtins.open = io.open = _open
    torch.save = _save
    _recorded(torch, "load", "torch.load", "load")
    for name in ("save", "async_save", "load"):
        _recorded(dcp, name, f"dcp.{name}", "load" if name == "load" else "save")
    os.rename, os.replace = _renamed(_real_rename, "os.rename"), _renamed(_real_replace, "os.replace")
    record(ev="start", pid=os.getpid())


install()
