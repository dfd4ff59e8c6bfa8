"""Instructor commands: ``python -m autograder <command>`` (run from the repository root).

  build [LESSON..] regenerate course/ from solutions/ (same as `make course`)
  check            fail if course/ is out of date with solutions/
  grade FOLDER [--jobs N | --scheduler tcp://HOST:8786 | --slurm [KEY=VALUE,...] [--dry-run]]
        [--no-sandbox] [--only-ungraded]
                   autograde every <student>/<lesson>/<lesson>.ipynb in FOLDER on Dask
                   workers: N processes here (default: one per core), a running Dask
                   cluster's, or SLURM jobs' (jobs=, cores=, memory=, walltime=, partition=,
                   account=, directive=; --dry-run prints the job script); each in a
                   bubblewrap sandbox, re-graded in a clean process; write feedback to
                   autograder/feedback/, grades to autograder/grades.csv and the class
                   summary to autograder/class-summary.csv and .html
  collect LESSON [options of grade]
                   nbgrader's collect of LESSON from the exchange (latest whole submission of
                   each learner, into autograder/submitted/; one still being written is left for
                   the next collect), then grade them as `grade` does
                   (autograder/exchange/LESSON is the folder graded); one collect or grade of
                   a course at a time
  release [--allow-colab-placeholder] [DIR]
                   build the learner distribution (course, helpers, self-checks; no answers,
                   no hidden tests) into DIR, default dist/learner-course, and DIR.tar.gz;
                   refused while REPOSITORY in autograder/notebooks/colab.py is the placeholder,
                   unless the flag asks for a draft (its README says Colab does not work)
  site [--offline] [--lessons LESSON..] [DIR]
                   build the learner course as a static website into DIR, default dist/site:
                   learner notebooks with the outputs of a real run of the instructor
                   notebooks (cached by content, in .cache/site), none that give an answer
                   away; --offline runs no notebook and names those missing from the cache
"""

import sys

from .notebooks.generate import main as course_main
from .notebooks.imports import defer_iri_grammar


def main(argv: list[str]) -> int:
    defer_iri_grammar()  # every command reads notebooks: a second of CPU less at its start
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv[0] in ("build", "check"):
        return course_main(argv[:1] if argv[0] == "check" else argv[1:])
    if argv[0] == "grade":
        from .grading.grade import main as grade_main

        return grade_main(argv[1:])
    if argv[0] == "collect":
        from .grading.exchange import main as collect_main

        return collect_main(argv[1:])
    if argv[0] == "release":
        from .release import main as release_main

        return release_main(argv[1:])
    if argv[0] == "site":
        from .site.website import main as site_main

        return site_main(argv[1:])
    print(f"unknown command {argv[0]!r}\n{__doc__}")
    return 2


if __name__ == "__main__":  # not when a worker process of `grade` imports it (spawn)
    raise SystemExit(main(sys.argv[1:]))
