"""The class summary after grading: per lesson and part, who passed, what failed most, who was slowest.

:func:`summarise` reads a grading run's record (see :mod:`autograder.grading.grade`) and writes
``class-summary.csv`` (one row per graded part) and ``class-summary.html`` (the same
tables, plus the slowest submissions and those that could not be graded) into the
folder given, and returns the text printed in the terminal.

Failure messages are grouped by their first line with the numbers taken out, so "rank 2
returned 7" and "rank 3 returned 9" count as one kind of failure; each group is shown by
one real message of it (:func:`example_line`), never by the pattern. Submissions that could
not be graded are listed apart, by whose failure it was (the grading machinery's, or the
learner's: a notebook file that cannot be read), each with the line that says what went
wrong and its log; so are learners whose notebook's kernel died while it ran.

Example::

    >>> record = {"sandbox": True, "jobs": 2, "seconds": 30.0, "submissions": [
    ...     {"student": "ana", "lesson": "00-getting-started", "seconds": 12.0, "status": "ok", "error": None,
    ...      "parts": [{"exercise": "0.1", "part": "hello", "points": 1, "score": 1.0, "message": None}]},
    ...     {"student": "bo", "lesson": "00-getting-started", "seconds": 15.0, "status": "ok", "error": None,
    ...      "parts": [{"exercise": "0.1", "part": "hello", "points": 1, "score": 0.0,
    ...                 "message": "hello: on 2 ranks, rank 1 returned 'hi'",
    ...                 "text": "on 2 ranks, rank 1 returned 'hi'"}]}]}
    >>> rows = part_rows(record)
    >>> rows[0]["passed"], rows[0]["graded"], rows[0]["failures"][0][0]
    (1, 2, "on N ranks, rank N returned 'hi'")
"""

from __future__ import annotations

import csv
import html
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

__all__ = ["summarise", "part_rows", "failure_kind", "example_line", "CSV_NAME", "HTML_NAME"]

CSV_NAME = "class-summary.csv"
HTML_NAME = "class-summary.html"
TOP_FAILURES = 3
SLOWEST = 5


def example_line(text: str) -> str:
    """A failure's first line, as the learner read it after the part's name.

    ``text`` is the part's failure without the part's name (a record's ``"text"``, from
    :attr:`autograder.kit.harness.GradingFailure.text`).

    >>> example_line("on 4 ranks, rank 2 returned 1.5 instead of 6\\nmore")
    'on 4 ranks, rank 2 returned 1.5 instead of 6'
    """
    text = (text or "").strip()
    return text.splitlines()[0] if text else "no message"


def failure_kind(text: str) -> str:
    """A failure's first line with every number as N: failures of one kind share it.

    >>> failure_kind("on 4 ranks, rank 2 returned 1.5 instead of 6")
    'on N ranks, rank N returned N instead of N'
    """
    kind = re.sub(r"(?<!Exercise )\b\d+(\.\d+)?(e-?\d+)?", "N", example_line(text))
    return kind if len(kind) <= 160 else kind[:157] + "..."


def part_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per lesson and graded part: points, graded, passed, and the commonest failures with an example."""
    parts: dict[tuple[str, str, str], dict[str, Any]] = {}
    kinds: dict[tuple[str, str, str], Counter] = defaultdict(Counter)
    examples: dict[tuple[str, str, str, str], str] = {}
    for run in record.get("submissions", []):
        if run.get("status") != "ok":
            continue
        for p in run.get("parts", []):
            key = (run["lesson"], p["exercise"], p["part"])
            row = parts.setdefault(key, {"lesson": run["lesson"], "exercise": p["exercise"], "part": p["part"],
                                         "points": p["points"], "graded": 0, "passed": 0, "failures": []})
            row["graded"] += 1
            if p["score"] is not None and p["points"] is not None and float(p["score"]) >= float(p["points"]):
                row["passed"] += 1
            else:
                text = (p.get("text") or "").strip()
                kind = failure_kind(text)
                kinds[key][kind] += 1
                examples.setdefault((*key, kind), text)
    for key, row in parts.items():
        row["failures"] = [(kind, n, examples[(*key, kind)]) for kind, n in kinds[key].most_common(TOP_FAILURES)]
    return [parts[k] for k in sorted(parts, key=lambda k: (k[0], tuple(int(x) for x in k[1].split(".")), k[2]))]


def _slowest(record: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(record.get("submissions", []), key=lambda r: -r.get("seconds", 0))[:SLOWEST]


def _shown(n: int, example: str, width: int = 110) -> str:
    """``3x on 4 ranks, rank 2 returned 1.5 instead of 6 (and 2 like it)``: one real message for the group."""
    line = example_line(example)
    line = line if len(line) <= width else line[:width - 3] + "..."
    return f"{n}x {line}" + (f" (and {n - 1} like it)" if n > 1 else "")


def _not_graded(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in record.get("submissions", []) if r.get("status") != "ok"]


def _whose(run: dict[str, Any]) -> str:
    return {"learner": "the learner's", "infrastructure": "the grading machinery's"}.get(run.get("failure") or "",
                                                                                         "unknown")


def _failure_line(run: dict[str, Any]) -> str:
    """``bo/04-ring-all-reduce: the grading machinery's failure after 2 tries: bwrap: ... (log: ...)``."""
    tries = run.get("tries", 1)
    text = (f"{run['student']}/{run['lesson']}: {_whose(run)} failure after {tries} tr{'ies' if tries != 1 else 'y'}: "
            f"{run.get('error')}")
    return text + (f" (log: {run['log']})" if run.get("log") else "")


def _write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["lesson", "exercise", "part", "points", "graded", "passed", "pass_rate", "common_failures"])
        for r in rows:
            rate = f"{r['passed'] / r['graded']:.2f}" if r["graded"] else ""
            failures = " | ".join(_shown(n, example, 200) for kind, n, example in r["failures"])
            out.writerow([r["lesson"], r["exercise"], r["part"], r["points"], r["graded"], r["passed"], rate, failures])


def _write_html(record: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> None:
    e = html.escape
    parts = []
    for r in rows:
        failures = "".join(f"<li><b>{n}&times;</b> {e(example_line(example))}"
                           f"{f' (and {n - 1} like it)' if n > 1 else ''}<details><summary>whole message</summary>"
                           f"<pre>{e(example)}</pre></details></li>" for kind, n, example in r["failures"])
        parts.append(f"<tr><td>{e(r['lesson'])}</td><td>{e(r['exercise'])}</td><td>{e(r['part'])}</td>"
                     f"<td>{r['points']}</td><td>{r['passed']} / {r['graded']}</td><td><ul>{failures}</ul></td></tr>")
    slow = "".join(f"<tr><td>{e(r['student'])}</td><td>{e(r['lesson'])}</td><td>{r['seconds']:.1f} s</td></tr>"
                   for r in _slowest(record))
    failed = "".join(f"<li>{e(_failure_line(r))}</li>" for r in _not_graded(record))
    noted = "".join(f"<li>{e(r['student'])}/{e(r['lesson'])}: {e(' '.join(r.get('notes', [])))}</li>"
                    for r in record.get("submissions", []) if r.get("status") == "ok" and r.get("notes"))
    sandbox = ("every submission ran in the grading sandbox" if record.get("sandbox")
               else "<b>without the sandbox</b> (--no-sandbox): learners' code ran with the instructor's rights")
    path.write_text(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Class summary</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top;text-align:left}}ul{{margin:0;padding-left:1.2em}}</style>
</head><body>
<h1>Class summary</h1>
<p>{len(record.get('submissions', []))} submissions graded in {record.get('seconds', 0):.0f} s,
{record.get('jobs', 1)} at a time; {sandbox}.</p>
<h2>Graded parts</h2>
<table><tr><th>lesson</th><th>exercise</th><th>part</th><th>points</th><th>passed</th><th>commonest failures</th></tr>
{''.join(parts)}</table>
<h2>Slowest submissions</h2>
<table><tr><th>student</th><th>lesson</th><th>time</th></tr>{slow}</table>
<h2>Could not be graded</h2>
<ul>{failed or '<li>none</li>'}</ul>
<h2>Graded, with a note</h2>
<ul>{noted or '<li>none</li>'}</ul>
</body></html>
""")


def summarise(record: dict[str, Any], folder: Path) -> str:
    """Write class-summary.csv and .html into ``folder``; return the summary as text for the terminal."""
    rows = part_rows(record)
    folder = Path(folder)
    _write_csv(rows, folder / CSV_NAME)
    _write_html(record, rows, folder / HTML_NAME)
    lines = ["Class summary" + ("" if record.get("sandbox") else
                               " (graded WITHOUT the sandbox: --no-sandbox was given)")]
    for r in rows:
        lines.append(f"  {r['lesson']:<30} {r['exercise']:>4} {r['part']:<22} passed {r['passed']:>3} / {r['graded']:<3}")
        for kind, n, example in r["failures"]:
            lines.append(f"      {_shown(n, example)}")
    lines.append("  Slowest: " + ", ".join(f"{r['student']}/{r['lesson']} {r['seconds']:.0f} s" for r in _slowest(record)))
    for r in record.get("submissions", []):
        if r.get("status") == "ok" and r.get("notes"):
            lines.append(f"  Note, {r['student']}/{r['lesson']}: {r['notes'][0].splitlines()[0]}")
    failed = _not_graded(record)
    if failed:
        lines.append(f"  Could not be graded ({len(failed)}):")
        lines += [f"    {_failure_line(r)}" for r in failed]
    lines.append(f"  Written: {folder / CSV_NAME}, {folder / HTML_NAME}")
    return "\n".join(lines)
