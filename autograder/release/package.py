"""The build: gather what ships (git's list of the course's files and of the shipped packages, the
learner's project files), check it, write the folder and its ``.tar.gz``; and the command."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ..notebooks import colab
from .checks import check_colab, check_imports, check_no_markup, check_notebook, is_placeholder
from .project import (GITIGNORE, grading_limits, learner_environment, learner_makefile, learner_nbgrader_config,
                      learner_pyproject, load_toml)
from .readme import learner_readme
from ..paths import ROOT
from .rules import DEFAULT_DIR, JUNK, SHIPPED, ReleaseError

__all__ = ["build", "main"]


def _tracked(root: Path, folder: str) -> list[str]:
    """Files of ``folder`` that git knows or would add (nothing it ignores), as they are on disk."""
    try:
        done = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", folder],
                              cwd=root, capture_output=True, text=True)
    except FileNotFoundError:
        raise ReleaseError("the release lists the course's files with git, which is not installed: install git "
                           "and run it from the course's checkout.") from None
    if done.returncode:
        raise ReleaseError(f"`git ls-files {folder}` failed in {root} ({done.stderr.strip()}); run the release "
                           "from the course's git checkout.")
    names = sorted(n for n in done.stdout.split("\0") if n and (root / n).is_file() and not JUNK.search(n))
    if not names:
        raise ReleaseError(f"{root / folder} holds no files git knows; run the release from the course's checkout.")
    return names


def _contents(root: Path, name: str, repository: str, allow_placeholder: bool) -> dict[str, str | Path]:
    """Every file of the release ``name`` (its folder's name): its path inside it, and either a source file or the
    text to write. ``repository`` is the Colab address the notebooks must carry (see :func:`check_colab`)."""
    files: dict[str, str | Path] = {}
    for rel in _tracked(root, "course"):
        if rel == "course/README.md":  # a note for instructors on how course/ is made
            continue
        if rel.endswith(".ipynb"):
            check_notebook(root / rel, rel)
        files[rel] = root / rel
    draft = check_colab({n: p for n, p in files.items() if n.endswith(".ipynb")}, repository, allow_placeholder)
    for rel in _tracked(root, "helpers"):
        files[rel] = root / rel
    for shipped in SHIPPED:  # whole files and packages, as they are: nothing is rewritten
        for rel in _tracked(root, f"autograder/{shipped}"):
            files[rel] = root / rel
    main = load_toml(root / "pyproject.toml")
    env_name = re.search(r"^name:\s*(\S+)", (root / "environment.yml").read_text(), re.M)
    env_name = env_name[1] if env_name else "distributed-course"
    limits = grading_limits(root)
    files["pyproject.toml"] = learner_pyproject(main)
    files["environment.yml"] = learner_environment(main, env_name)
    files["Makefile"] = learner_makefile((root / "Makefile").read_text())
    files["nbgrader_config.py"] = learner_nbgrader_config(limits)
    files["README.md"] = learner_readme(
        python=main["project"]["requires-python"].replace(">=", "") + " or newer", env_name=env_name,
        clone=None if draft else f"{repository.rstrip('/').removesuffix('.git')}.git", archive=f"{name}.tar.gz",
        folder=name, cell_timeout=limits.get("Execute", {}).get("timeout", 30),  # 30: nbgrader's default
        placeholder=repository if draft else None)
    files[".gitignore"] = GITIGNORE
    return files


def _write(out: Path, files: dict[str, str | Path]) -> None:
    for name, what in files.items():
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(what, Path):
            shutil.copy2(what, target)
        else:
            target.write_text(what)
    names = sorted([*files, "MANIFEST.txt"])
    (out / "MANIFEST.txt").write_text("\n".join(names) + "\n")


def _replaceable(dest: Path, root: Path) -> None:
    """Refuse a place that is not new, empty or an earlier release, or that lies inside what ships."""
    if dest.exists() and not dest.is_dir():
        raise ReleaseError(f"{dest} exists and is not a folder; choose another place for the release.")
    if dest.is_dir() and any(p.name != ".git" for p in dest.iterdir()) and not (dest / "MANIFEST.txt").is_file():
        raise ReleaseError(f"{dest} holds files but no MANIFEST.txt, so it is not an earlier release, and building "
                           "there would delete them. Choose a new or empty folder (a git checkout with no files "
                           "besides .git will do).")
    for source in ("course", "helpers", "autograder"):
        if (root / source).resolve() in dest.resolve().parents:
            raise ReleaseError(f"{dest} is inside {root / source}, which the release copies from; build it "
                               f"elsewhere, for example into {root / DEFAULT_DIR}.")


def build(dest: Path, root: Path = ROOT, *, repository: str | None = None, allow_colab_placeholder: bool = False
          ) -> Path:
    """Build the learner distribution into ``dest`` (replacing an earlier release there) and ``dest.tar.gz``.

    A ``.git`` folder in ``dest`` is kept, so ``dest`` can stay a checkout of the published
    learner repository: build, then commit and push there. Returns ``dest``. Raises
    :class:`ReleaseError` when what would ship is not right, and while ``repository`` (default:
    ``REPOSITORY`` in :mod:`autograder.notebooks.colab`) is the placeholder, unless
    ``allow_colab_placeholder``: then the release's README warns that the Colab badges do not work.
    """
    dest = Path(dest).absolute()
    _replaceable(dest, root)
    files = _contents(root, dest.name, repository or colab.REPOSITORY, allow_colab_placeholder)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        _write(staging, files)
        check_imports(staging, root)
        check_no_markup(staging)
        if (dest / ".git").exists():
            (dest / ".git").rename(staging / ".git")
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    archive = dest.parent / f"{dest.name}.tar.gz"

    def owned_by_nobody(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(archive, "w:gz") as tar:
        for name in (dest / "MANIFEST.txt").read_text().splitlines():
            tar.add(dest / name, arcname=f"{dest.name}/{name}", filter=owned_by_nobody)
    return dest


USAGE = "usage: python -m autograder release [--allow-colab-placeholder] [DIR]   (default DIR: dist/learner-course)"


def main(argv: list[str]) -> int:
    """``python -m autograder release [--allow-colab-placeholder] [DIR]``: build, then say where it went and how big."""
    draft = "--allow-colab-placeholder" in argv
    rest = [a for a in argv if a != "--allow-colab-placeholder"]
    if len(rest) > 1 or any(a.startswith("-") for a in rest):
        print(USAGE, file=sys.stderr)
        return 2
    dest = Path(rest[0]) if rest else ROOT / DEFAULT_DIR
    try:
        out = build(dest, allow_colab_placeholder=draft)
    except ReleaseError as err:
        print(f"release: {err}", file=sys.stderr)
        return 1
    names = (out / "MANIFEST.txt").read_text().splitlines()
    size = sum((out / n).stat().st_size for n in names)
    archive = out.parent / f"{out.name}.tar.gz"
    print(f"Learner course written to {out} ({len(names)} files, {size / 1e6:.1f} MB) and {archive} "
          f"({archive.stat().st_size / 1e6:.1f} MB).")
    if is_placeholder(colab.REPOSITORY):
        print("Draft: REPOSITORY in autograder/notebooks/colab.py is still the placeholder, so the Colab badges do not "
              "work, and the release's README says so at the top. Set REPOSITORY, run `make course` and build again "
              "before you publish (docs/instructors.md, Publishing the course).", file=sys.stderr)
    else:
        print("Publish the folder as the learner repository that REPOSITORY in autograder/notebooks/colab.py names (see "
              "docs/instructors.md, Publishing the course).")
    return 0
