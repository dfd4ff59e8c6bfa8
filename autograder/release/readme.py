"""The learner's README.md: getting the course (git or the archive), working through it, checking
and handing in without asking anyone.

Example::

    >>> text = learner_readme(python="3.10 or newer", env_name="distributed-course", clone=None,
    ...                       archive="learner-course.tar.gz", folder="learner-course", cell_timeout=90)
    >>> "tar -xzf learner-course.tar.gz" in text and "make handin STUDENT=" in text and "Draft" not in text
    True
"""

from __future__ import annotations

__all__ = ["learner_readme", "draft_warning"]

#: The folder ``git clone`` makes, and the one the Colab set-up cell clones into.
CLONE_FOLDER = "distributed-course"


def draft_warning(placeholder: str) -> str:
    """The note at the top of a release built while the Colab address was the placeholder."""
    return (
        "> **Draft: the *Open in Colab* badges do not work in this copy.** It was built while the\n"
        f"> course's Colab address was still the placeholder <{placeholder}>, which holds no course:\n"
        "> each notebook's badge and first cell point there. Use `git clone` or the archive below.\n"
        "> Instructors: set `REPOSITORY` in `autograder/notebooks/colab.py` to the published learner\n"
        "> repository, run `make course`, then `make release` again before you publish.\n\n"
    )


def learner_readme(*, python: str, env_name: str, clone: str | None, archive: str, folder: str, cell_timeout: object,
                   placeholder: str | None = None) -> str:
    """The README: ``clone`` is the address to ``git clone`` (None: the learner's instructor gives it),
    ``archive``/``folder`` the ``.tar.gz`` built beside the release and the folder inside it,
    ``cell_timeout`` Validate's per-cell limit, ``placeholder`` the Colab address of a draft (None when set)."""
    address = clone or "<the address your instructor gave you>"
    return f"""\
# Distributed training with PyTorch, in notebooks

{draft_warning(placeholder) if placeholder else ""}\
This course teaches `torch.distributed` by running it. Each lesson is a Jupyter notebook in
`course/`: you start several processes (ranks) from a cell, watch what they send each other,
and build the pieces yourself, from a ring all-reduce to a small DistributedDataParallel,
before launching jobs with `torchrun`. An ordinary CPU is enough; with GPUs the same cells
use NCCL.

## Getting started

Choose one of four ways. The first two need a Linux machine with Python {python},
`make`, and `git` for the first.

**With git**:

```bash
git clone {address} {CLONE_FOLDER}
cd {CLONE_FOLDER}
make lab
```

**From the archive**, if you were given the file `{archive}` instead of an address:

```bash
tar -xzf {archive}
cd {folder}
make lab
```

The first `make lab` builds a virtual environment in `.venv/` (a few minutes: it installs
PyTorch), then opens JupyterLab; later runs start at once. To choose the PyTorch build, say
one for your CUDA version, give its pip arguments the first time, for example
`make lab TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu124"`.
`make clean-venv` deletes the environment so you can start again. Running as root (in a
container or on a rented cloud machine) is fine: `make lab` then starts JupyterLab with
`--allow-root` and says so. On a remote machine, add `LAB_ARGS="--no-browser"` and open the
address JupyterLab prints through an SSH tunnel.

**With conda**, from this folder:

```bash
conda env create -f environment.yml
conda activate {env_name}
jupyter lab --allow-root course/   # --allow-root: also as root (a container, say)
```

**On Google Colab**: open a lesson with the *Open in Colab* badge at its top and run its
first code cell before anything else. It downloads this course into the Colab runtime and
installs it; on your own machine that cell does nothing.

## Working through the lessons

Go in order, from `00-getting-started`. An exercise is a cell that starts with a comment
like `# Exercise 4.4: ...`; write your code in place of its `raise NotImplementedError`.
A self-check cell below it, `exercise("4.4").self_check(ring_allreduce)`, runs your code on
fresh ranks and prints `Self-check passed` or what went wrong. More tests, hidden from you,
run when your instructor grades your notebook.

### Checking from the command line

`make check LESSON=05` runs lesson 05's self-checks on your notebook as last saved, without
JupyterLab (on a remote machine, say, or in your own CI); `make check` runs every lesson's.
It prints what the self-check cells print, reports an exercise whose
`raise NotImplementedError` is still there as *not done yet*, and exits with status 0 only
when every self-check passed. Like grading, it uses only your notebook's imports,
functions, classes and constants, and lists what it left out of your answer cells: code
that an answer needs must be inside those definitions, not in a cell's loose statements.

## Handing in

1. Run *Kernel > Restart Kernel and Run All Cells* and check that every self-check passes.
2. In JupyterLab, press **Validate** in the notebook's toolbar: it runs the notebook afresh
   and lists anything that fails. It allows each cell {cell_timeout} s, as grading does
   (`nbgrader_config.py` in this folder holds the same limits as the grader's).
3. Save the notebook (Ctrl+S), then, in this folder:

   ```bash
   make handin STUDENT=your-name            # or: make handin STUDENT=your-name LESSON=05
   ```

   It packs every lesson whose answers you changed (or only `LESSON`) into one file,
   `handin/your-name.zip`, and lists what it put in. Use the name your instructor gave
   you, if any (letters, digits, `-`, `_` and `.`); without `STUDENT` it asks for one,
   offering one made from `git config user.name`. It needs only Python: no virtual
   environment. Send that file to your instructor the way they ask (an upload page,
   e-mail). Inside it, each notebook sits at `your-name/<lesson>/<lesson>.ipynb`, so your
   instructor unpacks everyone's files into one folder (`python3 -m zipfile -e
   your-name.zip submissions/`) and grades that folder as it is.
4. On Colab: *File > Download > Download .ipynb*, and send the notebook as your instructor
   asks, or put it in `course/<lesson>/` of a copy of this course (under its own name,
   `<lesson>.ipynb`) and run `make handin STUDENT=your-name LESSON=<lesson>` there.

If your instructor gives you another way to hand in (their own upload page, nbgrader's
exchange), use theirs: the file they want is `course/<lesson>/<lesson>.ipynb`.

## What is in this folder

- `course/`: the lessons.
- `helpers/`: the package the notebooks use to start ranks, trace them and show the results.
- `autograder/`: the exercises' self-checks, and the commands behind `make check` and
  `make handin`.
- `nbgrader_config.py`: the limits Validate uses, the same as grading's.
- `MANIFEST.txt`: every file of the course.
"""
