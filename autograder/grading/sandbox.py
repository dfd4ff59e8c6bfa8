"""A bubblewrap sandbox for learners' code while it is graded.

During ``make grade`` every learner notebook runs in a kernel started through
`bubblewrap <https://github.com/containers/bubblewrap>`_ (``bwrap``), and so does the
clean re-grading process (:mod:`autograder.grading.clean`). Inside, the learner's code sees:

- the system and the Python installation, read-only;
- the ``helpers`` and ``autograder`` packages, read-only; the ``autograder`` package as a
  copy of its modules made once when grading starts (:func:`staged_package`), without
  the instructor's reference answers (``autograder/answers/``) and without anything
  in the ``autograder/`` folder that is not a Python module (the gradebook and its
  journal, the work folders, grades, feedback), whatever comes and goes there while the
  class is graded;
- nothing of the course's root folder (``solutions/``, other learners' submissions) and
  nothing of the instructor's home folder;
- a private, empty ``/tmp``, and one writable folder: its own working copy;
- its own network namespace, with only a loopback interface (the ranks' gloo traffic
  works; nothing outside the sandbox can be reached);
- its own process-id namespace: when the sandbox ends, every process in it ends;
- a cap on the memory each of its processes may fill (``RLIMIT_DATA``: the heap and private
  writable mappings, so tensors count; 4 GiB by default, ``COURSE_SANDBOX_MEMORY`` sets
  another), so one submission that allocates without end fails in its own cell
  (``MemoryError``, or torch's "can't allocate memory") instead of starving the other
  submissions graded beside it. The cap is inherited by every rank, and sandboxed code
  cannot raise it. On a machine with NVIDIA GPUs there is no cap unless
  ``COURSE_SANDBOX_MEMORY`` asks for one: CUDA maps memory in ways that have not been
  checked against it.

Ranks started by the helpers are the kernel's children, so they run in the same sandbox.

``bwrap`` works without root where the kernel allows unprivileged user namespaces (most
Linux distributions; Ubuntu 24.04 restricts them through AppArmor). :func:`problem` says
whether it can run here, and :func:`require` raises :class:`SandboxUnavailable` with the
next step when it cannot.

Example::

    >>> import subprocess, tempfile
    >>> box = Sandbox(writable=[tempfile.mkdtemp()])
    >>> if problem() is None:
    ...     out = subprocess.run(box.wrap(["cat", "/proc/net/dev"]), capture_output=True, text=True).stdout
    ...     assert "lo:" in out and "eth0" not in out
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import helpers

__all__ = ["Sandbox", "SandboxUnavailable", "problem", "require", "install_hint", "kernel_spec", "memory_cap",
           "staged_package", "PACKAGE_DIRS"]

#: The two packages the sandbox shows read-only (learners' code and the checks import them).
PACKAGE_DIRS = (Path(helpers.__file__).resolve().parent, Path(__file__).resolve().parents[1])
#: Files of the autograder package hidden even though they are Python: the instructor's answers.
HIDDEN_PACKAGES = ("answers",)  # the instructor's answers: never inside the sandbox
#: Environment variables passed into the sandbox (everything else is dropped: tokens, keys).
PASSED_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED",
              "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "COURSE_ROOT",
              "COURSE_FAULT_SEED")  # an instructor replaying Exercise 7.2's faults
PASSED_PREFIXES = ("LC_", "HELPERS_", "TORCH_", "GLOO_", "NCCL_", "JPY_", "NBGRADER_")
#: The bubblewrap program: ``COURSE_BWRAP`` names another (a path, or a name looked up on PATH).
BWRAP = os.environ.get("COURSE_BWRAP", "bwrap")


#: The most each in-memory folder of a sandbox (/tmp, /var/tmp, /dev/shm) may hold.
TMP_BYTES = 2 << 30
#: The most data memory each sandboxed process may hold, unless COURSE_SANDBOX_MEMORY says otherwise.
MEMORY_BYTES = 4 << 30
#: Run inside the sandbox before the command: lower RLIMIT_DATA (soft and hard) to argv[1] bytes, then exec argv[2:].
_CAP_THEN_EXEC = ("import os, resource, sys\n"
                  "n = int(sys.argv[1]); hard = resource.getrlimit(resource.RLIMIT_DATA)[1]\n"
                  "n = n if hard == resource.RLIM_INFINITY else min(n, hard)\n"
                  "resource.setrlimit(resource.RLIMIT_DATA, (n, n))\n"
                  "os.execvp(sys.argv[2], sys.argv[2:])")


def parse_bytes(text: str) -> int:
    """``"4G"`` -> 4294967296, ``"512M"`` -> 536870912, ``"1000"`` -> 1000; ``"0"`` means no cap.

    >>> [parse_bytes(t) for t in ("4G", "512m", "1.5G", "1000", "0")]
    [4294967296, 536870912, 1610612736, 1000, 0]
    """
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(value[-1:], 1)
    try:
        number = float(value[:-1] if scale > 1 else value)
    except ValueError:
        number = -1.0
    if number < 0 or number != number:
        raise ValueError(f"COURSE_SANDBOX_MEMORY={text!r} is not an amount of memory; write it like 4G, 512M or "
                         "4294967296 (bytes), or 0 for no cap")
    return int(number * scale)


def memory_cap() -> int | None:
    """The data-memory cap per sandboxed process, in bytes, or None for none.

    ``COURSE_SANDBOX_MEMORY`` decides when set (``0``: no cap). Otherwise 4 GiB, except on a
    machine with NVIDIA GPUs, where CUDA's own mappings have not been checked against it.
    """
    text = os.environ.get("COURSE_SANDBOX_MEMORY", "").strip()
    if text:
        return parse_bytes(text) or None
    if any(Path("/dev").glob("nvidia[0-9]*")):
        return None
    return MEMORY_BYTES


@functools.lru_cache(maxsize=1)
def _takes_size() -> bool:
    """Whether this bwrap can cap a tmpfs (``--size``, bubblewrap 0.8 and later)."""
    try:
        return "--size" in subprocess.run([shutil.which(BWRAP) or BWRAP, "--help"], capture_output=True,
                                          text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot start a sandbox here; the message says what to do."""


def install_hint() -> str:
    """How to get a working ``bwrap``, for messages."""
    return ("Install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora: `sudo dnf install "
            "bubblewrap`). Without root it needs unprivileged user namespaces: `sysctl "
            "kernel.unprivileged_userns_clone` must be 1, and on Ubuntu 24.04 and later "
            "`kernel.apparmor_restrict_unprivileged_userns` must be 0 (or give bwrap an AppArmor profile).")


@functools.lru_cache(maxsize=1)
def problem() -> str | None:
    """None when a sandbox starts here; else why not (one sentence, with what bwrap said)."""
    bwrap = shutil.which(BWRAP)
    if bwrap is None:
        return f"bubblewrap (`{BWRAP}`) is not installed"
    try:
        done = subprocess.run([bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all",
                               "--die-with-parent", "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`bwrap` could not be run ({exc})"
    if done.returncode != 0:
        return f"`bwrap` cannot start a sandbox here (exit {done.returncode}: {done.stderr.strip() or 'no message'})"
    return None


def require() -> None:
    """Return when sandboxes work here; else raise :class:`SandboxUnavailable` with the next step."""
    reason = problem()
    if reason is not None:
        raise SandboxUnavailable(f"Cannot sandbox learners' code: {reason}.\n{install_hint()}\n"
                                 "To grade without a sandbox anyway (learners' code then runs with your rights), "
                                 "pass --no-sandbox (make grade NO_SANDBOX=1).")


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _existing(paths: Iterable[str | os.PathLike]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p and Path(p).exists():
            resolved = Path(p).resolve()
            if resolved not in out:
                out.append(resolved)
    return out


_STAGE_LOCK = threading.Lock()
_STAGED: dict[Path, Path] = {}


def staged_package(package: Path | None = None) -> Path:
    """A private, fixed copy of the autograder package's modules, made once per process.

    The sandbox shows this copy in the package's place, read-only: every module but the
    instructor's answers (:data:`HIDDEN_PACKAGES`), with their compiled ``__pycache__``
    files, and nothing else. The package folder itself is also nbgrader's work folder when
    an instructor grades from the repository (``autograder/gradebook.db``, its sqlite
    journal, ``submitted/``, ``feedback/``): other processes create and delete files there
    while learners are graded. The sandbox's view must not depend on what that folder
    holds at the moment a sandbox starts (a journal listed while the command line was
    made and gone when bubblewrap bound it stopped the sandbox, and the learner went
    ungraded), so it never looks there again after this copy.

    >>> staged = staged_package()
    >>> (staged / "kit" / "exercise.py").is_file(), (staged / "answers").exists()
    (True, False)
    """
    package = (package or PACKAGE_DIRS[1]).resolve()
    with _STAGE_LOCK:
        staged = _STAGED.get(package)
        if staged is not None and staged.is_dir():
            return staged
        staged = Path(tempfile.mkdtemp(prefix="course-sandbox-autograder-"))
        atexit.register(shutil.rmtree, staged, True)
        _stage_modules(package, staged)
        _STAGED[package] = staged
        return staged


def _stage_modules(package: Path, staged: Path, top: bool = True) -> None:
    """Copy ``package``'s modules into ``staged``, and those of every subpackage (a folder with an
    ``__init__.py``), each with its compiled files; the instructor's answers (:data:`HIDDEN_PACKAGES`)
    and every other file (work folders, the gradebook) stay out."""
    for entry in package.glob("*.py"):
        shutil.copy2(entry, staged / entry.name)  # the same times: the compiled files stay valid
    cache = package / "__pycache__"
    if cache.is_dir():
        (staged / "__pycache__").mkdir()
        for entry in cache.glob("*.pyc"):
            shutil.copy2(entry, staged / "__pycache__" / entry.name)
    for sub in sorted(package.iterdir()):
        if sub.is_dir() and (sub / "__init__.py").is_file() and sub.name != "__pycache__" and \
                not (top and sub.name in HIDDEN_PACKAGES):
            (staged / sub.name).mkdir()
            _stage_modules(sub, staged / sub.name, top=False)


@dataclass
class Sandbox:
    """One sandbox: what it may write, and which folders it must not see at all.

    ``writable`` folders are bound read-write (the first is the working folder unless
    ``workdir`` says otherwise); ``hidden`` folders (the course root, the repository) are
    replaced by empty ones, with the Python installation and the two packages bound back
    read-only where they lie inside them. The instructor's home folder is always hidden.
    """

    writable: Sequence[str | os.PathLike]
    hidden: Sequence[str | os.PathLike] = ()
    workdir: str | os.PathLike | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: Data memory per process in bytes; None: :func:`memory_cap` decides (0: no cap).
    memory: int | None = None

    def _shown(self) -> list[Path]:
        """Read-only folders bound back over hidden ones: Python, its paths, the two packages."""
        python = _existing([sys.base_prefix, sys.prefix, sys.exec_prefix])
        hidden = self._hidden()
        shown = list(python)
        for p in _existing(sys.path):
            # A path that is a hidden folder or holds one (a repository root on PYTHONPATH) would
            # show everything in it: only its packages are shown, below. A path inside a hidden
            # folder (the repository's tests/) stays hidden unless it is part of Python.
            if any(_within(h, p) for h in hidden) or p in shown:
                continue
            if any(_within(p, h) for h in hidden) and not any(_within(p, q) for q in python):
                continue
            shown.append(p)
        return shown + [d for d in PACKAGE_DIRS if d not in shown]

    def _hidden(self) -> list[Path]:
        home = Path(os.path.expanduser("~"))
        repo = PACKAGE_DIRS[1].parent
        found = _existing([home if home != Path("/") else "", repo, *self.hidden])
        return [h for h in found if h != Path("/")]

    def _package_binds(self) -> list[str]:
        """The autograder package as the sandbox sees it: a fixed copy of its modules (see :func:`staged_package`)."""
        return ["--ro-bind", str(staged_package()), str(PACKAGE_DIRS[1])]

    def _environment(self) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k in PASSED_ENV or k.startswith(PASSED_PREFIXES)}
        env.update(HOME="/tmp", TMPDIR="/tmp", MPLCONFIGDIR="/tmp/matplotlib", IPYTHONDIR="/tmp/ipython",
                   COURSE_SANDBOX="1")
        env.update(self.env)
        return ["--clearenv", *[a for k, v in sorted(env.items()) for a in ("--setenv", k, v)]]

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` inside this sandbox."""
        bwrap = shutil.which(BWRAP) or BWRAP
        # A private /tmp in memory, capped where this bwrap can (0.8 and later) so that a
        # submission that fills it cannot exhaust the grading machine's memory.
        cap = ["--size", str(TMP_BYTES)] if _takes_size() else []
        args = [bwrap, "--die-with-parent", "--unshare-all", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                *cap, "--tmpfs", "/dev/shm", *cap, "--tmpfs", "/tmp", *cap, "--tmpfs", "/var/tmp"]
        for device in sorted(Path("/dev").glob("nvidia*")) + [Path("/dev/dri")]:
            if device.exists():  # GPUs stay usable: lessons on a GPU machine run nccl
                args += ["--dev-bind", str(device), str(device)]
        for h in self._hidden():
            args += ["--tmpfs", str(h)]
        for p in self._shown():
            args += ["--ro-bind", str(p), str(p)]
        args += self._package_binds()
        writable = [Path(w).resolve() for w in self.writable]
        for w in writable:
            args += ["--bind", str(w), str(w)]
        for h in self._hidden():  # hidden folders are empty and read-only, once everything is bound
            args += ["--remount-ro", str(h)]
        workdir = Path(self.workdir).resolve() if self.workdir else (writable[0] if writable else Path("/tmp"))
        args += ["--chdir", str(workdir), *self._environment(), "--"]
        cap = memory_cap() if self.memory is None else self.memory or None
        if cap:
            return args + [sys.executable, "-c", _CAP_THEN_EXEC, str(cap), *argv]
        return args + list(argv)


def kernel_spec(folder: str | os.PathLike, sandbox: Sandbox | None, name: str = "python3", *,
                stderr: str | None = None, env: dict[str, str] | None = None) -> Path:
    """Write a Jupyter kernel spec ``folder/kernels/<name>`` whose kernel starts inside ``sandbox``.

    Put ``folder`` first on ``JUPYTER_PATH`` (or in ``KernelSpecManager.kernel_dirs``) and
    the spec replaces the usual ``python3`` kernel for that process (nbgrader's autograde
    included). The kernel talks to its client over Unix sockets
    (``KernelManager.transport = "ipc"``): it has no network outside the sandbox. Interrupts
    go as messages, which reach the kernel inside the sandbox. ``sandbox`` None writes an
    unsandboxed spec (``--no-sandbox``), with ``env`` added to the kernel's environment.

    ``stderr`` names a file the kernel's standard error and output (and bubblewrap's own
    messages, when it cannot set the sandbox up) are written to, opened outside the sandbox:
    grading keeps them as the kernel's last words, and nothing the kernel prints (ipykernel's
    start-up note, a learner's ``os.write(1, ...)``) reaches the grading command's output.
    """
    spec_dir = Path(folder) / "kernels" / name
    spec_dir.mkdir(parents=True, exist_ok=True)
    kernel = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    argv = sandbox.wrap(kernel) if sandbox is not None else kernel
    if stderr is not None:
        argv = ["/bin/sh", "-c", 'exec 2>"$0" 1>&2; exec "$@"', stderr, *argv]
    spec = {"argv": argv, "display_name": "Python 3 (grading sandbox)" if sandbox else "Python 3 (grading)",
            "language": "python", "interrupt_mode": "message", "metadata": {"debugger": False}}
    if env and sandbox is None:
        spec["env"] = dict(env)
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")
    return spec_dir
