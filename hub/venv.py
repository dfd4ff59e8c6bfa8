"""Make the hub's venv from the course's own venv, in seconds instead of a minute of pip.

`make hub` needs a venv that every learner can run. When the course's venv was made from a
Python that other users cannot start (one under /root, as pyenv installs it), the Makefile
builds ``.venv-hub`` from ``HUB_PYTHON`` (``/usr/bin/python3``). When that Python has the same
major and minor version as the course venv's, the installed packages are the same files for
both (wheels are built per minor version), so this script makes the new venv with
``HUB_PYTHON`` and fills it from the course venv: every file of its ``site-packages`` and of
Jupyter's ``share/`` and ``etc/`` (the kernel spec, nbgrader's lab extension, the server's
settings) hard-linked (copied where a link is refused), and every script of its ``bin/``
rewritten to start the new venv's interpreter. Nothing is downloaded and nothing is compiled.

It prints why and exits with status 3 when it cannot clone (the versions differ, the course venv
is not finished, the target exists); the Makefile then installs the hub's venv with pip, as
before. Example::

    /usr/bin/python3 hub/venv.py .venv .venv-hub     # exit 0: .venv-hub runs /usr/bin/python3
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CANNOT = 3  # the exit status that sends the Makefile to pip


def _version(python: Path, parts: int = 2) -> str:
    done = subprocess.run([str(python), "-c", f"import sys; print('.'.join(map(str, sys.version_info[:{parts}])))"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links refused: a copy serves as well
        shutil.copy2(src, dst)


def _rewrite_scripts(source: Path, target: Path) -> int:
    """Each script in ``source/bin`` whose first line starts the source venv's Python, started by the target's."""
    old, new = f"#!{source.resolve()}/bin/python".encode(), f"#!{target.resolve()}/bin/python".encode()
    count = 0
    for script in sorted((source / "bin").iterdir()):
        made = target / "bin" / script.name
        if made.exists() or not script.is_file() or script.is_symlink():
            continue  # the venv's own python, activate scripts
        head = script.read_bytes()
        if not head.startswith(old):
            continue
        made.write_bytes(new + head[len(old):])
        made.chmod(0o755)
        count += 1
    return count


def clone(source: Path, target: Path, python: Path) -> str | None:
    """Make ``target`` with ``python`` and ``source``'s packages; None when done, else why it cannot."""
    if not (source / ".installed").exists():
        return f"{source} is not a finished course venv (no {source / '.installed'})"
    if target.exists():
        return f"{target} exists already"
    have, want = _version(source / "bin" / "python"), _version(python)
    if not have or have != want:
        return f"{source} runs Python {have or '?'} and {python} is Python {want or '?'}: their packages differ"
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(target)], check=True)
    packages = f"lib/python{have}/site-packages"
    shutil.rmtree(target / packages)
    shutil.copytree(source / packages, target / packages, symlinks=True, copy_function=_link_or_copy)
    for data in ("share", "etc"):  # Jupyter's kernel spec, lab extensions (nbgrader's tabs), server settings
        if (source / data).is_dir():
            shutil.copytree(source / data, target / data, symlinks=True, copy_function=_link_or_copy,
                            dirs_exist_ok=True)
    scripts = _rewrite_scripts(source, target)
    refused = _refused(target)
    if refused:  # the Makefile's pip step installs versions that accept this Python, and keeps the rest
        subprocess.run([str(target / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", *refused], check=True)
    else:
        (target / ".installed").touch()  # the Makefile's stamp: `make venv VENV=target` has nothing left to do
    print(f"hub/venv.py: made {target} from {source}'s packages with {python} (Python {have}, {scripts} scripts)"
          + (f"; Python {_version(python, 3)} is refused by {', '.join(refused)}, which pip installs again"
             if refused else ""))
    return None


# Run by the new venv's Python: the distributions whose Requires-Python excludes it (a package may ask for a
# patch release: soupsieve 4.1 needs 3.11.5). pip's own copy of `packaging` reads the specifiers.
_REFUSED = '''
import importlib.metadata as md, sys
from pip._vendor.packaging.specifiers import SpecifierSet
here = "%d.%d.%d" % sys.version_info[:3]
for dist in md.distributions():
    wants = dist.metadata.get("Requires-Python")
    if wants and not SpecifierSet(wants).contains(here, prereleases=True):
        print(dist.metadata["Name"])
'''


def _refused(target: Path) -> list[str]:
    done = subprocess.run([str(target / "bin" / "python"), "-c", _REFUSED], capture_output=True, text=True, check=True)
    return sorted(set(done.stdout.split()))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: HUB_PYTHON hub/venv.py COURSE_VENV HUB_VENV", file=sys.stderr)
        return 2
    source, target = Path(argv[0]), Path(argv[1])
    try:
        why = clone(source, target, Path(sys.executable))
    except (OSError, subprocess.CalledProcessError) as error:
        shutil.rmtree(target, ignore_errors=True)  # half a venv must not pass for one: pip builds it instead
        why = f"copying failed: {error}"
    if why:
        print(f"hub/venv.py: not cloning the course venv ({why}); installing {target} with pip instead.")
        return CANNOT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
