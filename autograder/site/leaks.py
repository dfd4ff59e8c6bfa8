"""Looking through a built site for answers: every line of every solution and hidden test.

:func:`secret_lines` takes from each instructor notebook the lines between ``### BEGIN
SOLUTION`` and ``### END SOLUTION`` and between ``### BEGIN HIDDEN TESTS`` and ``### END
HIDDEN TESTS``. A line is left out of the search when it gives nothing away:

- it has fewer than :data:`MIN_CHARS` characters besides whitespace (``pass``, ``return
  tensor``, ``else:``, a lone bracket): such lines occur in any Python and say nothing of an
  answer, while every line that does (``send = (rank - step - 1) % world_size``,
  ``ring_reduce_scatter(tensor)``, a hidden test's ``grade("4.4", ring_allreduce, "correct")``) is longer;
- or it appears in a learner notebook anyway, alone, within a longer line or across the lines of
  one cell (an exercise's statement may wrap the line it gives away; a stub keeps
  the function's signature and docstring; another lesson's code may do the same thing, as
  ``flat = tensor.view(-1)`` does): learners see it already.

:func:`scan` compares those lines, with all whitespace removed, against the text of every file
under the site: HTML without its tags and entities (highlighted code is split into spans),
JSON and notebooks by their strings, other text files as they are; fonts and raster images
are skipped. ``make site`` runs it last and fails on any hit; ``tests/test_site.py`` runs it
too, and shows that it finds a planted answer.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

__all__ = ["MIN_CHARS", "secret_lines", "public_text", "scan", "page_text"]

#: Lines shorter than this (whitespace not counted) are not searched for: see the module docstring.
MIN_CHARS = 12
_MARKS = {"### BEGIN SOLUTION": ("### END SOLUTION", "solution"),
          "### BEGIN HIDDEN TESTS": ("### END HIDDEN TESTS", "hidden test")}
_BINARY = (".png", ".jpg", ".jpeg", ".gif", ".ico", ".woff", ".woff2", ".ttf", ".eot", ".otf", ".pickle", ".doctree")
_TAG = re.compile(r"<[^>]*>")
_SPACE = re.compile(r"\s+")


def _squeeze(text: str) -> str:
    return _SPACE.sub("", text)


def _cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in nb["cells"]]


def public_text(root: Path, lessons: list[str]) -> str:
    """Every line of every learner notebook, squeezed, one per line, and every cell squeezed whole (a statement
    that wraps a line of code over two lines of prose shows it too): what learners are shown anyway."""
    sources = [source for lesson in lessons for source in _cells(root / "course" / lesson / f"{lesson}.ipynb")]
    return "\n".join([_squeeze(line) for source in sources for line in source.splitlines()]
                     + [_squeeze(source) for source in sources])


def secret_lines(root: Path, lessons: list[str]) -> list[tuple[str, str, str]]:
    """``(lesson, "solution" | "hidden test", line)`` for every line that must not be on the site."""
    public = public_text(root, lessons)
    found: dict[str, tuple[str, str, str]] = {}
    for lesson in lessons:
        for source in _cells(root / "solutions" / lesson / f"{lesson}.ipynb"):
            end = kind = None
            for line in source.splitlines():
                mark = line.strip()
                if end is None:
                    if mark in _MARKS:
                        end, kind = _MARKS[mark]
                    continue
                if mark == end:
                    end = None
                    continue
                squeezed = _squeeze(line)
                if len(squeezed) >= MIN_CHARS and squeezed not in public:
                    found.setdefault(squeezed, (lesson, kind, line.strip()))
    return list(found.values())


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def page_text(path: Path) -> str | None:
    """The text of a site file a reader could see or fetch, squeezed; None for fonts and raster images."""
    if path.suffix.lower() in _BINARY:
        return None
    raw = path.read_bytes().decode("utf-8", errors="replace")
    if path.suffix in (".html", ".htm", ".svg", ".xml"):
        raw = raw + "\n" + html.unescape(_TAG.sub("", raw))
    elif path.suffix in (".json", ".ipynb"):
        try:
            raw = raw + "\n" + "\n".join(_strings(json.loads(raw)))
        except ValueError:
            pass
    return _squeeze(raw)


def scan(site: Path, root: Path, lessons: list[str]) -> list[str]:
    """Every place under ``site`` where a solution or hidden-test line shows: ``"file: lesson, kind: line"``."""
    secrets = secret_lines(root, lessons)
    hits = []
    for path in sorted(p for p in site.rglob("*") if p.is_file()):
        text = page_text(path)
        if not text:
            continue
        for lesson, kind, line in secrets:
            if _squeeze(line) in text:
                hits.append(f"{path.relative_to(site)}: lesson {lesson}, {kind} line {line!r}")
    return hits
