"""The documentation's links: does every relative link and anchor lead somewhere?

Reads README.md, docs/*.md and bench/README.md as files (no network, no imports of the
course), so it runs in well under a second. Anchors are matched against heading slugs as
GitHub makes them: lower case, punctuation dropped, spaces turned into hyphens, a
repeated heading numbered -1, -2, ...
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md")])
README_MAX_LINES = 200

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?")


def _prose(text: str) -> list[str]:
    """The lines of a Markdown page outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it.

    >>> slug("Persistent ranks: `%%distributed` and `Cluster`")
    'persistent-ranks-distributed-and-cluster'
    >>> slug("Autograding one learner's submission")
    'autograding-one-learners-submission'
    """
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading counts by its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a page offers: its headings' slugs, numbered when repeated."""
    seen: dict[str, int] = {}
    found = set()
    for line in _prose(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match[2])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link and image on a page, outside code blocks."""
    out = []
    text = path.read_text(encoding="utf-8")
    lines, fenced = text.splitlines(), False
    for number, line in enumerate(lines, 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        prose = re.sub(r"`[^`]*`", "", line)  # a link inside inline code is text, not a link
        out += [(number, target) for target in _LINK.findall(prose) + _IMAGE.findall(prose)]
    return out


def _relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)  # not http:, https:, mailto:, ...


def test_the_pages_exist():
    """Are the pages the README points to there (docs/ holds at least the four of issue 26)?"""
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    for page in ("README.md", "bench/README.md", "docs/helpers.md", "docs/instructors.md",
                 "docs/architecture.md"):
        assert page in names, f"{page} is missing"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page: Path):
    """Does every relative link on the page name a file that exists, and every #anchor a heading there?"""
    broken = []
    for number, target in links(page):
        if not _relative(target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            broken.append(f"{where}: no such file {dest}")
            continue
        if ROOT not in dest.parents and dest != ROOT:
            broken.append(f"{where}: leads outside the repository")
            continue
        if anchor:
            if dest.suffix != ".md":
                broken.append(f"{where}: an anchor into a file that is not Markdown")
            elif anchor not in anchors(dest):
                broken.append(f"{where}: {dest.relative_to(ROOT)} has no heading with the anchor "
                              f"#{anchor} (it has: {', '.join(sorted(anchors(dest)))})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_is_short_and_names_only_pages_that_exist():
    """Is the README at most 200 lines, and does every .md page it names (linked or not) exist?"""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES, (
        f"README.md has {len(text.splitlines())} lines; keep it to {README_MAX_LINES} and move details "
        "to a page in docs/")
    named = set(re.findall(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.md)\b", text))
    assert {"docs/helpers.md", "docs/instructors.md", "docs/architecture.md", "bench/README.md"} <= named, named
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, f"README.md names pages that do not exist: {missing}"


def test_readme_keeps_the_two_commands():
    """Does the README still give the two commands, `make lab` and `make test` (CI runs the latter)?"""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    assert "make lab" in commands and "make test" in commands, commands


def test_the_slug_rules():
    """Are anchors made as GitHub makes them, repeated headings included?"""
    assert (slug("Launchers from a cell: `run`, `start`, `export_script`")
            == "launchers-from-a-cell-run-start-export_script")
    assert slug("For instructors: grading with nbgrader") == "for-instructors-grading-with-nbgrader"
    assert slug("A [linked](x.md) heading") == "a-linked-heading"
