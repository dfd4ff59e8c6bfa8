"""Turn a function written in a notebook into a script a launcher (``torchrun``) can run.

:func:`export_script` writes ``fn`` with everything it uses from the notebook: the
modules it names (as imports), the functions and classes defined next to it (their
source), simple constants (their value), and tensors (saved to a ``.pt`` file beside
the script, which loads them). The script then reads ``RANK`` and ``WORLD_SIZE`` from
the environment, as ``torchrun``, ``torch.distributed.launch`` (with ``--use-env``) and
a SLURM wrapper set them, creates the process group, calls ``fn(rank, world_size,
*args)``, and destroys the group, all under ``if __name__ == "__main__":``.

Example::

    >>> def hello(rank, world_size):
    ...     print(f"rank {rank} of {world_size}")
    >>> path = export_script(hello, "hello.py")
    >>> # then: torchrun --standalone --nproc-per-node=2 hello.py
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import textwrap
import types
from pathlib import Path
from typing import Any, Callable, Sequence

__all__ = ["export_script", "ExportError"]


class ExportError(ValueError):
    """Something ``fn`` uses cannot be written into a script; the message says what and what to do."""


def _literal(value: Any) -> str | None:
    """The source of ``value`` when it is a plain literal that reads back equal, else None."""
    if isinstance(value, (bool, int, float, complex, str, bytes, type(None), tuple, list, dict, set, frozenset)):
        text = repr(value)
        try:
            if ast.literal_eval(text) == value:
                return text
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    return None


def _names_used(source: str) -> list[str]:
    """Names a piece of source reads, in order of first appearance."""
    seen: dict[str, None] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            seen.setdefault(node.id, None)
    return list(seen)


def _locals(source: str) -> set[str]:
    r"""Names the definitions in ``source`` bind for themselves: arguments and names assigned (Python makes a name
    assigned anywhere in a function local to it), less those declared ``global``.

    >>> sorted(_locals("def f(a):\n    start = 0\n    for i in range(start): print(i)"))
    ['a', 'i', 'start']
    """
    tree = ast.parse(source)
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    bound |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
              for a in [*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg] if a is not None}
    declared = {name for n in ast.walk(tree) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
    return bound - declared


def _source(obj: Any) -> str:
    try:
        return textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError) as exc:
        raise ExportError(
            f"cannot read the source of {getattr(obj, '__qualname__', obj)!r} ({exc}); define it in a notebook "
            "cell or a file (not with exec or in an interactive prompt without history)"
        ) from None


class _Writer:
    def __init__(self, fn: Callable, home: str, replace: dict[str, Any]) -> None:
        self.home = home
        self.replace = replace
        self.imports: dict[str, None] = {}
        self.constants: list[str] = []
        self.definitions: list[str] = []
        self.tensors: dict[str, Any] = {}
        self.done: set[int] = set()
        self.visit_definition(fn)

    def visit_definition(self, obj: Any, name: str | None = None) -> None:
        if id(obj) in self.done:
            return
        self.done.add(id(obj))
        source = _source(obj)
        scope = getattr(obj, "__globals__", None)
        if scope is None:  # a class: its methods share the module's globals
            scope = vars(importlib.import_module(obj.__module__)) if obj.__module__ in _loaded() else {}
            for member in vars(obj).values():
                func = getattr(member, "__func__", member)
                if isinstance(func, types.FunctionType):
                    scope = func.__globals__
                    break
        defined_here = {n.name for n in ast.walk(ast.parse(source))
                        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        defined_here |= _locals(source)  # a local that shares a notebook global's name is not that global
        for used in _names_used(source):
            if used in defined_here or (used not in scope and used not in self.replace):
                continue  # a local, an argument, or a builtin
            self.visit_global(used, self.replace[used] if used in self.replace else scope[used], obj)
        if name is not None and name != obj.__name__:
            source += f"\n\n{name} = {obj.__name__}\n"
        self.definitions.append(source)

    def visit_global(self, name: str, value: Any, user: Any) -> None:
        import torch

        if isinstance(value, types.ModuleType):
            real = value.__name__
            self.imports[f"import {real}" if real == name else f"import {real} as {name}"] = None
            return
        module = getattr(value, "__module__", None)
        if isinstance(value, (types.FunctionType, type)) and (module == self.home or name in self.replace):
            self.visit_definition(value, name)
            return
        if getattr(builtins, name, None) is value:
            return
        qualname = getattr(value, "__qualname__", None)
        if module and qualname and "." not in qualname and module in _loaded():
            try:
                found = getattr(importlib.import_module(module), qualname)
            except AttributeError:
                found = None
            if found is value:
                module = _shortest_home(module, qualname, value)
                line = f"from {module} import {qualname}" + (f" as {name}" if name != qualname else "")
                self.imports[line] = None
                return
        text = _literal(value)
        if text is not None:
            self.constants.append(f"{name} = {text}")
            return
        if isinstance(value, torch.Tensor):
            self.tensors[name] = value.detach().cpu()
            self.constants.append(f'{name} = _DATA["{name}"]')
            return
        raise ExportError(
            f"{getattr(user, '__qualname__', user)} uses the global {name!r}, a {type(value).__name__}, which "
            "cannot be written into a script. Create it inside the function, or pass it as an argument "
            "(args= takes plain values)."
        )


def _shortest_home(module: str, qualname: str, value: Any) -> str:
    """The shortest parent package that exports ``value`` under the same name (torch.nn.parallel, not
    torch.nn.parallel.distributed)."""
    parts = module.split(".")
    for n in range(1, len(parts)):
        try:
            if getattr(importlib.import_module(".".join(parts[:n])), qualname, None) is value:
                return ".".join(parts[:n])
        except ImportError:
            continue
    return module


def _loaded() -> set[str]:
    import sys

    return set(sys.modules)


def export_script(fn: Callable, path: str | Path, args: Sequence[Any] = (), *, setup: bool = True,
                  backend: str = "gloo", replace: dict[str, Any] | None = None) -> Path:
    """Write ``fn`` and what it uses to ``path`` as a script for ``torchrun``; returns the path.

    With ``setup=True`` (the default) the script creates the process group from the
    environment (``backend``), calls ``fn(rank, world_size, *args)`` and destroys the
    group (its last reference dropped before the interpreter exits, which spares a gloo rank
    the abort at exit that torch 2.x shows now and then). With ``setup=False`` it calls
    ``fn(*args)`` and leaves everything to ``fn``: for
    a ``main()`` that sets up its own group. ``args`` must be plain values (numbers,
    strings, lists, ...). Tensors ``fn`` reads from the notebook go to
    ``<script name>_data.pt`` beside the script.

    ``replace`` maps global names to what the script should use instead of the notebook's
    value (a function or class, whose source is written, or a plain value): the grader
    uses it to run a learner's ``main`` with the course's own model and data.

    Raises :class:`ExportError` naming the global that cannot be written, with what to do.
    """
    path = Path(path)
    for i, arg in enumerate(args):
        if _literal(arg) is None:
            raise ExportError(f"args[{i}] is a {type(arg).__name__}; a script can only take plain values "
                              "(numbers, strings, lists, dicts): build it inside the function instead")
    writer = _Writer(fn, fn.__module__, dict(replace or {}))
    lines = [f'"""{fn.__name__}, exported from a notebook by helpers.export_script.', "",
             f"Run: torchrun --standalone --nproc-per-node=2 {path.name}", '"""', ""]
    setup_imports = ["import torch.distributed as dist",
                     "import torch.distributed.nn  # noqa: F401 - before any process group exists: see main()"]
    imports = dict.fromkeys(["import os"] + (setup_imports if setup else []) + list(writer.imports))
    if writer.tensors:
        imports["import torch"] = None
    lines += list(imports)
    lines.append("")
    if writer.tensors:
        data = path.with_name(f"{path.stem}_data.pt")
        import torch

        torch.save(writer.tensors, data)
        lines.append(f'_DATA = torch.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "{data.name}"), '
                     'weights_only=True)')
    lines += writer.constants
    lines.append("")
    for source in writer.definitions:
        lines += ["", source.rstrip(), ""]
    call_args = ", ".join(_literal(a) for a in args)
    if setup:
        lines += ["", "def main():",
                  "    # Set by torchrun (and by torch.distributed.launch --use-env, or a SLURM wrapper).",
                  '    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])',
                  f'    dist.init_process_group("{backend}")  # reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE',
                  "    world = dist.group.WORLD",
                  "    try:",
                  f"        {fn.__name__}(rank, world_size{', ' + call_args if call_args else ''})",
                  "    finally:",
                  "        dist.destroy_process_group()",
                  "        # The group's last reference goes here, while Python is whole, so gloo's threads end",
                  "        # now. Kept until the interpreter's exit (torch.distributed.nn, which DDP imports,",
                  "        # keeps it in default arguments unless imported before the group exists), their end",
                  "        # aborted the process now and then.",
                  "        del world",
                  "", "", 'if __name__ == "__main__":', "    main()", ""]
    else:
        lines += ["", 'if __name__ == "__main__":', f"    {fn.__name__}({call_args})", ""]
    path.write_text("\n".join(lines))
    return path
