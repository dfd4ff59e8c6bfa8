"""Showing each rank's output in JupyterLab: one tab per rank, plus all ranks together.

In a notebook opened in JupyterLab (or Colab) the persistent ranks' output goes to an
ipywidgets view: a tab per rank and an "all ranks" tab with labelled lines. Where no
widget frontend is there (nbclient, nbgrader, a terminal, an exported notebook) the same
output is printed as plain ``[rank N] ...`` lines instead.

``choose_view()`` decides: ``HELPERS_VIEW=text`` or ``HELPERS_VIEW=widgets`` forces one;
otherwise widgets are used only inside a Jupyter kernel started by a Jupyter server for
a notebook (it sets ``JPY_SESSION_NAME``) or on Colab, when ipywidgets is importable.
:class:`RequestOutput` gives each request of persistent ranks its router, by the cluster's
``view`` and ``output`` settings.

Example::

    >>> view = RankOutputView(world_size=2)     # in a notebook cell
    >>> view.display()
    >>> view.write(1, "stdout", "hello")        # appears in the "rank 1" tab and in "all"
"""

from __future__ import annotations

import os
import sys

from .output import OutputRouter

__all__ = ["choose_view", "RankOutputView", "ViewRouter", "RequestOutput"]


def choose_view() -> str:
    """``"widgets"`` or ``"text"`` for the current process."""
    forced = os.environ.get("HELPERS_VIEW", "").strip().lower()
    if forced in ("text", "widgets"):
        return forced
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return "text"
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return "text"
    if "JPY_SESSION_NAME" not in os.environ and "google.colab" not in sys.modules:
        return "text"
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return "text"
    return "widgets"


class RankOutputView:
    """A tab per rank and a combined tab, filled as the ranks print."""

    def __init__(self, world_size: int, ranks: list[int] | None = None) -> None:
        import ipywidgets as widgets

        self.ranks = list(range(world_size)) if ranks is None else list(ranks)
        layout = widgets.Layout(max_height="320px", overflow="auto")
        self.combined = widgets.Output(layout=layout)
        self.per_rank = {r: widgets.Output(layout=layout) for r in self.ranks}
        self.tabs = widgets.Tab(children=[self.combined, *self.per_rank.values()])
        for i, title in enumerate(["all ranks", *(f"rank {r}" for r in self.ranks)]):
            self.tabs.set_title(i, title)
        self._shown = False
        self.lines = 0

    def display(self) -> None:
        from IPython.display import display

        if not self._shown:
            display(self.tabs)
            self._shown = True

    def write(self, rank: int, stream: str, line: str) -> None:
        """Sink for :class:`~helpers.output.OutputRouter`: one labelled line."""
        self.display()  # only cells that print get a view
        self.lines += 1
        mark = ":err" if stream == "stderr" else ""
        self._append(self.combined, f"[rank {rank}{mark}] {line}\n")
        target = self.per_rank.get(rank)
        if target is not None:
            self._append(target, line + "\n")

    def _append(self, widget, text: str) -> None:
        """Add ``text`` to ``widget``, whose outputs stay one stream holding all its text.

        Not ``append_stdout``: that adds an output per line, and JupyterLab merges consecutive
        stream outputs into one while it re-renders them; under load a line merged in at that
        moment was seen missing from the "all ranks" tab. A single stream has nothing to merge.
        Each update sends the widget's whole text, as ``append_stdout`` sends every line so far.
        """
        before = widget.outputs[0]["text"] if widget.outputs else ""
        widget.outputs = ({"output_type": "stream", "name": "stdout", "text": before + text},)

    def close_if_unused(self) -> None:
        """Free the widgets of a view that was never shown (its request printed nothing)."""
        if not self._shown:
            for widget in (*self.per_rank.values(), self.combined, self.tabs):
                widget.close()


class ViewRouter(OutputRouter):
    """Rank output goes to the widget view; our own lines (the ranks started, each rank's
    ``Out:`` value, a rank that did not stop) stay plain text under the cell. A plain
    router with a callable sink would drop them."""

    def note(self, text: str) -> None:
        try:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
        except (OSError, ValueError):
            pass


class RequestOutput:
    """Where the output of each request to persistent ranks goes (:class:`helpers.Cluster`).

    ``view`` and ``output`` are the cluster's settings: with live output, and widgets chosen
    (``view="widgets"``, or ``"auto"`` where :func:`choose_view` says so), a request gets a
    new :class:`RankOutputView` and a :class:`ViewRouter` writing into it; otherwise a plain
    :class:`~helpers.output.OutputRouter`. ``last`` is the last request's router.
    """

    def __init__(self, view: str, output: str, max_lines: int, world_size: int) -> None:
        self.view, self.output, self.max_lines, self.world_size = view, output, max_lines, world_size
        self.current_view: RankOutputView | None = None  # the last request's widgets, if any
        self.last: OutputRouter | None = None

    def router(self, ranks: list[int] | None = None) -> OutputRouter:
        """The router of the next request, to ``ranks`` (a view's tabs); the last one's
        widgets are freed when nothing was printed into them."""
        if self.current_view is not None:
            self.current_view.close_if_unused()  # a request that printed nothing leaves no widgets behind
            self.current_view = None
        view = self.view if self.view != "auto" else choose_view()
        if view == "widgets" and self.output == "live":
            self.current_view = RankOutputView(self.world_size, ranks)
            self.last = ViewRouter(self.current_view.write, max_lines=self.max_lines)
        else:
            self.last = OutputRouter(self.output, max_lines=self.max_lines)
        return self.last
