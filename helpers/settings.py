"""The settings of a launch, declared once: what :func:`helpers.launch`, :class:`helpers.Cluster`,
the ``%dist_start`` and ``%%distributed`` magics and the autograder's harness take.

:class:`LaunchSettings` holds how many ranks to start and how (backend, simulated hosts,
timeout, process group, output, trace, calls switched off, and for persistent ranks their
view and the time others get after a failure). Each field is declared with :func:`setting`:
its default, its check, its help text (``LaunchSettings.help("timeout")``), who takes it
(``used_by``: ``"launch"``, ``"cluster"``, ``"cell"`` for one ``%%distributed`` cell) and
how a magic reads it from text. Everything else is made from those fields:

- :meth:`LaunchSettings.of` checks the names a caller passed and builds the settings;
- :func:`takes_settings` gives ``launch`` and ``Cluster`` their signatures and the settings
  part of their docstrings (what ``launch?``, ``help(launch)``, tab completion and
  :func:`inspect.signature` show);
- :func:`setting_arguments` gives the magics their options.

So a new setting is one :func:`setting` here, plus the code that uses it. The settings check
themselves when made, so a bad value raises before any rank starts, naming what to pass
instead; ``forbid`` is kept as a dict of call name -> the reason a learner reads.

    >>> s = LaunchSettings(4, nnodes=2, forbid=["all_reduce"])
    >>> s.world_size // s.nnodes, s.forbid, s.timeout > 0
    (2, {'all_reduce': 'this launch switched it off'}, True)
    >>> LaunchSettings(4, nnodes=3)
    Traceback (most recent call last):
    ...
    ValueError: nnodes=3 does not divide world_size=4: every simulated host must run the same number of ranks. Pass nnodes as one of [1, 2, 4].
    >>> LaunchSettings.of(4, "launch", timout=5)
    Traceback (most recent call last):
    ...
    TypeError: launch() takes no setting 'timout' (did you mean 'timeout'?). Its settings: backend, nnodes, timeout, init, output, max_lines, trace, forbid; LaunchSettings.help(name) says what each does.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import os
import textwrap
from dataclasses import MISSING, dataclass
from typing import Any, Callable, Mapping, Sequence, TypeVar, Union

from ._runtime.calls import APIS, COLLECTIVES, POINT_TO_POINT
from .output import OutputRouter, OutputSpec

__all__ = ["LaunchSettings", "Forbid", "setting", "takes_settings", "setting_arguments", "default_timeout",
           "validate_world", "forbid_reasons", "SCOPES"]

_DEFAULT_FORBID_REASON = "this launch switched it off"
#: Who takes settings, and how an error names each: a launch, persistent ranks, one cell on them.
SCOPES = {"launch": "launch()", "cluster": "Cluster()", "cell": "%%distributed"}
_T = TypeVar("_T")

#: What ``forbid=`` takes: call names, or call names mapped to the reason a learner reads.
Forbid = Union[Sequence[str], Mapping[str, str]]


def setting(default: Any = MISSING, *, help: str, used_by: Sequence[str] = ("launch", "cluster"),
            check: Callable[[Any], Any] | None = None, text: Callable[[str], Any] | None = None,
            flag: str | None = None) -> Any:
    """Declare one field of :class:`LaunchSettings`.

    ``help`` says what it does; ``used_by`` who takes it (keys of :data:`SCOPES`); ``check``
    gets the value passed and returns the value kept, or raises ``ValueError`` saying what to
    pass instead; ``text`` reads the value from a magic's option (by default the type of
    ``default``: int, float or str; a bool is a flag); ``flag`` is a short option (``"-n"``).
    """
    unknown = set(used_by) - set(SCOPES)
    if unknown:
        raise ValueError(f"used_by names {sorted(unknown)}; the scopes are {list(SCOPES)}")
    metadata = {"help": help, "used_by": tuple(used_by), "check": check, "text": text, "flag": flag}
    return dataclasses.field(default=default, metadata=metadata)


def default_timeout(usual: float = 60.0) -> float:
    """``usual`` seconds (60), or 10 s while nbgrader executes the notebook (autograde or validate)."""
    return 10.0 if os.environ.get("NBGRADER_EXECUTION") else usual


def _ranks(world_size: Any) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(
            f"world_size must be a whole number of ranks, 1 or more; got {world_size!r}. "
            "For example launch(fn, 4) runs fn on 4 ranks."
        )
    if world_size > 64:
        raise ValueError(
            f"world_size={world_size} is more ranks than this notebook launcher runs on one "
            "machine (at most 64); use torchrun on a cluster for more."
        )
    return world_size


def _hosts(nnodes: Any) -> int:
    if isinstance(nnodes, bool) or not isinstance(nnodes, int) or nnodes < 1:
        raise ValueError(f"nnodes must be a whole number of simulated hosts, 1 or more; got {nnodes!r}.")
    return nnodes


def _seconds(timeout: Any) -> float:
    timeout = default_timeout() if timeout is None else timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}.")
    return float(timeout)


def _grace(seconds: Any) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
        raise ValueError(f"after_failure must be seconds, 0 or more; got {seconds!r}.")
    return float(seconds)


def _view(view: Any) -> str:
    if view not in ("auto", "widgets", "text"):
        raise ValueError(f"view={view!r} is not understood; pass 'auto', 'widgets' or 'text'.")
    return view


def _output(output: Any) -> Any:
    OutputRouter(output)  # raises for anything it cannot route to
    return output


def _names(text: str) -> list[str]:
    """``all_reduce,broadcast`` -> ``['all_reduce', 'broadcast']``."""
    return [name for name in text.replace(" ", "").split(",") if name]


def forbid_reasons(forbid: Forbid) -> dict[str, str]:
    """``forbid=`` as a dict of call name -> reason; raises for names that cannot be switched off."""
    if isinstance(forbid, str):
        raise TypeError(f"forbid takes a list of call names, like forbid=['all_reduce']; got the string {forbid!r}.")
    reasons = dict(forbid) if isinstance(forbid, Mapping) else dict.fromkeys(forbid, _DEFAULT_FORBID_REASON)
    known = POINT_TO_POINT + COLLECTIVES + tuple(APIS)
    for name, reason in reasons.items():
        if name not in known:
            raise ValueError(
                f"forbid names {name!r}, which is not a call the helpers can switch off. Use names from "
                "helpers.COLLECTIVES or helpers.POINT_TO_POINT, or a whole API from helpers.APIS: "
                f"{', '.join(repr(api) for api in APIS)} (helpers.DDP, helpers.COURSE_RING, helpers.ZERO, "
                "helpers.FSDP, helpers.DTENSOR, helpers.PIPELINING)."
            )
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"forbid[{name!r}] must be a sentence saying why it is switched off; got {reason!r}.")
    return reasons


@dataclass(frozen=True)
class LaunchSettings:
    """How to start a group of ranks; each field's help is :meth:`help`, who takes it :meth:`names`."""

    world_size: int = setting(help="How many ranks (processes) to start, 1 to 64.", check=_ranks, text=int, flag="-n")
    backend: str = setting("auto", help=(
        '"auto" (nccl with one GPU per rank, CPU tensors through gloo in the same group; else gloo), '
        '"gloo", "nccl" (CUDA tensors only) or "mpi".'))
    nnodes: int = setting(1, check=_hosts, help=(
        "Simulate this many hosts of world_size // nnodes ranks each, so that LOCAL_RANK and GROUP_RANK "
        "differ from RANK the way they do on a cluster."))
    timeout: float | None = setting(None, used_by=("launch", "cluster", "cell"), check=_seconds, text=float, help=(
        "Seconds a request may run, counted from the moment every rank has started it (set up, joined the process "
        "group, loaded the function and the modules it imports: start-up has its own limit, a minute or timeout if "
        "longer, and its own report). After that every rank's stack is shown, the ranks are stopped (persistent "
        "ranks: interrupted) and LaunchTimeoutError says where each waited. None: 60 s, or 10 s while nbgrader "
        "executes the notebook (NBGRADER_EXECUTION is set), so that a deadlock costs seconds, not the class's "
        "grading time."))
    init: bool = setting(True, used_by=("launch",), help=(
        "With True the default process group is ready when the function starts and destroyed after it returns. "
        "With False the function calls init_process_group itself; MASTER_ADDR and MASTER_PORT point at a free port."))
    output: OutputSpec = setting("live", check=_output, text=str, help=(
        "Where the ranks' printed output goes: \"live\" ([rank N] lines on the notebook's stdout), \"stderr\", "
        "\"quiet\" (kept on the result's .output only) or a function sink(rank, stream, line); see helpers.output."))
    max_lines: int = setting(1000, help="At most this many lines per rank are shown.")
    trace: bool = setting(False, used_by=("launch", "cell"), help=(
        "Record every torch.distributed call on every rank; the result's .trace is a helpers.trace.Trace."))
    forbid: Forbid = setting((), check=forbid_reasons, text=_names, help=(
        "Calls to switch off on the ranks: names from helpers.COLLECTIVES (also switched off on the process-group "
        "object and as functional collectives), helpers.POINT_TO_POINT, or whole APIs: helpers.DDP "
        "(DistributedDataParallel), helpers.ZERO (ZeroRedundancyOptimizer), helpers.FSDP (fully_shard and "
        "FullyShardedDataParallel), helpers.DTENSOR (DeviceMesh, DTensor, parallelize_module), helpers.PIPELINING "
        "(torch.distributed.pipelining) or helpers.COURSE_RING (the course's ring), as a list (in a magic: "
        "all_reduce,broadcast) or a dict of name -> the reason the learner reads. Calling one raises "
        "ForbiddenCallError on that rank."))
    view: str = setting("auto", used_by=("cluster",), check=_view, help=(
        '"auto", "widgets" (a tab per rank in JupyterLab) or "text" ([rank N] lines): how persistent ranks show '
        'their output; "auto" picks widgets in a JupyterLab or Colab notebook (see helpers.view).'))
    after_failure: float = setting(2.0, used_by=("cluster",), check=_grace, help=(
        "Seconds the other persistent ranks get to finish a request once one rank failed; they keep their "
        "variables."))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check = f.metadata.get("check")
            if check is not None:
                object.__setattr__(self, f.name, check(getattr(self, f.name)))
        _divides(self.world_size, self.nnodes)

    @classmethod
    def of(cls: type[_T], world_size: int, scope: str | None = None, /, **options: Any) -> _T:
        """Settings from what a caller passed; ``scope`` (a key of :data:`SCOPES`) limits the
        names to those it takes. An unknown name raises ``TypeError`` naming the known ones.

        >>> LaunchSettings.of(2, "launch", view="text")
        Traceback (most recent call last):
        ...
        TypeError: launch() takes no setting 'view': only Cluster() takes it. Leave it out here; launch() takes backend, nnodes, timeout, init, output, max_lines, trace, forbid.
        """
        known = cls.names(scope)
        for name in options:
            if name not in known:
                raise TypeError(cls._unknown(name, scope))
        return cls(world_size, **options)

    @classmethod
    def names(cls, scope: str | None = None) -> list[str]:
        """The settings ``scope`` takes (every setting when None), in their declared order."""
        return [f.name for f in (dataclasses.fields(cls) if scope is None else _fields(cls, scope))]

    @classmethod
    def _unknown(cls, name: str, scope: str | None) -> str:
        who = SCOPES[scope] if scope else cls.__name__
        known = [n for n in cls.names(scope) if n != "world_size"]
        owners = [SCOPES[s] for f in dataclasses.fields(cls) if f.name == name for s in f.metadata["used_by"]]
        if owners:
            return (f"{who} takes no setting {name!r}: only {' and '.join(owners)} take{'s' if len(owners) == 1 else ''} "
                    f"it. Leave it out here; {who} takes {', '.join(known)}.")
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return (f"{who} takes no setting {name!r}{hint}. Its settings: {', '.join(known)}; "
                f"{cls.__name__}.help(name) says what each does.")

    def given(self, scope: str) -> dict[str, Any]:
        """The values of the settings ``scope`` takes: ``Cluster(**settings.given("cluster"))``."""
        return {name: getattr(self, name) for name in self.names(scope)}

    def replace(self, **changes: Any) -> "LaunchSettings":
        """These settings with some changed (checked again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def checked(cls, name: str, value: Any) -> Any:
        """``value`` as the setting ``name`` keeps it, or ``ValueError``: ``LaunchSettings.checked("timeout", 5)``."""
        check = cls._field(name).metadata.get("check")
        return check(value) if check is not None else value

    @classmethod
    def help(cls, name: str) -> str:
        """The help text of the setting ``name``."""
        return cls._field(name).metadata["help"]

    @classmethod
    def _field(cls, name: str) -> dataclasses.Field:
        for f in dataclasses.fields(cls):
            if f.name == name:
                return f
        raise TypeError(cls._unknown(name, None))


def _divides(world_size: int, nnodes: int) -> None:
    if world_size % nnodes:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(
            f"nnodes={nnodes} does not divide world_size={world_size}: every simulated host must "
            f"run the same number of ranks. Pass nnodes as one of {divisors}."
        )


def validate_world(world_size: Any, nnodes: Any = 1, timeout: Any = 60.0) -> None:
    """Check the shape of a launch before anything starts; raise with what to pass instead."""
    _divides(_ranks(world_size), _hosts(nnodes))
    _seconds(timeout)


def _fields(cls: type[LaunchSettings], scope: str) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if scope in f.metadata["used_by"]]


def takes_settings(scope: str, settings: type[LaunchSettings] = LaunchSettings) -> Callable[[_T], _T]:
    """Decorate a function (or class) that takes ``**settings``: its signature lists every
    setting ``scope`` takes, keyword-only with its default, and the line ``{settings}`` of its
    docstring becomes their help.

    >>> @takes_settings("cell")
    ... def cell(source, **settings):
    ...     '''Run ``source``.
    ...
    ...     {settings}
    ...     '''
    >>> inspect.signature(cell)
    <Signature (source, *, timeout: 'float | None' = None, trace: 'bool' = False)>
    >>> print(cell.__doc__.splitlines()[2])
        timeout: float | None, default None
    """

    def decorate(target: _T) -> _T:
        function = target.__init__ if isinstance(target, type) else target
        signature = inspect.signature(function)
        params = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        taken = {p.name for p in params}
        fields = [f for f in _fields(settings, scope) if f.name not in taken]
        params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=f.type,
                                     default=inspect.Parameter.empty if f.default is MISSING else f.default)
                   for f in fields]
        function.__signature__ = signature.replace(parameters=params)
        if target.__doc__:
            target.__doc__ = _fill(target.__doc__, fields)
        return target

    return decorate


def _fill(doc: str, fields: list[dataclasses.Field]) -> str:
    """``doc`` with its ``{settings}`` line replaced by one entry per field, at that line's indent."""
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "{settings}":
            indent = line[: len(line) - len(line.lstrip())]
            entries = []
            for f in fields:
                default = "" if f.default is MISSING else f", default {f.default!r}"
                kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", repr(f.type))
                entries.append(f"{indent}{f.name}: {kind}{default}")
                entries += textwrap.wrap(f.metadata["help"], 92 - len(indent), initial_indent=indent + "    ",
                                         subsequent_indent=indent + "    ")
            lines[i:i + 1] = entries
            break
    return "\n".join(lines) + ("\n" if doc.endswith("\n") else "")


def setting_arguments(scope: str, defaults: Mapping[str, Any] | None = None,
                      settings: type[LaunchSettings] = LaunchSettings) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """The ``argparse`` options for the settings ``scope`` takes: ``(flags, keywords)`` for
    ``add_argument``, in their declared order; ``defaults`` replace fields' defaults.

    >>> flags, keywords = setting_arguments("cluster", {"world_size": 2})[0]
    >>> flags, keywords["type"], keywords["default"], keywords["dest"]
    (('-n', '--world-size'), <class 'int'>, 2, 'world_size')
    """
    defaults = dict(defaults or {})
    out = []
    for f in _fields(settings, scope):
        default = defaults.get(f.name, None if f.default is MISSING else f.default)
        flags = tuple(x for x in (f.metadata["flag"], "--" + f.name.replace("_", "-")) if x)
        help_text = f.metadata["help"].replace("%", "%%")
        if isinstance(f.default, bool):
            action = "store_true" if not default else argparse.BooleanOptionalAction
            out.append((flags, {"dest": f.name, "action": action, "default": default, "help": help_text}))
            continue
        parse = f.metadata["text"] or (type(f.default) if type(f.default) in (int, float, str) else None)
        if parse is None:
            raise TypeError(f"the setting {f.name!r} needs text= in its setting(): how a magic reads it from text")
        shown = "" if default is None or default == () else f" (default: {default})"
        out.append((flags, {"dest": f.name, "type": parse, "default": default, "help": help_text + shown}))
    return out
