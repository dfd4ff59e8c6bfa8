"""The launch benchmark's baselines: torch's own launchers running the same trivial job.

- ``torch.multiprocessing.spawn`` of the benchmark's function (gloo, a fresh loopback port
  each time, ``destroy_process_group`` at the end): :func:`measure_spawn`.
- ``torchrun`` (``python -m torch.distributed.run --standalone``) of a small script doing
  the same: :func:`measure_torchrun`; a world size where torchrun does not work here is
  reported as skipped, with the reason.

Used by bench/launch_bench.py, which runs both for every world size. Nothing heavy is
imported at module level: ``torch.multiprocessing.spawn`` re-imports the benchmark in
each of its child processes, and this module with it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Callable, Iterator

from _common import say, stats

__all__ = ["measure_spawn", "measure_torchrun", "spawn_entry"]

ROOT = Path(__file__).resolve().parents[1]

_TORCHRUN_SCRIPT = textwrap.dedent(
    """
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert float(t.item()) == float(dist.get_world_size()), t
    dist.destroy_process_group()
    """
)


def spawn_entry(rank: int, world_size: int, fn: Callable[[int, int], float]) -> None:
    """What each mp.spawn process runs: set up gloo, call ``fn``, check its value, tear down."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        value = fn(rank, world_size)
        if value != float(world_size):
            raise RuntimeError(f"rank {rank}: all_reduce gave {value}, expected {world_size}")
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _env_vars(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def measure_spawn(world_sizes: list[int], repeats: int, fn: Callable[[int, int], float]) -> dict:
    """Seconds per ``mp.spawn`` of ``fn`` on each of ``world_sizes`` processes: world size -> stats."""
    import torch.multiprocessing as mp

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from helpers._runtime.spec import free_port

    out = {}
    for n in world_sizes:
        samples = []
        for i in range(repeats):
            with _env_vars(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), GLOO_SOCKET_IFNAME="lo"):
                start = time.perf_counter()
                mp.spawn(spawn_entry, args=(n, fn), nprocs=n, join=True)
                samples.append(time.perf_counter() - start)
            say(f"  spawn n={n} run {i + 1}/{repeats}: {samples[-1]:.3f} s")
        out[str(n)] = stats(samples)
    return out


def _torchrun(n: int, repeats: int, script: str) -> dict:
    samples = []
    for i in range(repeats):
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nproc-per-node", str(n), "--standalone", script,
        ]
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=str(ROOT), env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=180)
        except subprocess.TimeoutExpired:
            return {"skipped": f"torchrun with {n} processes did not finish within 180 s"}
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"skipped": f"torchrun exited with code {proc.returncode}: " + " | ".join(tail)}
        samples.append(elapsed)
        say(f"  torchrun n={n} run {i + 1}/{repeats}: {elapsed:.3f} s")
    return stats(samples)


def measure_torchrun(world_sizes: list[int], repeats: int) -> dict:
    """Seconds per ``torchrun --standalone`` of the same job on each of ``world_sizes`` processes:
    world size -> stats, or ``{"skipped": why}`` where torchrun failed or did not finish."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="launch_bench_") as tmp:
        script = os.path.join(tmp, "allreduce_once.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(_TORCHRUN_SCRIPT)
        for n in world_sizes:
            out[str(n)] = _torchrun(n, repeats, script)
            if "skipped" in out[str(n)]:
                say(f"  torchrun n={n} skipped: {out[str(n)]['skipped']}")
    return out
