"""``make site`` (``python -m autograder site``): the learner course as a static website in ``dist/site/``.

Steps: make sure every lesson's instructor notebook has a run in the cache (:mod:`.execute`;
``--offline`` allows none to run and names the missing ones), make each lesson's page
(:mod:`.pages`), write a Sphinx project (MyST-NB reads the page notebooks, without executing
them; sphinx-book-theme; Sphinx's own client-side search) into ``build/site/src/``, build it
into the site folder, copy the learner notebooks into ``notebooks/`` for the download links
and MathJax (from the ``jupyter-server-mathjax`` package) into ``_static/mathjax/``, and
finally look through every file of the site for answers (:mod:`.leaks`).

Everything comes from installed packages: the build needs no network. Only page notebooks
whose content changed are rewritten, so Sphinx reads only those again.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import nbformat

from ..notebooks import colab
from ..notebooks.generate import lessons as all_lessons
from ..paths import ROOT
from ..release.readme import CLONE_FOLDER
from . import execute, leaks, pages

__all__ = ["SiteError", "DEFAULT_DIR", "build", "main"]

DEFAULT_DIR = Path("dist") / "site"
_HERE = Path(__file__).resolve().parent
TITLE = "Distributed training with PyTorch"


class SiteError(RuntimeError):
    """The site cannot be built as asked; the message says why and what to do next."""


def _write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` unless ``path`` holds it already (Sphinx rereads a page only when its file changes)."""
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return True


def _road(root: Path, names: list[str]) -> str:
    """Lesson 00's road-ahead table, each lesson's row linked to its page (the table lives once, in lesson 00)."""
    nb = nbformat.read(root / "course" / names[0] / f"{names[0]}.ipynb", as_version=4)
    text = next((c.source for c in nb.cells if c.cell_type == "markdown" and "## The road ahead" in c.source), None)
    if text is None:
        raise SiteError(f"course/{names[0]}/{names[0]}.ipynb has no '## The road ahead' table, which the home page "
                        "lists the lessons from. Put it back in solutions/ and run `make course`.")
    rows = re.findall(r"^\|.*\|\s*$", text.split("## The road ahead", 1)[1], re.M)
    by_number = {name[:2]: name for name in names}
    out = []
    for row in rows:
        m = re.match(r"^\| (\d{2}) ([^|]+?) \|", row)
        if m and m[1] in by_number:
            row = row.replace(f"| {m[1]} {m[2]} |", f"| [{m[1]} {m[2]}](lessons/{by_number[m[1]]}.ipynb) |", 1)
        out.append(row)
    return "\n".join(out)


_MATHJAX = """
mathjax_path = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full"   # MathJax 2, copied into the site
mathjax2_config = {
    # MyST-NB marks the notebook's cells tex2jax_ignore: typeset the math Sphinx marked (class "math") only
    "tex2jax": {"inlineMath": [["\\\\(", "\\\\)"]], "displayMath": [["\\\\[", "\\\\]"]],
                "processClass": "tex2jax_process|mathjax_process|math|output_area",
                "ignoreClass": "tex2jax_ignore|mathjax_ignore|document"},
    # jupyter-server-mathjax ships the STIX-Web fonts only: use them, never look for others
    "HTML-CSS": {"availableFonts": [], "preferredFont": None, "webFont": "STIX-Web", "imageFont": None},
}
"""


def _conf(mathjax: bool) -> str:
    return f'''# Written by autograder/site/website.py for `make site`; edits here are overwritten.
project = {TITLE!r}
author = "the course's authors"
extensions = ["myst_nb"]
nb_execution_mode = "off"          # outputs come from the cache (autograder/site/execute.py)
nb_output_stderr = "show"
myst_enable_extensions = ["dollarmath", "amsmath"]
exclude_patterns = ["_build", "_extra"]
html_theme = "sphinx_book_theme"
html_title = {TITLE!r}
html_copy_source = False
html_show_sourcelink = False
html_extra_path = ["_extra"]          # _extra/notebooks/: the learner notebooks, for download
html_theme_options = {{
    "use_download_button": False,   # each lesson page has its own link to the learner notebook
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "home_page_in_toc": True,
    "show_toc_level": 2,
}}
html_static_path = ["_static"]
html_css_files = ["course.css"]
suppress_warnings = ["mystnb.unknown_mime_type", "misc.highlighting_failure"]
{_MATHJAX if mathjax else ""}'''


CSS = """/* Written by autograder/site/website.py. The lesson pages' two links, as buttons. */
.course-links a { display: inline-block; padding: .35em .9em; margin: 0 .5em .5em 0; border-radius: .3em;
  border: 1px solid var(--pst-color-primary); text-decoration: none; font-weight: 600; }
.course-links a.course-colab { background: var(--pst-color-primary); color: var(--pst-color-background); }
"""


def _mathjax_dir() -> Path | None:
    try:
        import jupyter_server_mathjax
    except ImportError:
        return None
    folder = Path(jupyter_server_mathjax.__file__).parent / "static"
    return folder if (folder / "MathJax.js").is_file() else None


def _copy_mathjax(source: Path, dest: Path) -> None:
    """MathJax 2 without what these pages never load (the SVG output and other languages)."""
    if dest.is_dir():
        return
    shutil.copytree(source, dest, ignore=lambda folder, names: [n for n in names if n in ("SVG", "localization")
                                                                 or n.endswith((".py", ".pyc"))])


def _run(name: str, root: Path, run_id: str | None, wait: bool):
    try:
        return execute.executed(name, root, run_id=run_id, wait=wait)
    except Exception as err:  # nbclient's CellExecutionError and kernel failures
        raise SiteError(f"solutions/{name}/{name}.ipynb failed to run, so its page cannot show a real run: "
                        f"{type(err).__name__}: {str(err)[-1500:]}\nFix the notebook (it must run top to bottom "
                        "as tests/test_notebooks.py runs it) and build again.") from None


def _runs(names: list[str], gone: list[str], root: Path, run_id: str | None, log) -> dict:
    """Every lesson's executed notebook. A lesson another process is running now (its lock is taken: a
    notebook test on another pytest-xdist worker) is left for later, and the others are run meanwhile,
    so that two processes share the work instead of one waiting on the other. They are taken from the last
    lesson back, since tests/test_notebooks.py runs them from the first: when both run at once, they meet
    once, in the middle. The result is in the order of ``names``."""
    runs, pending, said = {}, list(reversed(names)), set()
    while pending:
        for name in list(pending):
            if name in gone and name not in said:
                said.add(name)
                log(f"running solutions/{name}/{name}.ipynb unless another process is (not in the cache for its "
                    "current content) ...")
            got = _run(name, root, run_id, wait=False)
            if got is not None:
                runs[name] = got
                pending.remove(name)
        if pending:  # all that is left is being run elsewhere: wait for the first
            runs[pending[0]] = _run(pending[0], root, run_id, wait=True)
            pending.pop(0)
    return {name: runs[name] for name in names}


def build(dest: Path = ROOT / DEFAULT_DIR, root: Path = ROOT, *, offline: bool = False,
          names: list[str] | None = None, log=print, work: Path | None = None, run_id: str | None = None) -> dict:
    """Build the site into ``dest``; return what was done (per lesson: ran or cached, the page's figures).

    ``work`` holds the Sphinx project and its saved state between builds (default
    ``build/site/`` in the course); ``run_id`` marks the notebook runs this build makes, as
    the test suite's own runs are marked (:func:`.execute.executed`).
    """
    started = time.monotonic()
    known = all_lessons(root)
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise SiteError(f"no such lesson(s): {', '.join(unknown)}; the lessons are: {', '.join(known)}.")
    names = names or known
    if not names:
        raise SiteError(f"{root / 'solutions'} holds no lessons (solutions/<name>/<name>.ipynb): nothing to build.")
    gone = execute.missing(names, root)
    if offline and gone:
        raise SiteError(
            f"--offline builds from the cache only, and the cache ({execute.cache_dir(root)}) has no run of "
            f"{len(gone)} lesson(s) as they are now: {', '.join(gone)}. Run `make site` (without OFFLINE=1) to run "
            "them and fill the cache, or `make test`, whose notebook tests fill it too.")
    if colab.REPOSITORY == colab.PLACEHOLDER:
        log(f"warning: REPOSITORY in autograder/notebooks/colab.py is still the placeholder {colab.PLACEHOLDER}: the "
            "pages' 'Open in Colab' links lead nowhere until you set it (docs/instructors.md, Publishing the course).")
    work = work or root / "build" / "site"
    src = work / "src"
    report: dict = {"lessons": {}}
    runs = _runs(names, gone, root, run_id, log)
    for name in names:
        t = time.monotonic()
        ran_nb, run = runs[name]
        learner = nbformat.read(root / "course" / name / f"{name}.ipynb", as_version=4)
        page, stats = pages.lesson_page(name, learner, ran_nb, root)
        _write_if_changed(src / "lessons" / f"{name}.ipynb", nbformat.writes(page))
        _write_if_changed(src / "_extra" / "notebooks" / f"{name}.ipynb",
                          (root / "course" / name / f"{name}.ipynb").read_text(encoding="utf-8"))
        report["lessons"][name] = {**stats, "ran": run.ran, "seconds": round(time.monotonic() - t, 1)}
        log(f"{name}: {'ran in %.0f s' % run.seconds if run.ran else 'from the cache'}; "
            f"{stats['shown']} cells with outputs, {stats['figures']} figure(s), "
            f"{stats['differ'] + stats['use_answer'] + stats['author']} code cells without (answers and what uses them)")
    for stale in (src / "lessons").glob("*.ipynb"):
        if stale.stem not in names:
            stale.unlink()
    home = (_HERE / "home.md").read_text(encoding="utf-8")
    home = (home.replace("@ROAD@", _road(root, names))
            .replace("@CLONE@", f"{colab.REPOSITORY}.git {CLONE_FOLDER}")
            .replace("@FOLDER@", CLONE_FOLDER)
            .replace("@TOC@", "\n".join(f"lessons/{n}" for n in names)))
    _write_if_changed(src / "index.md", home)
    mathjax = _mathjax_dir()
    _write_if_changed(src / "conf.py", _conf(mathjax is not None))
    _write_if_changed(src / "_static" / "course.css", CSS)
    t = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-d", str(work / "doctrees"),
                           str(src), str(dest)], cwd=root, capture_output=True, text=True)
    if done.returncode:
        raise SiteError(f"sphinx-build failed (exit {done.returncode}) on {src}:\n{done.stderr[-3000:]}\n"
                        "Is the site extra installed? `.venv/bin/pip install -e '.[site]'` (make site does it).")
    if (dest / "_sources").is_dir() and not any((dest / "_sources").iterdir()):
        (dest / "_sources").rmdir()  # left empty: pages' sources are not copied (html_copy_source)
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    report["sphinx_seconds"] = round(time.monotonic() - t, 1)
    if mathjax is None:
        log("warning: jupyter-server-mathjax is not installed, so formulas show as LaTeX source; "
            "install the site extra: `.venv/bin/pip install -e '.[site]'`")
    else:
        _copy_mathjax(mathjax, dest / "_static" / "mathjax")
    (dest / ".nojekyll").write_text("")  # GitHub Pages: serve _static/ and _images/ as they are (no Jekyll)
    found = leaks.scan(dest, root, names)
    if found:
        raise SiteError("the site shows answers, so it was not finished; remove " + str(dest) + " before publishing "
                        "anything. Found:\n" + "\n".join(f"  {f}" for f in found[:20]))
    report["warnings"] = warnings
    report["seconds"] = round(time.monotonic() - started, 1)
    log(f"site built in {report['seconds']:.0f} s (Sphinx {report['sphinx_seconds']:.0f} s): {dest}/index.html"
        + (f"; Sphinx warned {len(warnings)} time(s):\n  " + "\n  ".join(warnings[:10]) if warnings else "")
        + f"\nto read it: python3 -m http.server 8000 --bind 127.0.0.1 --directory {dest}, then open http://127.0.0.1:8000/")
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder site", description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", nargs="?", default=str(DEFAULT_DIR), help="where the site goes (default dist/site)")
    parser.add_argument("--offline", action="store_true",
                        help="run no notebook: build from the cache only, and fail naming the lessons it lacks")
    parser.add_argument("--lessons", nargs="+", metavar="LESSON", help="build only these lessons (default: all)")
    parser.add_argument("--archive", action="store_true", help="also pack the site into DIR.tar.gz (make release SITE=1)")
    args = parser.parse_args(argv)
    dest = Path(args.dest).resolve()
    try:
        build(dest, offline=args.offline, names=args.lessons)
    except (SiteError, pages.PageError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.archive:
        archive = dest.with_name(dest.name + ".tar.gz")
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(dest, arcname=dest.name)
        print(f"packed {archive} ({archive.stat().st_size / 1e6:.1f} MB)")
    return 0
