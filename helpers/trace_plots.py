"""The pictures of a trace: a timeline, a heatmap of the links, a ring all-reduce step by step.

:class:`~helpers.trace.Trace` works the numbers out (which calls, which messages, which
chunk each rank holds after each step of a ring); this module only draws them, so that a
trace can be read and tested without matplotlib, which is imported only when a picture
is asked for. Learners call these through the trace (``trace.plot_timeline()``,
``trace.plot_links()``, ``trace.plot_ring_steps()``); each function here takes the plain
data the trace computed.

Example::

    >>> trace = launch(ring, 4, trace=True).trace
    >>> fig = plot_links(trace.link_matrix())        # the same as trace.plot_links()
    >>> human_bytes(3 * 1024 * 1024)
    '3.0 MB'
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from ._runtime.calls import KNOWN
from ._runtime.protocol import TraceEvent

__all__ = ["plot_timeline", "plot_links", "plot_ring_steps", "draw_ring_step", "human_bytes"]

#: The colours of calls the table of known calls gives none: point-to-point, and the rest.
_P2P_COLOR, _OTHER_COLOR = "#bcbd22", "#8c564b"


def plot_timeline(events: Sequence[TraceEvent], world_size: int,
                  messages: Iterable[tuple[TraceEvent, TraceEvent | None]] = (),
                  ax: Any = None, title: str | None = None) -> Any:
    """One lane per rank, a bar per call, an arrow per message (a ``(send, recv)`` pair of
    ``messages``) from sender to receiver. Returns the Figure, with ``n_arrows`` on it."""
    from matplotlib.patches import Patch

    fig, ax = _figure(ax, (10, 1.0 + 0.6 * world_size))
    seen = {}
    for e in events:
        known = KNOWN.get(e.op)
        color = known.color if known is not None and known.color else _P2P_COLOR if e.is_p2p else _OTHER_COLOR
        width = max(e.end - e.start, 1e-6)
        ax.barh(e.rank, width, left=e.start, height=0.5, color=color, edgecolor="black", linewidth=0.3)
        if e.async_op and e.waited is not None and e.waited > e.end:
            ax.barh(e.rank, e.waited - e.end, left=e.end, height=0.2, color=color, alpha=0.4)
        seen.setdefault(e.op, color)
    n_arrows = 0
    for send, recv in messages:
        if recv is None:
            continue
        ax.annotate(
            "",
            xy=(recv.done, recv.rank),
            xytext=(send.start, send.rank),
            arrowprops={"arrowstyle": "->", "color": "black", "alpha": 0.6, "lw": 0.8},
        )
        n_arrows += 1
    ax.set_yticks(range(world_size))
    ax.set_yticklabels([f"rank {r}" for r in range(world_size)])
    ax.set_ylim(world_size - 0.5, -0.5)
    ax.set_xlabel("time since the first call (s)")
    ax.set_ylabel("rank")
    ax.set_title(title or f"Timeline of {len(events)} calls on {world_size} ranks")
    if seen:
        handles = [Patch(color=c, label=op) for op, c in seen.items()]
        if n_arrows:
            from matplotlib.lines import Line2D

            handles.append(Line2D([0], [0], color="black", lw=0.8, label="message"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.n_arrows = n_arrows
    return _done(fig)


def plot_links(matrix: list[list[int]], ax: Any = None, title: str | None = None) -> Any:
    """Heatmap of ``matrix[i][j]``, the bytes rank i sent to rank j, each cell labelled."""
    n = len(matrix)
    fig, ax = _figure(ax, (1.6 + 0.9 * n, 1.2 + 0.8 * n))
    image = ax.imshow(matrix, cmap="Blues")
    peak = max((v for row in matrix for v in row), default=0)
    for i, row in enumerate(matrix):
        for j, v in enumerate(row):
            ax.text(j, i, human_bytes(v), ha="center", va="center", fontsize="small",
                    color="white" if peak and v > peak / 2 else "black")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xlabel("to rank")
    ax.set_ylabel("from rank")
    ax.set_title(title or "Bytes sent point-to-point")
    fig.colorbar(image, ax=ax, label="bytes")
    fig.tight_layout()
    return _done(fig)


def plot_ring_steps(steps: list[dict[str, Any]], world_size: int, phases: Sequence[str],
                    interactive: bool | None = None) -> Any:
    """The ``steps`` of :meth:`~helpers.trace.Trace.ring_steps`, of a trace of ``phases``:
    a slider over them in a notebook with widgets (or with ``interactive=True``), else a
    Figure with one panel per step."""
    if not steps:
        raise ValueError("this trace has no point-to-point sends, so there is no ring to show")
    if interactive is None:
        from .view import choose_view

        interactive = choose_view() == "widgets"
    if interactive:
        return _ring_slider(steps, world_size)
    import matplotlib.pyplot as plt

    cols = min(len(steps), 4)
    rows = math.ceil(len(steps) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False)
    for ax in axes.flat[len(steps):]:
        ax.axis("off")
    for ax, step in zip(axes.flat, steps):
        draw_ring_step(ax, step, world_size)
    what = "all-reduce" if len(set(phases)) == 2 else phases[0]
    fig.suptitle(f"Ring {what} on {world_size} ranks, step by step (number = ranks summed into the chunk)")
    fig.tight_layout()
    plt.close(fig)
    return fig


def _ring_slider(steps: list[dict[str, Any]], world_size: int) -> Any:
    """An ipywidgets slider over the steps, the chosen step drawn below it."""
    import ipywidgets as widgets

    out = widgets.Output()
    slider = widgets.IntSlider(value=0, min=0, max=len(steps) - 1, description="step")

    def show(change: Any = None) -> None:
        import matplotlib.pyplot as plt
        from IPython.display import display

        with out:
            out.clear_output(wait=True)
            fig, ax = plt.subplots(figsize=(4.5, 3.2))
            draw_ring_step(ax, steps[slider.value], world_size)
            fig.tight_layout()
            display(fig)
            plt.close(fig)

    slider.observe(show, names="value")
    show()
    return widgets.VBox([slider, out])


def draw_ring_step(ax: Any, step: dict[str, Any], world_size: int) -> None:
    """One step on ``ax``: ranks by chunks, each cell the number of ranks summed into that
    chunk on that rank, the chunks sent in this step framed in red."""
    from matplotlib.patches import Rectangle

    p = world_size
    ax.imshow(step["holdings"], cmap="Greens", vmin=0, vmax=p)
    for r in range(p):
        for c in range(p):
            value = step["holdings"][r][c]
            ax.text(c, r, str(value), ha="center", va="center", fontsize="small", color="white" if value > p / 2 else "black")
    for src, dst, chunk in step["sends"]:
        ax.add_patch(Rectangle((chunk - 0.5, src - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
    ax.set_xticks(range(p))
    ax.set_yticks(range(p))
    ax.set_xlabel("chunk")
    ax.set_ylabel("rank")
    ax.set_title(f"step {step['step'] + 1}: {step['phase']}\n(red = chunk sent to the next rank)", fontsize="small")


def _figure(ax: Any, size: tuple[float, float]) -> tuple[Any, Any]:
    """The figure and axes to draw on: the caller's, or a new pair."""
    import matplotlib.pyplot as plt

    if ax is not None:
        return ax.figure, ax
    fig, ax = plt.subplots(figsize=size)
    fig._helpers_own = True  # ours to close once drawn (see _done)
    return fig, ax


def _done(fig: Any) -> Any:
    """Close a figure we created, so Jupyter shows it once (as the value the method
    returns) rather than a second time at the end of the cell; leave the caller's alone."""
    import matplotlib.pyplot as plt

    if getattr(fig, "_helpers_own", False):
        plt.close(fig)
    return fig


def human_bytes(n: float) -> str:
    """A byte count as people read it: ``'512 B'``, ``'1.5 KB'``, ``'3.0 MB'`` (powers of 1024)."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
