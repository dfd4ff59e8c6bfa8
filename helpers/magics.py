"""Notebook magics for persistent ranks: ``%load_ext helpers``, then ``%%distributed``.

- ``%dist_start [-n N] [--backend auto|gloo|nccl] [--nnodes K] [--timeout S] [--view auto|widgets|text]``
  starts N background ranks (default 2) with the default process group ready.
- ``%%distributed [--ranks 0,2] [--timeout S] [--trace]`` runs the cell on every rank (or
  the listed ones); ``--trace`` stores a :class:`~helpers.trace.Trace` of the cell's
  torch.distributed calls in the notebook variable ``dist_trace``. Each rank has its own variables, kept between cells, starting with ``rank``,
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


from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .cluster import Cluster

__all__ = ["DistributedMagics", "load_ipython_extension", "unload_ipython_extension", "current"]

_cluster: Cluster | None = None
DEFAULT_WORLD_SIZE = 2


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


@magics_class
class DistributedMagics(Magics):
    """The ``%dist_*`` line magics and the ``%%distributed`` cell magic."""

    @magic_arguments()
    @argument("-n", "--world-size", type=int, default=DEFAULT_WORLD_SIZE, help="number of ranks")
    @argument("--backend", default="auto", help="auto, gloo, nccl or mpi")
    @argument("--nnodes", type=int, default=1, help="simulated hosts")
    @argument("--timeout", type=float, default=None, help="seconds a cell may run (default 60; 10 while nbgrader grades)")
    @argument("--view", default="auto", help="auto, widgets or text")
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
        _cluster = Cluster(
            args.world_size,
            backend=args.backend,
            nnodes=args.nnodes,
            timeout=args.timeout,
            view=args.view,
        )

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
    @argument("--timeout", type=float, default=None, help="seconds this cell may run")
    @argument("--trace", action="store_true", help="record every torch.distributed call into dist_trace")
    @cell_magic
    def distributed(self, line: str, cell: str) -> None:
        """Run this cell on every rank (or --ranks 0,2), each in its own namespace."""
        global _cluster
        args = parse_argstring(self.distributed, line)
        ranks = _parse_ranks(args.ranks)
        if _cluster is None or not _cluster.running:
            print(f"No ranks were running: starting {DEFAULT_WORLD_SIZE} (use %dist_start -n N for another size).")
            # That line is the whole notice: no second "Started ..." line.
            _cluster = Cluster(DEFAULT_WORLD_SIZE, start=False).start(announce=False)
        # The blank first line stands for the %%distributed line: line numbers in reports
        # are then the ones the notebook shows for this cell.
        result = _cluster.exec("\n" + cell, ranks=ranks, timeout=args.timeout, display=True, trace=args.trace)
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


