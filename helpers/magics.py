"""Notebook magics for persistent ranks: ``%load_ext helpers``, then ``%%distributed``.

- ``%dist_start [-n N] [--backend auto|gloo|nccl] [--nnodes K] [--timeout S] [--view auto|widgets|text] ...``
  starts N background ranks (default 2) with the default process group ready. It takes
  every setting :class:`~helpers.Cluster` takes, as ``--name`` (``--max-lines 50``,
  ``--forbid all_reduce,broadcast``): the options are made from
  :class:`~helpers.settings.LaunchSettings`' fields, with their help (``%dist_start?``).
- ``%%distributed [--ranks 0,2] [--timeout S] [--trace]`` runs the cell on every rank (or
  the listed ones), with the settings one request takes; ``--trace`` stores a
  :class:`~helpers.trace.Trace` of the cell's torch.distributed calls in the notebook
  variable ``dist_trace``. Each rank has its own variables, kept between cells, starting with ``rank``,
  ``world_size``, ``local_rank``, ``torch`` and ``dist``. If the cell ends with an
  expression, each rank's value is shown as ``[rank N] Out: ...``.
- ``%dist_status`` shows each rank's state (idle, busy, dead); ``%dist_stop`` stops the
  ranks; ``%dist_restart`` starts a fresh group of the same shape.

Running ``%%distributed`` before ``%dist_start`` starts 2 ranks on the auto backend and
says so in one line, so a first cell just works.

The cluster behind the magics is ``helpers.magics.current()``, a :class:`~helpers.Cluster`
you can also use from Python (``current().pull("x")``).
"""

from __future__ import annotations

from typing import Any, Callable

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .cluster import DEFAULT_WORLD_SIZE, Cluster
from .settings import LaunchSettings, setting_arguments

__all__ = ["DistributedMagics", "load_ipython_extension", "unload_ipython_extension", "current", "DEFAULT_WORLD_SIZE"]

_cluster: Cluster | None = None


def current() -> Cluster | None:
    """The cluster the magics use, or None before ``%dist_start``."""
    return _cluster


def _parse_ranks(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(part) for part in text.replace(" ", "").split(",") if part != ""]
    except ValueError:
        raise ValueError(f"--ranks takes rank numbers separated by commas, like --ranks 0,2; got {text!r}.") from None


def _settings_options(scope: str, **defaults: Any) -> Callable:
    """Add an option for each setting ``scope`` takes (see :func:`helpers.settings.setting_arguments`)."""

    def decorate(magic: Callable) -> Callable:
        for flags, keywords in reversed(setting_arguments(scope, defaults)):
            magic = argument(*flags, **keywords)(magic)
        return magic

    return decorate


def _settings(args: Any, scope: str) -> dict[str, Any]:
    """The parsed options that are settings of ``scope``, by name."""
    return {name: getattr(args, name) for name in LaunchSettings.names(scope)}


@magics_class
class DistributedMagics(Magics):
    """The ``%dist_*`` line magics and the ``%%distributed`` cell magic."""

    @magic_arguments()
    @_settings_options("cluster", world_size=DEFAULT_WORLD_SIZE)
    @line_magic
    def dist_start(self, line: str = "") -> None:
        """Start background ranks: %dist_start -n 4 --backend gloo"""
        global _cluster
        args = parse_argstring(self.dist_start, line)
        if _cluster is not None and _cluster.running:
            print(
                f"Ranks are already running ({_cluster!r}). Use %dist_restart for a fresh group "
                "or %dist_stop first to change its shape."
            )
            return
        _cluster = Cluster(**_settings(args, "cluster"))

    @line_magic
    def dist_stop(self, line: str = "") -> None:
        """Stop the background ranks."""
        global _cluster
        if _cluster is None or not _cluster.running:
            print("No ranks are running.")
            return
        n = _cluster.world_size
        _cluster.shutdown()
        print(f"Stopped {n} rank{'s' if n > 1 else ''}.")

    @line_magic
    def dist_restart(self, line: str = "") -> None:
        """Stop the ranks and start a fresh group of the same shape."""
        if _cluster is None:
            self.dist_start(line)
            return
        _cluster.restart()

    @line_magic
    def dist_status(self, line: str = "") -> None:
        """Show each rank's state: idle, busy or dead."""
        if _cluster is None or not _cluster.running:
            print("No ranks are running. Start them with %dist_start -n 4.")
            return
        print(f"{_cluster.world_size} ranks on {_cluster.choice.name}:")
        for entry in _cluster.status():
            extra = f", exit code {entry['exitcode']}" if entry["state"] == "dead" else ""
            print(f"  rank {entry['rank']}: {entry['state']} (pid {entry['pid']}{extra})")

    @magic_arguments()
    @argument("--ranks", default=None, help="comma-separated ranks to run on, e.g. 0,2")
    @_settings_options("cell")  # --timeout (default: the cluster's), --trace (into dist_trace)
    @cell_magic
    def distributed(self, line: str, cell: str) -> None:
        """Run this cell on every rank (or --ranks 0,2), each in its own namespace; options left out
        take the cluster's own settings."""
        global _cluster
        args = parse_argstring(self.distributed, line)
        ranks = _parse_ranks(args.ranks)
        if _cluster is None or not _cluster.running:
            print(f"No ranks were running: starting {DEFAULT_WORLD_SIZE} (use %dist_start -n N for another size).")
            # That line is the whole notice: no second "Started ..." line.
            _cluster = Cluster(DEFAULT_WORLD_SIZE, start=False).start(announce=False)
        # The blank first line stands for the %%distributed line: line numbers in reports
        # are then the ones the notebook shows for this cell.
        result = _cluster.exec("\n" + cell, ranks=ranks, display=True, **_settings(args, "cell"))
        if args.trace:
            self.shell.user_ns["dist_trace"] = result.trace
            print(f"Traced {len(result.trace)} calls into dist_trace "
                  "(try dist_trace.plot_timeline() or print(dist_trace.table())).")


def load_ipython_extension(ipython) -> None:
    """Called by ``%load_ext helpers``."""
    ipython.register_magics(DistributedMagics)


def unload_ipython_extension(ipython) -> None:
    global _cluster
    if _cluster is not None:
        _cluster.shutdown()
        _cluster = None


