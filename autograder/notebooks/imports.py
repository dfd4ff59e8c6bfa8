"""Reading notebooks without paying at import for a grammar the course never uses.

``import nbformat`` imports ``jsonschema``, whose format checkers import ``rfc3987_syntax`` when it is
installed (jupyter-events asks for ``jsonschema[format-nongpl]``, which brings it). That package builds
an Earley parser for RFC 3987 from its grammar at import: about a second of CPU, in every process that
reads a notebook (each ``python -m autograder`` command and each of its grading workers), to check the
``iri`` and ``iri-reference`` formats, which no notebook schema and nothing in grading asks for.

:func:`defer_iri_grammar` puts a stand-in for ``rfc3987_syntax`` in ``sys.modules`` whose one function
jsonschema takes, ``is_valid_syntax``, imports the real package on its first call and then answers as
it would: the same checks, built when first needed instead of at every start.

Example::

    >>> defer_iri_grammar()
    >>> import jsonschema
    >>> checker = jsonschema.FormatChecker()
    >>> checker.conforms("https://example.org/a b", "iri"), checker.conforms("https://example.org/ä", "iri")
    (False, True)
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any, Callable

__all__ = ["defer_iri_grammar"]

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
