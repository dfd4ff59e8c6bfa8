"""Explore layouts: the memory bars of every pipeline stage and the predicted step, redrawn as controls move.

:func:`draw` draws one layout: for each stage a bar of the bytes one of its ranks needs, split into the
four categories, beside the GPU's memory, and the predicted step (:func:`helpers.steptime.predict`) in the
title; a layout that does not fit says so in red, naming the rank and the largest category. It takes the
plan as two functions, so the pictures are of *your* planner.

:func:`explore` puts controls (tp, pp, cp, ZeRO stage, micro-batches, recomputation, sequence length) above
it where widgets can be shown: a notebook in JupyterLab, Jupyter Notebook or Colab
(:func:`helpers.view.choose_view`). Elsewhere (nbconvert, nbgrader, the course's website) it draws the
starting layout and says that the controls need a live notebook.

Example, with ``plan_memory`` and ``plan_traffic`` your answers to Exercises 12.1 and 12.2 (the course's
tests pass the instructor's, ``autograder.answers.lesson12``, which learners do not get)::

    >>> from helpers.plan import LLAMA3_8B, Layout, h100_cluster
    >>> plan_memory, plan_traffic = your_plan_memory, your_plan_traffic  # doctest: +SKIP
    >>> fig = draw(LLAMA3_8B.with_(batch=64), Layout(dp=8, tp=8, zero=3, microbatches=8), h100_cluster(64),
    ...            plan_memory, plan_traffic)
    >>> "fits" in fig.axes[0].get_title()
    True
"""

from __future__ import annotations

import textwrap
from typing import Any, Callable

from .plan import CATEGORIES, Cluster, Layout, Model, divisors
from .steptime import predict

__all__ = ["draw", "explore", "COLOURS"]

COLOURS = {"parameters": "#1f77b4", "gradients": "#ff7f0e", "optimizer": "#2ca02c", "activations": "#9467bd"}
GIB = 2**30


def draw(model: Model, layout: Layout, cluster: Cluster, plan_memory: Callable, plan_traffic: Callable,
         ax: Any = None, **options: Any) -> Any:
    """One layout's memory per stage and predicted step; returns the figure."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.6))
    try:
        p = predict(model, layout, cluster, plan_memory, plan_traffic, **options)
    except NotImplementedError as err:
        ax.text(0.5, 0.5, f"your planner does not run yet:\n{err}", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        plt.close(ax.figure)
        return ax.figure
    bottom = [0.0] * layout.pp
    for k in CATEGORIES:
        values = [p.memory[s][k] / GIB for s in range(layout.pp)]
        ax.bar(range(layout.pp), values, bottom=bottom, color=COLOURS[k], label=k, width=0.6)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.axhline(cluster.memory / GIB, color="red" if not p.fits else "black", linestyle="--", lw=1,
               label=f"GPU memory ({cluster.memory / GIB:.0f} GiB)")
    ax.set_xticks(range(layout.pp))
    ax.set_xticklabels([f"stage {s}" if layout.pp <= 8 else str(s) for s in range(layout.pp)])
    if layout.pp > 8:
        ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per rank")
    if p.fits:
        title = (f"fits: step {p.step * 1e3:,.0f} ms, MFU {p.mfu:.0%} (bubble {p.bubble * 1e3:,.0f} ms, exposed "
                 f"tp/cp {p.exposed_comm * 1e3:,.0f} ms, dp {p.exposed_dp * 1e3:,.0f} ms)")
        ax.set_title(textwrap.fill(title, 90), fontsize=9)
    else:
        rank, stage, category, over = p.overflow
        ax.set_title(textwrap.fill(f"does not fit: rank {rank} (stage {stage}) needs {over / GIB:.1f} GiB more than "
                                   f"the GPU has; {category} is the largest part", 90), fontsize=9, color="red")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.figure.suptitle(textwrap.fill(f"{model.name}, seq {model.seq:,}, {model.batch} sequences a step, on "
                                     f"{cluster.name}: {layout.describe()}", 100), fontsize=9)
    ax.figure.tight_layout()
    plt.close(ax.figure)
    return ax.figure


def explore(model: Model, cluster: Cluster, plan_memory: Callable, plan_traffic: Callable,
            layout: Layout | None = None, interactive: bool | None = None, **options: Any) -> Any:
    """Controls above :func:`draw` where widgets show; the starting layout's picture elsewhere."""
    from .view import choose_view

    layout = layout or Layout(dp=cluster.gpus, microbatches=1, micro_batch=max(1, model.batch // cluster.gpus))
    if interactive is None:
        interactive = choose_view() == "widgets"
    if not interactive:
        print("(The controls need a live notebook with widgets; this is the starting layout.)")
        return draw(model, layout, cluster, plan_memory, plan_traffic, **options)
    import ipywidgets as widgets
    from IPython.display import display

    def choice(name: str, values: list, value: Any) -> Any:
        return widgets.Dropdown(options=values, value=value if value in values else values[0], description=name,
                                layout=widgets.Layout(width="170px"))

    tp = choice("tp", divisors(cluster.gpus_per_node), layout.tp)
    pp = choice("pp", [d for d in divisors(model.layers) if d <= 32], layout.pp)
    cp = choice("cp", [d for d in (1, 2, 4, 8, 16, 32) if model.seq % d == 0], layout.cp)
    zero = widgets.ToggleButtons(options=[0, 1, 2, 3], value=layout.zero, description="ZeRO",
                                 style={"button_width": "40px"})
    micro = widgets.IntSlider(value=layout.microbatches, min=1, max=64, description="micro-batches")
    recompute = widgets.ToggleButtons(options=["none", "selective", "full"], value=layout.recompute,
                                      description="recompute", style={"button_width": "80px"})
    seq = choice("seq", sorted({model.seq, 2048, 4096, 8192, 16384, 32768, 65536, 131072}), model.seq)
    note, out = widgets.HTML(), widgets.Output()

    def show(change: Any = None) -> None:
        import matplotlib.pyplot as plt

        with out:
            out.clear_output(wait=True)
            dp, rest = divmod(cluster.gpus, tp.value * pp.value * cp.value)
            m = model.with_(seq=seq.value)
            if rest or dp < 1 or m.batch % (dp * micro.value):
                note.value = (f"<span style='color:red'>{cluster.gpus} GPUs / (tp x pp x cp) = {cluster.gpus} / "
                              f"{tp.value * pp.value * cp.value} leaves no whole dp that splits {m.batch} sequences "
                              f"into {micro.value} micro-batches: pick other degrees</span>")
                return
            note.value = f"dp = {dp}, {m.batch // (dp * micro.value)} sequence(s) per micro-batch"
            chosen = layout.with_(dp=dp, tp=tp.value, pp=pp.value, cp=cp.value, zero=zero.value,
                                  microbatches=micro.value, micro_batch=m.batch // (dp * micro.value),
                                  recompute=recompute.value, layers_per_stage=None)
            try:
                display(draw(m, chosen, cluster, plan_memory, plan_traffic, **options))
            except ValueError as err:
                note.value = f"<span style='color:red'>{err}</span>"
            plt.close("all")

    for control in (tp, pp, cp, zero, micro, recompute, seq):
        control.observe(show, names="value")
    show()
    box = widgets.VBox([widgets.HBox([tp, pp, cp, seq]), zero, recompute, micro, note, out])
    display(box)
    return None
