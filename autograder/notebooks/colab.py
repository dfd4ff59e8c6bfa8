"""The two cells every learner notebook starts with: an "Open in Colab" badge and the Colab set-up.

``make course`` puts them at the top of each notebook in ``course/`` (the nbgrader
preprocessor :class:`autograder.notebooks.preprocessors.AddColabCells` calls :func:`colab_cells`), so
the text lives here once and ``solutions/`` stays free of it.

On Colab the set-up cell clones the course from :data:`REPOSITORY`, installs the helpers
with pip (Colab's own torch is kept: it satisfies the course's ``torch>=2.4``), makes
``import helpers`` work without a restart, and moves into the lesson's folder. Anywhere
else it does nothing. Two environment variables let an instructor try the cell without
Colab's servers: ``COURSE_REPO`` (another address to clone, for example ``file:///path``)
and ``COURSE_HOME`` (where the clone goes; default ``distributed-course`` in the folder the
notebook starts in, which is ``/content`` on Colab).

Publishing the course (docs/instructors.md): :data:`REPOSITORY` is the learner distribution, the repository
published from what ``make release`` builds (course, helpers and self-checks, without
solutions or hidden tests), never this instructor repository. Set it to that repository's
GitHub address, then run ``make course`` and ``make release`` again, so that the
notebooks inside the release carry the address too.

Example::

    >>> badge, setup = colab_cells("04-ring-all-reduce")
    >>> "colab.research.google.com/github/" in badge["source"]
    True
    >>> 'if "google.colab" in sys.modules' in setup["source"]
    True
"""

from __future__ import annotations

import re

__all__ = ["REPOSITORY", "PLACEHOLDER", "BRANCH", "BADGE_ID", "SETUP_ID", "colab_cells", "colab_url"]

#: The address REPOSITORY holds until an instructor sets it: no course is published there, so
#: `make release` refuses to build while REPOSITORY (or a notebook's Colab cells) still names it.
PLACEHOLDER = "https://github.com/distributed-course/distributed-course"
# Where learners' Colab runtimes clone the course from: the learner distribution built by
# `make release` and published as its own repository. Set it before you publish, then run
# `make course` (and `make release` again).
REPOSITORY = PLACEHOLDER
BRANCH = "main"

# Cell ids: the preprocessor replaces cells with these ids instead of adding them twice.
BADGE_ID = "colab-badge"
SETUP_ID = "colab-setup"

_SETUP = '''\
# Google Colab only: fetch the course and install its helpers (about a minute, once per
# runtime). Anywhere else this cell does nothing, so it is safe to run.
import os, subprocess, sys
if "google.colab" in sys.modules:
    home = os.environ.setdefault("COURSE_HOME", os.path.abspath("distributed-course"))
    if not os.path.isdir(home):
        repo = os.environ.get("COURSE_REPO", "{repository}")
        if subprocess.run(["git", "clone", "--quiet", "--depth=1", "--branch={branch}", repo, home]).returncode:
            raise RuntimeError(f"Could not clone the course from {{repo}}. Ask your instructor for the course's "
                               "address, set os.environ['COURSE_REPO'] to it, and run this cell again.")
        # Colab's torch already satisfies the course, so pip keeps it.
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--editable", home], check=True,
                       env=dict(os.environ, PIP_ROOT_USER_ACTION="ignore"))
    sys.path.insert(0, home)  # `import helpers` works now, without restarting the runtime
    os.chdir(os.path.join(home, "course", "{lesson}"))
    print(f"Colab: the course is installed in {{home}}; working in {{os.getcwd()}}.")
'''


def colab_url(lesson: str, repository: str = REPOSITORY, branch: str = BRANCH) -> str:
    """The address that opens ``course/<lesson>/<lesson>.ipynb`` of a GitHub repository in Colab."""
    m = re.match(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?$", repository)
    if not m:
        raise ValueError(
            f"REPOSITORY in autograder/notebooks/colab.py is {repository!r}, which is not a GitHub address "
            "(https://github.com/OWNER/NAME): Colab opens notebooks from GitHub only. Set it to "
            "your course's GitHub repository and run `make course` again."
        )
    owner, name = m.groups()
    return f"https://colab.research.google.com/github/{owner}/{name}/blob/{branch}/course/{lesson}/{lesson}.ipynb"


def colab_cells(lesson: str) -> tuple[dict, dict]:
    """The badge (markdown) and set-up (code) cells for ``lesson``, as nbformat-4 cell dicts."""
    badge = {
        "cell_type": "markdown",
        "id": BADGE_ID,
        "metadata": {},
        "source": (
            f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(lesson)})\n\n"
            "On Google Colab, run the next cell first: it installs the course. On your own machine "
            "(`make lab`) it does nothing."
        ),
    }
    setup = {
        "cell_type": "code",
        "execution_count": None,
        "id": SETUP_ID,
        "metadata": {},
        "outputs": [],
        "source": _SETUP.format(repository=f"{REPOSITORY}.git", branch=BRANCH, lesson=lesson).rstrip("\n"),
    }
    return badge, setup
