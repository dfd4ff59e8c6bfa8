"""The course website (`make site`): built for real with Sphinx, read for real in Chromium, searched for answers.

The module builds the whole site once (``site`` fixture) into a temporary folder, from the
executed-notebook cache that `tests/test_notebooks.py` fills in the same test run: a lesson
that test already ran is not run again (both go through autograder/site/execute.py under a
lock per lesson, marked with this run's id); one it has not run yet is run here, once. The
build itself (Sphinx, MathJax copied, the scan for answers) takes about 6 s on 2 cores.

The browser tests drive Debian's chromium through the browser fixture of tests/conftest.py (skipped without it,
saying why; failed instead with ``COURSE_REQUIRE_BROWSER=1``), over a loopback HTTP server
on a free port, and leave screenshots of the home page and lesson 04 beside that module's.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import nbformat
import pytest

from autograder.notebooks import colab
from autograder.site import execute, leaks
from autograder.site.website import build
from autograder.site.pages import figure_alt, tainted_cells
from conftest import ROOT, suite_run_id

LESSONS = sorted(p.name for p in (ROOT / "solutions").iterdir() if (p / f"{p.name}.ipynb").is_file())


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The whole site, built as `make site` builds it: ``(site folder, Sphinx project folder, build report)``."""
    tmp = tmp_path_factory.mktemp("site")
    started = time.monotonic()
    report = build(tmp / "site", ROOT, work=tmp / "work", run_id=suite_run_id(), log=lambda *a: None)
    ran = [name for name, info in report["lessons"].items() if info["ran"]]
    print(f"site built in {time.monotonic() - started:.1f} s; lessons run for it (not yet run in this test run): {ran}")
    return tmp / "site", tmp / "work" / "src", report


# --------------------------------------------------------------------------- what the build makes


@pytest.mark.slow
def test_site_has_a_home_page_a_page_per_lesson_and_the_learner_notebooks(site):
    """Does the site hold index.html, search.html, one page per lesson, and each learner notebook unchanged (no
    outputs) for download?"""
    folder, _, report = site
    assert (folder / "index.html").is_file() and (folder / "search.html").is_file()
    assert sorted(report["lessons"]) == LESSONS
    for lesson in LESSONS:
        assert (folder / "lessons" / f"{lesson}.html").is_file(), lesson
        shipped = folder / "notebooks" / f"{lesson}.ipynb"
        assert shipped.read_bytes() == (ROOT / "course" / lesson / f"{lesson}.ipynb").read_bytes(), lesson
        nb = json.loads(shipped.read_text())
        assert not [c for c in nb["cells"] if c.get("outputs")], f"{lesson}: the download has outputs"
    home = (folder / "index.html").read_text()
    for words in ("The road through the lessons", "Start on your laptop", "Start on Google Colab",
                  "Start on a GPU workstation"):
        assert words in home, words
    assert report["warnings"] == [], report["warnings"]


@pytest.mark.slow
def test_pages_show_outputs_of_a_real_run_but_none_for_answers(site):
    """Does each page show outputs where the learner's cell is the instructor's, and none on a stub or on a cell
    that uses an answer, with lesson 04's pictures among them?"""
    _, src, report = site
    total_figures = 0
    for lesson in LESSONS:
        page = nbformat.read(src / "lessons" / f"{lesson}.ipynb", as_version=4)
        ran = execute.cached(lesson, ROOT)[0]
        hidden = tainted_cells(ran)
        twins = {c.get("id"): c for c in ran.cells}
        shown = 0
        for cell in page.cells:
            if cell.cell_type != "code":
                continue
            if 'raise NotImplementedError("Exercise' in cell.source or cell.get("id") in hidden:
                assert not cell.outputs, f"{lesson}: cell {cell.get('id')} is or uses an answer but shows output"
            twin = twins.get(cell.get("id"))
            if twin is None or twin.source != cell.source:
                assert not cell.outputs, f"{lesson}: cell {cell.get('id')} differs from the instructor's but has output"
            shown += bool(cell.outputs)
        assert shown >= 5, f"{lesson}: only {shown} cells with outputs"
        total_figures += report["lessons"][lesson]["figures"]
    assert report["lessons"]["04-ring-all-reduce"]["figures"] >= 3
    assert total_figures >= 40, total_figures


@pytest.mark.slow
def test_no_solution_line_or_hidden_test_anywhere_in_the_site(site, tmp_path):
    """Does no file of the site hold a line of a solution or of a hidden test, and would the scan find one planted?"""
    folder, _, _ = site
    secrets = leaks.secret_lines(ROOT, LESSONS)
    kinds = {kind for _, kind, _ in secrets}
    assert len(secrets) > 200 and kinds == {"solution", "hidden test"}, (len(secrets), kinds)
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert len(files) > 100
    assert leaks.scan(folder, ROOT, LESSONS) == []
    # The scan finds an answer in highlighted HTML (split into spans, entities escaped) and in a JSON string.
    lesson, kind, line = next(s for s in secrets if s[1] == "solution" and "(" in s[2] and "=" in s[2])
    planted = tmp_path / "planted"
    planted.mkdir()
    words = line.replace("(", " (").split(" ")
    (planted / "page.html").write_text("<pre>" + " ".join(f'<span class="n">{w.replace("<", "&lt;")}</span>'
                                                        for w in words) + "</pre>")
    (planted / "data.json").write_text(json.dumps({"cells": [{"source": [f"x = 1\n{secrets[-1][2]}\n"]}]}))
    found = leaks.scan(planted, ROOT, LESSONS)
    assert any(f.startswith("page.html") for f in found) and any(f.startswith("data.json") for f in found), found


def test_a_cell_that_uses_an_answer_is_tainted_and_one_that_rebinds_is_not():
    """Is a cell's output hidden when it reads a name a solution cell defines (directly or through an earlier cell),
    and kept when it only mentions it in a comment or string or binds the name itself?"""
    cells = [
        ("solution", "def ring_allreduce(t):\n    ### BEGIN SOLUTION\n    return t\n    ### END SOLUTION"),
        ("uses", "result = launch(lambda r, w: ring_allreduce(r))\nprint(result)"),
        ("through", "print(result[0])"),
        ("comment", "# ring_allreduce comes later\nprint('ring_allreduce')"),
        ("rebinds", "result = launch(lambda r, w: r)\nprint(result)"),
        ("magic", "%%distributed\nprint(ring_allreduce(x))"),
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src, id=name) for name, src in cells])
    nb.cells[0].metadata["nbgrader"] = {"solution": True}
    assert tainted_cells(nb) == {"solution", "uses", "through", "magic"}
    assert figure_alt('ax.set_title("Bytes per rank")\nfig.suptitle(f"{p} ranks")', {}) == "Figure: Bytes per rank"
    assert figure_alt("plt.plot(x)", {"alt": " A line. "}) == "A line." and figure_alt("plt.plot(x)", {}) is None


# --------------------------------------------------------------------------- the cache


def _course_copy(tmp: Path, lessons: list[str]) -> Path:
    """What cache keys read: the lessons' instructor notebooks, helpers/ and the autograder's lesson code."""
    root = tmp / "course"
    for lesson in lessons:
        shutil.copytree(ROOT / "solutions" / lesson, root / "solutions" / lesson)
    shutil.copytree(ROOT / "helpers", root / "helpers", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "autograder", root / "autograder", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_cache_key_follows_what_changes_the_outputs(tmp_path):
    """Does editing one lesson change that lesson's key only, editing the helpers every key, and a cell's alt text
    or the site's own code none?"""
    lessons = ["00-getting-started", "04-ring-all-reduce"]
    root = _course_copy(tmp_path, lessons)
    keys = lambda: [execute.cache_key(lesson, root) for lesson in lessons]  # noqa: E731
    before = keys()
    assert before == [execute.cache_key(lesson, ROOT) for lesson in lessons]  # a copy keys as the checkout
    path = root / "solutions" / lessons[1] / f"{lessons[1]}.ipynb"
    nb = json.loads(path.read_text())
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["metadata"]["site"] = {"alt": "a new description"}
    path.write_text(json.dumps(nb))
    (root / "autograder" / "site" / "pages.py").write_text("# edited\n", encoding="utf-8")
    assert keys() == before
    code["source"] = "x = 1  # edited\n" + "".join(code["source"])
    path.write_text(json.dumps(nb))
    edited = keys()
    assert edited[0] == before[0] and edited[1] != before[1]
    with open(root / "helpers" / "launcher.py", "a") as f:
        f.write("\n# edited\n")
    assert all(a != b for a, b in zip(keys(), edited))


TINY = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import os, time\ntime.sleep(1)\nprint(os.getpid())")])


def test_two_processes_that_want_the_same_lesson_run_it_once(tmp_path):
    """When two processes (as two pytest-xdist workers) ask for the same notebook at once, does one run it while
    the other waits and reads its result, does a later run with another run id run it again, and does a caller
    that will not wait (the site build) get None at once while the lesson's lock is held?"""
    root = tmp_path / "course"
    (root / "solutions" / "99-tiny").mkdir(parents=True)
    nbformat.write(TINY, root / "solutions" / "99-tiny" / "99-tiny.ipynb")
    with execute._locked(execute.cache_dir(root) / "99-tiny"):
        assert execute.executed("99-tiny", root, wait=False) is None
    script = ("import json, sys\nfrom pathlib import Path\nfrom autograder.site.execute import executed\n"
              "nb, run = executed('99-tiny', Path(sys.argv[1]), reuse='this-run', run_id=sys.argv[2])\n"
              "print(json.dumps([run.ran, nb.cells[0].outputs[0]['text'].strip()]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(execute.CACHE_ENV, None)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(root), "run-1"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r[0] for r in results) == [False, True], results
    assert results[0][1] == results[1][1]  # the same kernel's pid: one run, read twice
    again = subprocess.run([sys.executable, "-c", script, str(root), "run-2"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and json.loads(again.stdout.strip().splitlines()[-1])[0] is True, again.stderr[-2000:]


def test_offline_build_with_a_cold_cache_names_the_missing_lessons(tmp_path):
    """Does `python -m autograder site --offline` with an empty cache stop before building, name every lesson it
    lacks, and say which command fills the cache?"""
    env = {**os.environ, execute.CACHE_ENV: str(tmp_path / "empty-cache")}
    done = subprocess.run([sys.executable, "-m", "autograder", "site", "--offline", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"has no run of {len(LESSONS)} lesson(s)" in done.stderr and "`make site`" in done.stderr, done.stderr
    assert all(lesson in done.stderr for lesson in LESSONS), done.stderr
    assert not (tmp_path / "site").exists()


# --------------------------------------------------------------------------- in a browser


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on 127.0.0.1 (a free port chosen by the kernel), for the module."""
    handler = type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(site[0])))
    server.handle_error = lambda request, address: None  # a browser that drops a connection it no longer needs
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


IMAGES = "Array.from(document.images).map(i => ({src: i.currentSrc, width: i.naturalWidth, alt: i.getAttribute('alt')}))"
LINKS = "Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"


@pytest.mark.slow
@pytest.mark.browser
def test_every_page_in_chromium_images_load_with_alt_text_links_resolve(site, served, browser, shots):
    """On the home page and every lesson page, does every image load (naturalWidth > 0) with alt text, every link
    within the site answer 200, MathJax typeset the formulas, nothing get fetched from outside the site, and do the
    Colab and download links point where they should?"""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    outside: list[str] = []
    page.on("request", lambda r: outside.append(r.url) if not r.url.startswith((served, "data:", "blob:", "about:")) else None)
    failed: list[str] = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    checked: set[str] = set()
    weights = {}
    try:
        for path in ["index.html", *(f"lessons/{lesson}.html" for lesson in LESSONS)]:
            page.goto(f"{served}/{path}", wait_until="load")
            page.wait_for_load_state("networkidle")
            images = page.evaluate(IMAGES)
            figures = site[2]["lessons"][Path(path).stem]["figures"] if path.startswith("lessons/") else 0
            assert len(images) >= figures, f"{path}: {len(images)} images, but the build put {figures} figures there"
            broken = [i["src"] for i in images if not i["width"]]
            assert not broken, f"{path}: images that did not load: {broken}"
            no_alt = [i["src"] for i in images if not (i["alt"] or "").strip()]
            assert not no_alt, f"{path}: images without alt text: {no_alt}"
            for href in page.evaluate(LINKS):
                target = href.split("#", 1)[0]
                if target.startswith(served) and target not in checked:
                    checked.add(target)
                    assert _status(target) == 200, f"{path} links to {href}, which answers {_status(target)}"
            if path.startswith("lessons/"):
                lesson = Path(path).stem
                colab_link = page.locator("a.course-colab")
                assert colab_link.get_attribute("href") == colab.colab_url(lesson)
                assert colab_link.inner_text() == "Open in Colab"
                download = page.locator("a.course-download")
                url = urllib.parse.urljoin(page.url, download.get_attribute("href"))
                with urllib.request.urlopen(url, timeout=10) as response:
                    assert response.read() == (ROOT / "course" / lesson / f"{lesson}.ipynb").read_bytes()
            if path == "lessons/04-ring-all-reduce.html":
                page.wait_for_function("document.querySelectorAll('.MathJax, .MathJax_Display').length >= 20",
                                       timeout=60_000)
                weights = page.evaluate("({html: performance.getEntriesByType('navigation')[0].encodedBodySize, "
                                        "images: performance.getEntriesByType('resource').filter(e => "
                                        "e.name.includes('/_images/')).reduce((s, e) => s + e.encodedBodySize, 0), "
                                        "all: performance.getEntriesByType('resource').reduce((s, e) => s + e.encodedBodySize, 0)})")
                page.screenshot(path=str(shots / "site-lesson-04.png"))
                page.locator("main img").first.scroll_into_view_if_needed()
                page.screenshot(path=str(shots / "site-lesson-04-figure.png"))
            if path == "index.html":
                page.screenshot(path=str(shots / "site-home.png"))
        assert not outside, f"the pages fetched from outside the site: {sorted(set(outside))[:10]}"
        assert not failed, f"requests the site could not answer: {sorted(set(failed))[:10]}"
        assert len(checked) > len(LESSONS) + 2
        print(f"lesson 04 page weight: HTML {weights['html']:,} B + images {weights['images']:,} B; "
              f"with scripts, styles and fonts {weights['html'] + weights['all']:,} B")
    finally:
        context.close()


@pytest.mark.slow
@pytest.mark.browser
def test_search_finds_ring_all_reduce(served, browser):
    """Does the search box, typed into as a reader would, list lesson 04 among the pages for "ring all-reduce"?"""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"{served}/index.html", wait_until="networkidle")
        page.keyboard.press("Control+k")  # the theme's shortcut, shown on its search button
        box = page.locator("input[name='q']:visible").first
        box.fill("ring all-reduce")
        box.press("Enter")
        page.wait_for_url("**/search.html?q=ring*")
        page.wait_for_function("(document.querySelector('#search-results .search-summary') || {}).textContent"
                               "?.includes('found')", timeout=30_000)  # Sphinx lists results as it finds them
        results = page.locator("#search-results a")
        hrefs = [results.nth(i).get_attribute("href") for i in range(results.count())]
        assert any("04-ring-all-reduce" in h for h in hrefs), hrefs
    finally:
        context.close()
