"""A lesson's web page: the learner notebook, with outputs from the instructor's run where they give nothing away.

The page shows ``course/<lesson>/<lesson>.ipynb`` (stubs, visible self-checks), never the
instructor notebook. Each of its code cells gets the outputs of the same cell (same id) in
the executed instructor notebook (:mod:`.execute`) only when all of these hold:

- the two cells' sources are the same: a solution cell (the learner sees a stub) and a test
  cell with hidden tests differ, so they show no output;
- the cell does not use an answer: every name that a solution cell defines at top level
  (``ring_allreduce``) is *tainted*, and so is every name defined by a cell that uses a
  tainted name, cell after cell, in the notebook's order; a cell that reads a tainted name
  it does not assign itself (Python names only: comments and strings do not count) shows no
  output, since what it prints or draws comes from the answer (a self-check that passed,
  the schedule the answer printed);
- the author did not hide it: cell metadata ``"site": {"output": false}``.

Every figure needs a description for readers who cannot see it (the image's alt text): cell
metadata ``"site": {"alt": "..."}`` on the cell that draws it (one text for all its
figures), or else the figure titles the cell's code sets with a plain string
(``ax.set_title("...")``, ``fig.suptitle("...")``, ``plot_timeline(title="...")``), which in
this course say what the figure shows. A shown image with neither stops the build
(:class:`PageError`), naming the lesson, the cell and the fix.
The Colab badge and set-up cells (they need Colab) are replaced by the page's own links.
"""

from __future__ import annotations

import copy
import io
import keyword
import re
import tokenize
from pathlib import Path

import nbformat

from ..notebooks import colab

__all__ = ["PageError", "IMAGE_TYPES", "figure_alt", "lesson_page", "tainted_cells", "defined_names", "used_names"]

IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml", "image/gif")
#: Output data kept on a page: what a static page can show without a kernel or a widget manager.
_KEPT = (*IMAGE_TYPES, "text/html", "text/markdown", "text/latex", "text/plain")
_NAME = re.compile(r"[A-Za-z_]\w*")


_TITLE = re.compile(r"""(?:\btitle\s*=\s*|\.set_title\(\s*|\bsuptitle\(\s*|\bplt\.title\(\s*)(f?)("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')""")


def figure_alt(source: str, site: dict) -> str | None:
    """A figure's alt text: the cell's ``site.alt`` metadata, else the plain-string titles its code sets, else None."""
    alt = site.get("alt")
    if isinstance(alt, str) and alt.strip():
        return alt.strip()
    titles = []
    for is_f, literal in _TITLE.findall(source):
        text = literal[1:-1].replace("\\n", " ").replace('\\"', '"').replace("\\'", "'")
        if is_f and "{" in text:
            continue  # its words depend on values computed at run time: not usable as it stands
        if text.strip() and text not in titles:
            titles.append(text.strip())
    return "Figure: " + "; ".join(titles) if titles else None


class PageError(RuntimeError):
    """A lesson page cannot be made as the notebooks stand; the message says why and what to do."""


def _source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _python(source: str) -> str:
    """The Python of a cell: IPython magics and shell lines blanked (a ``%%`` cell's body is kept)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def used_names(source: str) -> set[str]:
    """The names a cell reads without binding them itself (its free names), functions' bodies included.

    A name the cell assigns anywhere (``result = launch(...)``, a loop variable, a function's
    parameter or local) is not counted: the cell makes its own value. Cells that do not parse
    count every name in their code (tokens: not comments or strings), to be safe.
    """
    import ast

    try:
        tree = ast.parse(_python(source))
    except SyntaxError:
        try:
            return {tok.string for tok in tokenize.generate_tokens(io.StringIO(_python(source) + "\n").readline)
                    if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string)}
        except (tokenize.TokenError, IndentationError, SyntaxError):
            return set(_NAME.findall(source))
    loads, binds = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else binds).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            binds.add(node.name)
        elif isinstance(node, ast.arg):
            binds.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            binds.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            binds.add(node.name)
    return loads - binds


def defined_names(source: str) -> set[str]:
    """The names a cell binds at top level: functions, classes, assignments, loop and with targets.

    Not imports: a module a solution cell imports (``torch``) is no answer, and counting it
    would hide the output of every later cell.
    """
    import ast

    try:
        tree = ast.parse(_python(source))
    except SyntaxError:
        return set(re.findall(r"^(?:def|class)\s+(\w+)|^(\w+)\s*=", source, re.M)) - {""}
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        else:  # assignments, loops, with: their targets (not the locals of a comprehension inside)
            for sub in ast.walk(node):
                if isinstance(sub, ast.comprehension):
                    continue
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
    return names


def tainted_cells(instructor: nbformat.NotebookNode) -> set[str]:
    """Ids of the instructor notebook's code cells whose outputs depend on an answer (see the module docstring)."""
    tainted: set[str] = set()
    hidden: set[str] = set()
    for cell in instructor.cells:
        if cell.cell_type != "code":
            continue
        src = _source(cell)
        if cell.metadata.get("nbgrader", {}).get("solution"):
            tainted |= defined_names(src)
            hidden.add(cell.get("id"))
        elif used_names(src) & tainted:
            tainted |= defined_names(src)
            hidden.add(cell.get("id"))
    return hidden


def _clean_output(output, root: Path):
    """A copy of ``output`` fit for a static page: rich data a page can show, paths of this checkout removed."""
    output = copy.deepcopy(output)
    prefix = str(root) + "/"

    def scrub(text):
        if isinstance(text, list):
            text = "".join(text)
        return text.replace(prefix, "") if isinstance(text, str) else text

    if output.output_type == "stream":
        output.text = scrub(output.text)
    elif output.output_type in ("display_data", "execute_result"):
        data = {k: v for k, v in output.data.items() if k in _KEPT}
        for kind in ("text/plain", "text/html"):
            if kind in data:
                data[kind] = scrub(data[kind])
        if not data:
            return None
        output.data = data
        output.metadata = {k: v for k, v in output.get("metadata", {}).items() if k in IMAGE_TYPES}
        if output.output_type == "execute_result":
            output.execution_count = None
    elif output.output_type == "error":
        output.traceback = [scrub(line) for line in output.traceback]
    return output


def _links(lesson: str) -> str:
    """The page's "Open in Colab" and "Download notebook" links (markdown holding HTML), and what the page shows."""
    return (f'<p class="course-links"><a class="course-colab" href="{colab.colab_url(lesson)}">Open in Colab</a> '
            f'<a class="course-download" href="../notebooks/{lesson}.ipynb" download="{lesson}.ipynb">'
            "Download notebook</a></p>\n\n"
            "*This page shows the notebook learners start from, with the outputs and pictures of a real run. "
            "Cells where you write an answer, and cells that use one, are shown without output.*\n\n")


def lesson_page(lesson: str, learner: nbformat.NotebookNode, instructor: nbformat.NotebookNode,
                root: Path) -> tuple[nbformat.NotebookNode, dict]:
    """The page notebook of ``lesson`` and what went into it (cells with outputs, hidden, figures)."""
    page = copy.deepcopy(learner)
    ran = {cell.get("id"): cell for cell in instructor.cells if cell.get("id")}
    hidden = tainted_cells(instructor)
    stats = {"shown": 0, "differ": 0, "use_answer": 0, "author": 0, "figures": 0}
    cells = []
    for cell in page.cells:
        if cell.get("id") in (colab.BADGE_ID, colab.SETUP_ID):
            continue
        cell.metadata.pop("nbgrader", None)  # grading metadata has no place on a web page
        site = cell.metadata.pop("site", {}) or {}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            twin = ran.get(cell.get("id"))
            if twin is None or _source(twin) != _source(cell):
                stats["differ"] += 1
            elif cell.get("id") in hidden:
                stats["use_answer"] += 1
            elif site.get("output", True) is False:
                stats["author"] += 1
            else:
                cell.outputs = [o for o in (_clean_output(o, root) for o in twin.get("outputs", [])) if o is not None]
                stats["shown"] += bool(cell.outputs)
            images = sum(1 for o in cell.outputs if any(k in o.get("data", {}) for k in IMAGE_TYPES))
            if images:
                alt = figure_alt(_source(cell), site)
                if alt is None:
                    first = _source(cell).strip().splitlines()[0][:80] if _source(cell).strip() else ""
                    raise PageError(
                        f"lesson {lesson}: code cell {cell.get('id')} ({first!r}) draws {images} figure(s) but has no "
                        "description for readers who cannot see it, and no plain-string title in its code. Add cell metadata "
                        '"site": {"alt": "what the figure shows"} to that cell in solutions/'
                        f"{lesson}/{lesson}.ipynb, run `make course`, then build the site again.")
                cell.metadata["mystnb"] = {"image": {"alt": alt}}
                stats["figures"] += images
        cells.append(cell)
    title = next((c for c in cells if c.cell_type == "markdown" and _source(c).lstrip().startswith("# ")), None)
    if title is None:
        raise PageError(f"course/{lesson}/{lesson}.ipynb has no markdown cell starting with a '# ' title, which the "
                        "page's title and links go under. Give the lesson's first markdown cell one in solutions/ "
                        "and run `make course`.")
    heading, _, rest = _source(title).lstrip().partition("\n")
    title.source = f"{heading}\n\n{_links(lesson)}{rest.lstrip()}"
    page.cells = cells
    return page, stats
