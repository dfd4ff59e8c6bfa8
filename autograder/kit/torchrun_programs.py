"""The two small programs :mod:`autograder.kit.torchrun` writes next to the learner's script.

- :data:`WRAPPER` (``graded_run.py``) runs in every process torchrun starts and runs the
  learner's ``train.py`` in it, recording what the checks read (saves and when they were
  written, when each barrier returned, the state at exit, how the script ended, a stack
  dump before the time limit) as JSON in the job's folder.
- :data:`AGENT` (``graded_agent.py``) is torchrun itself (``torch.distributed.run.main``),
  which also keeps what it knows of each failed process.

They are text, not modules of this package: each job writes them into its own folder and
runs them with the grading machine's Python.

>>> compile(WRAPPER, "graded_run.py", "exec") and compile(AGENT, "graded_agent.py", "exec") and True
True
"""

import ast
import inspect

__all__ = ["WRAPPER", "AGENT", "clip"]


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters (and " ..."), between words, never inside one.

    The feedback takes the grading machine's paths out of what it shows; a path cut in half is no
    longer the path it would look for, so a long message is cut where a word ends.

    >>> clip('raised in File "/opt/course/.venv/lib/x.py", line 3', 30)
    'raised in File ...'
    >>> clip("short", 30)
    'short'
    """
    if len(text) <= limit:
        return text
    head = text[:limit + 1]
    cut = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
    return (head[:cut].rstrip() if cut > 0 else text[:limit]) + " ..."


def _program_text(fn) -> str:
    """``fn``'s definition without its docstring, to be written into a program's text (one piece serves both)."""
    tree = ast.parse(inspect.getsource(fn))
    tree.body[0].body = tree.body[0].body[1:]
    return ast.unparse(tree)


# Runs in every process torchrun starts, before the learner's script. Why it holds the process
# groups and imports torch.distributed.nn first: every gloo collective's work object keeps a
# Python object that a gloo worker thread lets go of, taking the GIL, just after the collective
# returned. DDP's constructor imports torch.distributed.nn, whose default arguments
# (group=group.WORLD, evaluated at import) then keep the default group until the interpreter's
# finalization, where the worker's release ended the process with SIGABRT ("terminate called
# without an active exception"); with those defaults gone, DDP's Reducer held the group's last
# reference and freed it with the GIL held, while ~ProcessGroupGloo joined a worker waiting for
# the GIL: a deadlock (both seen with torch 2.13, about once in 10 to 300 jobs). So
# torch.distributed.nn is imported before any group exists, the wrapper keeps a reference to every
# group the script made (through dist.init_process_group or not: init_device_mesh, new_group), and
# once the script returned it destroys the groups (if the script did not) and
# drops those references while Python is whole: the threads end and the process exits cleanly.
# The script runs under torch's own ``@record``, so its exception also reaches the agent's report.
WRAPPER = """\
import argparse, atexit, faulthandler, json, os, runpy, signal, sys, time, traceback
""" + _program_text(clip) + """
# Forked from its agent (--start-method=fork), this process inherited the agent's Python handlers for SIGTERM and
# the like. Python runs a handler only between bytecodes, so a rank blocked in C++ (waiting in init_process_group for
# a peer that died) ignored the agent's SIGTERM until its SIGKILL 30 s later. A fresh process, as plain torchrun
# starts, has the default: the signal ends it at once. The script's own handlers, set later, still apply.
for _sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    if getattr(signal.getsignal(_sig), "__module__", "").startswith("torch.distributed.elastic"):
        signal.signal(_sig, signal.SIG_DFL)
LOG = os.environ["COURSE_GRADING_LOG"]
RANK = os.environ.get("RANK", "?")
ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
_stacks = open(os.path.join(LOG, f"stack-{RANK}-{ATTEMPT}.txt"), "w")
faulthandler.dump_traceback_later(float(os.environ["COURSE_STACKS_AFTER"]), file=_stacks)
import torch, torch.distributed as dist
try:  # before any process group exists: see the note on the last reference
    import torch.distributed.nn
except ImportError:
    pass
try:
    from torch.distributed.elastic.multiprocessing.errors import record
except ImportError:  # no elastic package: the traceback still reaches stderr
    def record(fn):
        return fn
_save = torch.save
def _recorded_save(obj, f, *args, **kwargs):
    with open(os.path.join(LOG, "saves.jsonl"), "a") as out:
        out.write(json.dumps({"rank": RANK, "path": os.path.abspath(str(f)) if isinstance(f, (str, os.PathLike)) else repr(f)}) + "\\n")
    result = _save(obj, f, *args, **kwargs)
    with open(os.path.join(LOG, "saved.jsonl"), "a") as out:  # when it was written: the barrier must come after
        out.write(json.dumps({"rank": RANK, "ended": time.time()}) + "\\n")
    return result
torch.save = _recorded_save
def _recorded(name):
    call = getattr(dist, name)
    def recorded(*args, **kwargs):
        result = call(*args, **kwargs)
        _note_group()
        with open(os.path.join(LOG, "barriers.jsonl"), "a") as out:
            out.write(json.dumps({"rank": RANK, "returned": time.time()}) + "\\n")
        return result
    return recorded
dist.barrier, dist.monitored_barrier = _recorded("barrier"), _recorded("monitored_barrier")
_options = []  # every command-line option the script declares
_add_argument = argparse.ArgumentParser.add_argument
def _recorded_add_argument(self, *names, **kwargs):
    _options.extend(n for n in names if isinstance(n, str) and n.startswith("-"))
    return _add_argument(self, *names, **kwargs)
argparse.ArgumentParser.add_argument = _recorded_add_argument
def _native_threads():
    try:
        return [open(f"/proc/self/task/{t}/comm").read().strip() for t in sorted(os.listdir("/proc/self/task"))]
    except OSError:  # not Linux
        return []
_groups = []  # the process groups the script made, held here: see the note on the last reference
# [rank, world size] of the default group the script made, for the exit record: noted when dist.init_process_group
# returns, at every barrier, when dist.destroy_process_group is called, and at exit (a group made another way,
# init_device_mesh for one, calls torch's own init_process_group, not this module's).
_joined = []
def _note_group():
    if not (dist.is_available() and dist.is_initialized()):
        return
    if not _joined:
        _joined[:] = [dist.get_rank(), dist.get_world_size()]
    # Hold every group that exists now, however it was made (init_device_mesh makes the default group through
    # torch's own init_process_group, and its sub-groups with new_group): without these references, a DeviceMesh
    # or DDP's Reducer freed when main() returns held a group's last one, and the deadlock above followed (4 of 10
    # graded jobs of a 7.1 answer using init_device_mesh, torch 2.13).
    try:
        found = [dist.distributed_c10d._get_default_group()]
        found += list(getattr(getattr(dist.distributed_c10d, "_world", None), "pg_map", None) or ())
    except Exception:  # torch's private names moved: hold what init_process_group gave, as before
        return
    for group in found:
        if not any(group is held for held in _groups):
            _groups.append(group)
_init_process_group = dist.init_process_group
def _kept_init_process_group(*args, **kwargs):
    result = _init_process_group(*args, **kwargs)
    _note_group()
    return result
dist.init_process_group = _kept_init_process_group
_destroy_process_group = dist.destroy_process_group
def _noted_destroy_process_group(*args, **kwargs):
    _note_group()
    return _destroy_process_group(*args, **kwargs)
dist.destroy_process_group = _noted_destroy_process_group
if os.environ.get("COURSE_FAULT_PLAN"):  # a fault-tolerance job: record every step, and the planned fault
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import graded_faults
def _children():
    me, found = str(os.getpid()), []
    try:
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if fields[1] == me and fields[0] not in ("Z", "X"):
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        found.append(clip(f.read().replace(b"\\0", b" ").decode(errors="replace").strip(), 200))
    except OSError:  # not Linux, or a process that ended while being read
        pass
    return found
def _python_threads():
    # The threads Python waits for before this process can end (not daemons), each with its innermost frames: one
    # still running when main() has returned keeps the process alive (an async_save whose future nobody waited for).
    import threading
    frames = sys._current_frames()
    found = []
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon or not thread.is_alive():
            continue
        stack = traceback.extract_stack(frames.get(thread.ident)) if thread.ident in frames else []
        found.append({"name": thread.name, "frames": [[f.filename, f.lineno, f.name] for f in stack[-12:]]})
    return found
_finished = []
def _finish(release):
    if _finished:
        return
    _finished.append(True)
    faulthandler.cancel_dump_traceback_later()
    _note_group()
    alive = dist.is_available() and dist.is_initialized()
    if release:  # the script returned: end its groups now, while Python is whole
        if alive:
            dist.destroy_process_group()
        del _groups[:]  # the last references; a ProcessGroup's dealloc lets go of the GIL while gloo's threads end
    with open(os.path.join(LOG, f"exit-{RANK}-{ATTEMPT}.json"), "w") as out:
        json.dump({"rank": RANK, "attempt": int(ATTEMPT), "group_alive": alive, "joined": _joined or None,
                   "threads": _native_threads(), "python_threads": _python_threads(),
                   "children": _children()}, out)
atexit.register(_finish, False)
def _script():
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except BaseException as exc:  # an exit (sys.exit, argparse) keeps its output, not a traceback
        error = {"options": _options}
        if not isinstance(exc, (SystemExit, KeyboardInterrupt)):
            frames = [[f.filename, f.lineno, f.name, f.line or ""] for f in traceback.extract_tb(exc.__traceback__)]
            error.update(type=type(exc).__name__, message=clip(str(exc), 2000), frames=frames[-40:])
        if not (isinstance(exc, SystemExit) and exc.code in (None, 0)):
            with open(os.path.join(LOG, f"error-{RANK}-{ATTEMPT}.json"), "w") as out:
                json.dump(error, out)
        raise
sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")] + sys.argv[1:]
try:  # under --start-method=fork a worker ends with os._exit, so atexit never runs: finish here
    record(_script)()
except BaseException:
    _finish(False)
    raise
_finish(True)
"""

# The agent: torch.distributed.run.main, the very function the ``torchrun`` command runs, with one
# addition: when processes fail, what the agent knows of each (ChildFailedError.failures) is kept
# in a JSON file. Its output and exit code are torchrun's own.
AGENT = """\
import json, os, sys
from torch.distributed.run import main
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
sys.argv[0] = "torchrun"
if "--run-path" in sys.argv:  # the processes are forked from this one: import once what every graded script uses
    # (DDP's constructor imports torch._dynamo: over a second of CPU in each process otherwise)
    import torch._dynamo, torch.distributed.checkpoint, torch.distributed.nn, torch.nn.parallel, torch.optim  # noqa
    # torchrun reports one failed process of a forked group (the first it finds); keep every process's exit code
    # when a failure is seen, so that the root cause is not lost behind a peer that only lost its connection.
    import time
    from torch.distributed.elastic.multiprocessing import api as _api
    _poll = _api.MultiprocessContext._poll  # torch's own, private: read defensively below
    def _kept_poll(self):
        result = _poll(self)
        if result is not None and result.is_failed() and getattr(self, "_pc", None) is not None:
            codes = [{"local_rank": i, "exitcode": p.exitcode, "time": time.time()}
                     for i, p in enumerate(self._pc.processes) if p.exitcode not in (None, 0)]
            with open(os.environ["COURSE_AGENT_FAILURES"] + ".procs", "a") as out:
                out.write(json.dumps(codes) + "\\n")
        return result
    _api.MultiprocessContext._poll = _kept_poll
try:
    main()
except ChildFailedError as failed:
    kept = []
    for rank, failure in failed.failures.items():
        kept.append({"rank": rank, "local_rank": getattr(failure, "local_rank", None),
                     "exitcode": getattr(failure, "exitcode", None), "timestamp": getattr(failure, "timestamp", None)})
    with open(os.environ["COURSE_AGENT_FAILURES"], "w") as out:
        json.dump(kept, out, default=str)
    raise
"""
