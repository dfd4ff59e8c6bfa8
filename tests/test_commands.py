"""Commands run from a cell (helpers.commands) and functions exported to scripts (helpers.export), for real."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from helpers import CommandFailedError, CommandTimeoutError, ExportError, export_script, run, start

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _exportable  # noqa: E402

# Starts a grandchild in a session of its own (as torchrun starts its workers), prints its
# pid, then sleeps: the grandchild escapes any process-group kill.
ESCAPER = (
    "import subprocess, sys, time\n"
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
    "print('grandchild', p.pid, flush=True)\n"
    "time.sleep(float(sys.argv[1]))\n"
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _grandchild(job) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for line in list(job.lines):
            if line.startswith("grandchild "):
                return int(line.split()[1])
        time.sleep(0.05)
    raise AssertionError(f"the command never printed its grandchild's pid: {job.text!r}")


def test_run_labels_output_and_returns_the_exit_code(capsys):
    """Does run() print each line as [label] line, stderr included, and return the command's exit code?"""
    job = run([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
              label="demo", timeout=30)
    assert job.returncode == 3
    printed = capsys.readouterr().out
    assert "[demo] out\n" in printed and "[demo] err\n" in printed
    with pytest.raises(CommandFailedError, match=r"demo exited with code 3") as info:
        run([sys.executable, "-c", "import sys; print('last words'); sys.exit(3)"], label="demo", check=True,
            output="quiet")
    assert "last words" in info.value.tail


def test_a_timeout_ends_processes_in_sessions_of_their_own():
    """Does a timed-out command end within seconds together with a grandchild that left its process group?"""
    started = time.monotonic()
    job = start([sys.executable, "-c", ESCAPER, "120"], output="quiet")
    grandchild = _grandchild(job)
    with pytest.raises(CommandTimeoutError, match="did not finish within"):
        job.wait(timeout=1)
    assert time.monotonic() - started < 25
    assert not _alive(grandchild) and not _alive(job.pid)


def test_what_a_finished_command_leaves_behind_is_ended():
    """Does a command that exits 0 but leaves a process running get that process ended too?"""
    job = start([sys.executable, "-c", ESCAPER, "0.5"], output="quiet")
    grandchild = _grandchild(job)
    assert job.wait(timeout=30) == 0
    assert not _alive(grandchild)


def test_stop_ends_a_background_job():
    """Does stop() on a job started in the background end it and everything it started?"""
    job = start([sys.executable, "-c", ESCAPER, "120"], output="quiet")
    grandchild = _grandchild(job)
    assert job.running()
    code = job.stop()
    assert code != 0 and not job.running()
    assert not _alive(grandchild)


def test_bad_commands_are_refused_with_the_fix():
    """Is a command given as one string refused with the list to pass instead?"""
    with pytest.raises(TypeError, match=r"\['torchrun', '--standalone'\]"):
        start("torchrun --standalone")


@pytest.mark.slow
def test_an_exported_function_runs_under_torchrun(tmp_path):
    """Does a function with a class, a helper, a constant, a tensor and DDP from its module run unchanged under torchrun?"""
    script = export_script(_exportable.train, tmp_path / "train.py", args=(0.1,))
    text = script.read_text()
    assert 'if __name__ == "__main__":' in text and "dist.destroy_process_group()" in text
    assert "from torch.nn.parallel import DistributedDataParallel as DDP" in text
    # torch.distributed.nn imported before the group exists, and the group's last reference dropped
    # after destroy_process_group: otherwise gloo's threads end at exit and abort a rank now and then
    assert text.index("import torch.distributed.nn") < text.index("dist.init_process_group(")
    assert text.index("dist.destroy_process_group()") < text.index("del world")
    assert (tmp_path / "train_data.pt").is_file()
    torchrun = Path(sys.executable).with_name("torchrun")
    job = run([str(torchrun), "--standalone", "--nproc-per-node=2", str(script)], cwd=tmp_path, timeout=120,
              output="quiet", env={"PYTHONPATH": ""})
    assert job.returncode == 0, job.text
    lines = sorted(line for line in job.lines if line.startswith("rank "))
    assert [line.split(",")[0] for line in lines] == ["rank 0 of 2", "rank 1 of 2"], job.text
    assert len({line.split(": ")[1] for line in lines}) == 1  # the same all-reduced weights on both


def test_a_local_named_like_a_global_is_not_exported_as_that_global(tmp_path):
    """Does a function whose local variable shares a name with a global of its module (``start``, as ``from helpers
    import start`` binds in lesson 07's notebook) export without importing that global? (Exercise 7.2's answer
    wrote ``from helpers import start`` into its script, and each process then started a rank factory it left behind.)"""
    import importlib.util

    path = tmp_path / "shadowing.py"
    path.write_text("from helpers import start\n\n\ndef main():\n    start = 0\n    for step in range(start, 3):\n"
                    "        print(step)\n")
    spec = importlib.util.spec_from_file_location("shadowing", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = export_script(module.main, tmp_path / "out.py", setup=False).read_text()
    assert "from helpers import" not in text and "import helpers" not in text and "start = 0" in text, text


def test_a_global_that_cannot_go_into_a_script_is_named(tmp_path):
    """Does exporting a function that uses a lock name the global and say what to do?"""
    with pytest.raises(ExportError, match=r"uses the global 'LOCK', a lock.*inside the function"):
        export_script(_exportable.uses_a_lock, tmp_path / "x.py")
    assert not os.path.exists(tmp_path / "x.py")


def test_a_dying_kernel_takes_its_commands_with_it(tmp_path):
    """When the process that started a command is killed (a kernel dying), does everything the command started end too?"""
    parent_code = (
        "import sys, time\n"
        "from helpers import start\n"
        f"job = start([sys.executable, '-c', {ESCAPER!r}, '120'], output='quiet')\n"
        "while not any(l.startswith('grandchild ') for l in list(job.lines)):\n"
        "    time.sleep(0.05)\n"
        "print([l for l in job.lines if l.startswith('grandchild ')][0], flush=True)\n"
        "time.sleep(120)\n"
    )
    import signal
    import subprocess

    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(parent.stdout.readline().split()[1])
        assert _alive(grandchild)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 15
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild)
    finally:
        if parent.poll() is None:
            parent.kill()
