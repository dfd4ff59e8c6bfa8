"""`make hub`'s venv made from the course venv's packages (hub/venv.py): does it run, and does it refuse what it cannot clone?"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)
HUB_PYTHON = Path("/usr/bin/python3")


def _minor(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import sys; print(sys.version_info[:2])"],
                          capture_output=True, text=True).stdout.strip()


def test_a_cloned_hub_venv_imports_the_course_with_its_own_python_and_scripts(tmp_path):
    """Does the clone start the hub's Python, run the copied scripts, import torch and nbgrader, and report what it reinstalls?"""
    if not HUB_PYTHON.exists() or _minor(HUB_PYTHON) != _minor(Path(sys.executable)):
        pytest.skip(f"{HUB_PYTHON} is missing or another minor version than this venv's Python {sys.version.split()[0]}")
    if not (VENV / ".installed").exists():
        pytest.skip(f"{VENV} is not a venv made by `make venv`")
    target = tmp_path / "hub-venv"
    done = subprocess.run([str(HUB_PYTHON), str(ROOT / "hub" / "venv.py"), str(VENV), str(target)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"made {target}" in done.stdout, done.stdout
    assert (target / "bin" / "jupyterhub-singleuser").read_text().startswith(f"#!{target.resolve()}/bin/python\n")
    probe = subprocess.run([str(target / "bin" / "python"), "-c",
                            "import sys, torch, nbgrader, jupyterhub; print(sys.prefix, sys.base_prefix)"],
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    prefix, base = probe.stdout.split()
    assert Path(prefix) == target.resolve() and Path(base) == Path(subprocess.run(
        [str(HUB_PYTHON), "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True).stdout.strip())
    kernels = target / "share" / "jupyter" / "kernels" / "python3" / "kernel.json"
    assert kernels.is_file(), "the kernel spec (share/jupyter) was not copied"
    # A distribution that refuses this Python was removed, so that pip installs one that accepts it; then no stamp.
    assert ("is refused by" in done.stdout) != (target / ".installed").exists(), done.stdout


def test_a_venv_that_is_not_finished_or_a_target_that_exists_is_left_to_pip(tmp_path):
    """Does the clone refuse (exit 3, saying why) a source venv without the Makefile's stamp and a target that exists?"""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    done = subprocess.run([sys.executable, str(ROOT / "hub" / "venv.py"), str(bare), str(tmp_path / "new")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "not a finished course venv" in done.stdout, done.stdout + done.stderr
    assert not (tmp_path / "new").exists()
    (bare / ".installed").touch()
    done = subprocess.run([sys.executable, str(ROOT / "hub" / "venv.py"), str(bare), str(bare)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and "exists already" in done.stdout, done.stdout + done.stderr
