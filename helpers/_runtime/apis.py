"""Whole APIs a launch can switch off: DDP, ZeroRedundancyOptimizer, FSDP, DTensor, pipelining, the course's ring.

``forbid=[helpers.FSDP]`` switches off every way into FSDP, not one function: :data:`TARGETS`
lists, per name of :data:`~helpers._runtime.calls.APIS`, what is refused, in every module of
every supported torch (2.4 on) that exports it; a module or attribute the installed torch
lacks is skipped. Three kinds of target:

- ``"init"``: a class's constructor (``__init__``), so the class and every subclass refuse
  to be built: ``DeviceMesh`` (which ``init_device_mesh``, ``parallelize_module`` and
  ``DTensor.from_local`` all need), pipelining's stage and schedule bases, FSDP2's state
  (which every ``fully_shard`` builds, however the program got hold of it);
- ``"function"``: a module's attribute replaced, so the error is raised at the program's own
  call (``fully_shard`` in each of the five modules that export it);
- ``"static"``: a class's static method (``DTensor.from_local``).

Modules not imported yet are not imported here (``torch.distributed.tensor`` and
``pipelining`` take seconds): :class:`ImportWatch` switches their targets off as soon as the
program imports them. Each refusal raises :class:`~helpers.ForbiddenCallError` with the
label of what was called, the reason the launch gave, the family of the ``forbid`` name
and the name; :meth:`Instrument.refuse_only` puts everything back.

Example (inside a rank)::

    >>> current().forbid({"DTensor": "build the tensor-parallel layer from all_reduce"})
    >>> init_device_mesh("cpu", (2,))
    Traceback (most recent call last):
    ForbiddenCallError: torch.distributed.device_mesh.init_device_mesh is switched off here: build ...
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable

from ..errors import ForbiddenCallError
from .calls import COURSE_RING, DDP, DTENSOR, FSDP, PIPELINING, ZERO, family_of

__all__ = ["TARGETS", "ImportWatch", "switch_off", "refuser", "WATCH"]

def _dtensor(module: str) -> tuple[tuple[str, str, str, str], ...]:
    """DTensor's constructors in one module that exports them."""
    return tuple((module, attribute, kind, f"{module}.{attribute}") for attribute, kind in (
        ("distribute_tensor", "function"), ("distribute_module", "function"), ("DTensor.from_local", "static")))


#: Per ``forbid`` name: (module, attribute, kind, label). ``label`` names the call in the error;
#: for an ``"init"`` target ``{cls}`` in it is the class being built. ``"*"``: every name of
#: the module's ``__all__``.
TARGETS: dict[str, tuple[tuple[str, str, str, str], ...]] = {
    DDP: (("torch.nn.parallel", "DistributedDataParallel", "init", "torch.nn.parallel.{cls}"),),
    COURSE_RING: (("helpers.ring", "*", "function", "helpers.ring.{name}"),),
    ZERO: (("torch.distributed.optim", "ZeroRedundancyOptimizer", "init", "torch.distributed.optim.{cls}"),),
    FSDP: (
        ("torch.distributed.fsdp", "FullyShardedDataParallel", "init", "torch.distributed.fsdp.{cls}"),
        # FSDP2's fully_shard: public from 2.6, under _composable.fsdp in 2.4 and 2.5 (still re-exported there).
        ("torch.distributed.fsdp", "fully_shard", "function", "torch.distributed.fsdp.fully_shard"),
        ("torch.distributed.fsdp._fully_shard", "fully_shard", "function", "torch.distributed.fsdp.fully_shard"),
        ("torch.distributed.fsdp._fully_shard._fully_shard", "fully_shard", "function",
         "torch.distributed.fsdp.fully_shard"),
        ("torch.distributed._composable.fsdp", "fully_shard", "function",
         "torch.distributed._composable.fsdp.fully_shard"),
        ("torch.distributed._composable.fsdp.fully_shard", "fully_shard", "function",
         "torch.distributed._composable.fsdp.fully_shard"),
        # torch 2.4's composable FSDP1 (a function of that package there; a module in later ones: skipped).
        ("torch.distributed._composable", "fully_shard", "function", "torch.distributed._composable.fully_shard"),
        # Every fully_shard builds its state: a reference taken before the switch-off is refused here.
        ("torch.distributed.fsdp._fully_shard._fsdp_state", "FSDPState", "init", "torch.distributed.fsdp.fully_shard"),
        ("torch.distributed._composable.fsdp._fsdp_state", "FSDPState", "init",
         "torch.distributed._composable.fsdp.fully_shard"),
    ),
    DTENSOR: (
        ("torch.distributed.device_mesh", "DeviceMesh", "init", "torch.distributed.device_mesh.{cls}"),
        ("torch.distributed.device_mesh", "init_device_mesh", "function",
         "torch.distributed.device_mesh.init_device_mesh"),
        ("torch.distributed", "init_device_mesh", "function", "torch.distributed.init_device_mesh"),
        *_dtensor("torch.distributed.tensor"),
        ("torch.distributed.tensor.parallel", "parallelize_module", "function",
         "torch.distributed.tensor.parallel.parallelize_module"),
        *_dtensor("torch.distributed._tensor"),  # torch 2.4's home of DTensor (an alias from 2.5)
    ),
    PIPELINING: (
        ("torch.distributed.pipelining.stage", "_PipelineStageBase", "init", "torch.distributed.pipelining.{cls}"),
        ("torch.distributed.pipelining.schedules", "_PipelineSchedule", "init", "torch.distributed.pipelining.{cls}"),
        ("torch.distributed.pipelining", "pipeline", "function", "torch.distributed.pipelining.pipeline"),
    ),
}


def refuser(label: str, reason: str, name: str, original: Any = None, init: bool = False) -> Callable:
    """A stand-in that raises :class:`~helpers.ForbiddenCallError` for ``label`` (``name``: the
    ``forbid`` entry). With ``init`` it stands in for a constructor: ``{cls}`` in ``label`` is
    the class being built. ``original`` is what it replaces (kept on ``__helpers_refuses__``)."""
    family = family_of(name)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        call = label.format(cls=type(args[0]).__name__) if init else label  # a constructor's first argument: self
        raise ForbiddenCallError(call, reason, family, name)

    refuse.__name__ = "__init__" if init else label.rsplit(".", 1)[-1]
    refuse.__helpers_refuses__ = original
    return refuse


def switch_off(inst: Any, name: str, reason: str) -> None:
    """Refuse every target of ``name`` (a key of :data:`TARGETS`) on the rank's Instrument ``inst``:
    now in the modules already imported, in the others when they are."""
    for module_name, attribute, kind, label in TARGETS[name]:
        def apply(module: Any, attribute: str = attribute, kind: str = kind, label: str = label) -> None:
            _refuse_target(inst, module, attribute, kind, label, reason, name)

        module = sys.modules.get(module_name)
        if module is not None:
            apply(module)
        else:
            WATCH.when_imported(module_name, apply)


def _refuse_target(inst: Any, module: Any, attribute: str, kind: str, label: str, reason: str, name: str) -> None:
    if attribute == "*":
        for each in getattr(module, "__all__", ()):
            _refuse_target(inst, module, each, kind, label.replace("{name}", each), reason, name)
        return
    owner_name, _, member = attribute.rpartition(".")
    owner = getattr(module, owner_name, None) if owner_name else module
    value = getattr(owner, member, None) if owner is not None else None
    if value is None or inspect.ismodule(value):
        return  # this torch has no such thing (or it is a module here): nothing to refuse
    if kind == "init":
        if isinstance(value, type):
            inst._set(value, "__init__", refuser(label, reason, name, init=True), refusing=True)
        return
    original = getattr(value, "__helpers_refuses__", value)  # a module that imported a refuser by name
    stand_in = refuser(label, reason, name, original)
    if kind == "static":
        inst._set(owner, member, staticmethod(stand_in), refusing=True)
    else:
        inst._set(owner, member, stand_in, refusing=True, original=original)


class ImportWatch:
    """A finder on ``sys.meta_path`` that finds nothing itself: when a watched module has been
    executed (imported for the first time), it runs that module's callbacks, once.

    >>> watch = ImportWatch()
    >>> watch.when_imported("json", lambda module: print(module.__name__))  # already imported: runs now
    json
    """

    def __init__(self) -> None:
        self.waiting: dict[str, list[Callable[[Any], None]]] = {}

    def when_imported(self, module_name: str, callback: Callable[[Any], None]) -> None:
        module = sys.modules.get(module_name)
        if module is not None:
            callback(module)
            return
        self.waiting.setdefault(module_name, []).append(callback)
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def clear(self) -> None:
        """Forget every callback not run yet (what :meth:`Instrument.refuse_only` does first)."""
        self.waiting.clear()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.waiting:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        execute = getattr(loader, "exec_module", None)
        if execute is None or isinstance(loader, type):  # a class serves every module it loads: leave it
            return spec

        def exec_module(module: Any) -> None:
            execute(module)
            for callback in self.waiting.pop(name, ()):
                callback(module)

        loader.exec_module = exec_module  # on this loader only: each module's spec has its own
        return spec


#: The rank's one import watch (in :data:`sys.meta_path` from its first use on).
WATCH = ImportWatch()
