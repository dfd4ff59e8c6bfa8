"""Two start-up costs of nbgrader that the course's commands do not pay.

**A grammar nothing uses.** ``import nbformat`` imports ``jsonschema``, whose format checkers import
``rfc3987_syntax`` when it is installed (jupyter-events asks for ``jsonschema[format-nongpl]``, which
brings it). That package builds an Earley parser for RFC 3987 from its grammar at import: about a second
of CPU, in every process that reads a notebook (each ``python -m autograder`` command and each of its
grading workers), to check the ``iri`` and ``iri-reference`` formats, which no notebook schema and nothing
in grading asks for. :func:`defer_iri_grammar` puts a stand-in for ``rfc3987_syntax`` in ``sys.modules``
whose one function jsonschema takes, ``is_valid_syntax``, imports the real package on its first call and
then answers as it would: the same checks, built when first needed instead of at every start.

**A process to read one line.** When nbgrader creates a gradebook it records the version of its database
schema, which it learns by running ``alembic heads`` as a command (``nbgrader.api.get_alembic_version``):
a Python process that imports nbgrader again, about 2 s of CPU, and that fails unless ``alembic`` is on
``PATH``. :func:`alembic_head_in_process` makes it read the same revision from nbgrader's own migration
scripts in this process (a tenth of a second).

Example::

    >>> defer_iri_grammar()
    >>> import jsonschema
    >>> checker = jsonschema.FormatChecker()
    >>> checker.conforms("https://example.org/a b", "iri"), checker.conforms("https://example.org/ä", "iri")
    (False, True)
    >>> alembic_head_in_process()
    >>> import nbgrader.api
    >>> nbgrader.api.get_alembic_version() == _ask_alembic()
    True
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any, Callable

__all__ = ["defer_iri_grammar", "alembic_head_in_process"]

_NAME = "rfc3987_syntax"


def defer_iri_grammar() -> None:
    """Let ``rfc3987_syntax`` build its grammar at its first use, not when ``jsonschema`` is imported.

    Does nothing when the package is already imported or is not installed. Call it before the first
    ``import nbformat`` (or ``jsonschema``) of a process.
    """
    if _NAME in sys.modules or importlib.util.find_spec(_NAME) is None:
        return
    real: list[Callable[..., Any]] = []

    def is_valid_syntax(term: str, value: str) -> bool:
        if not real:
            if sys.modules.get(_NAME) is stand_in:
                del sys.modules[_NAME]
            real.append(importlib.import_module(_NAME).is_valid_syntax)
        return real[0](term, value)

    stand_in = types.ModuleType(_NAME, "A stand-in that imports rfc3987_syntax at its first use "
                                       "(autograder.notebooks.imports).")
    stand_in.is_valid_syntax = is_valid_syntax
    sys.modules[_NAME] = stand_in


def alembic_head_in_process() -> None:
    """Let nbgrader learn its schema's revision in this process when it creates a gradebook, not from a command.

    Does nothing when this nbgrader has no ``get_alembic_version`` (another version's way), or once done.
    """
    try:
        import nbgrader.api as api
    except ImportError:
        return
    asked = getattr(api, "get_alembic_version", None)
    if asked is None or getattr(asked, "in_process", False):
        return

    def get_alembic_version() -> str:
        try:
            heads = _heads()
        except Exception:  # noqa: BLE001 - nbgrader's own way still works
            heads = []
        return heads[0] if len(heads) == 1 else asked()

    get_alembic_version.in_process = True  # type: ignore[attr-defined]
    api.get_alembic_version = get_alembic_version


def _heads() -> list[str]:
    """The head revisions of nbgrader's migration scripts, read as ``alembic heads`` reads them."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from nbgrader.dbutil import ALEMBIC_DIR

    config = Config()
    config.set_main_option("script_location", ALEMBIC_DIR)
    return list(ScriptDirectory.from_config(config).get_heads())


def _ask_alembic() -> str:
    """What ``alembic heads`` prints, as nbgrader runs it (for the example above)."""
    import os
    import subprocess

    from nbgrader.dbutil import _temp_alembic_ini

    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    with _temp_alembic_ini("sqlite:////tmp/gradebook.db") as ini:
        out = subprocess.check_output(["alembic", "-c", ini, "heads"], env={**os.environ, "PATH": path})
    return out.decode().split()[0]
