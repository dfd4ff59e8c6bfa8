"""A step run on CPU ranks, replayed on a GPU cluster's clock: a timeline, a picture, a Chrome/Perfetto trace.

A step measured by :func:`helpers.planrun.measure` knows, for every rank, the order of its work: each
micro-batch's forward and backward, and every collective and message inside them, with how long the
CPU spent between them. :func:`replay` keeps that order and puts it on another machine's clock:

- each forward or backward costs the FLOPs a planned model does there (:func:`helpers.steptime.stage_flops`,
  for the model you name: the order is the small run's, the sizes the big model's), spread over the
  pieces between its collectives as the CPU's time was;
- each collective's bytes are the CPU run's, scaled by the big model's plan for that collective and mesh
  dimension (``plan_traffic``), and cost :func:`helpers.costmodel.seconds` on the cluster's links;
- a collective starts when every rank of its group has reached it; tensor and context parallel ones, and
  ZeRO's all-gathers of weights, stall the rank's compute (the *compute* lane: issued where the CPU run
  issued them, with no prefetching), gradient reductions run beside it on a *comm* lane (GPUs give them a
  stream of their own) until the optimizer needs them; a message arrives when
  its sender sent it plus its time on the link, and a receive waits for it.

:class:`Timeline` holds the result: :meth:`~Timeline.plot` draws it, :meth:`~Timeline.to_chrome` writes
it as a Chrome trace (``{"traceEvents": [...]}``: open it at https://ui.perfetto.dev or chrome://tracing),
and :meth:`~Timeline.summary` gives the step time, the idle time of each rank's compute (the pipeline's
bubble among it) and the communication that stalled it.

Example (no ranks needed: one rank that computes, then waits for a message that is sent to it)::

    >>> from helpers.plan import Layout, Model, h100_cluster
    >>> programs = [[Op("compute", "F0", cpu=1.0), Op("send", "F0", peer=1, nbytes=1e6)],
    ...             [Op("recv", "F0", peer=0), Op("compute", "F0", cpu=1.0)]]
    >>> t = simulate(programs, {0: {"F0": 0.5}, 1: {"F0": 0.5}}, lambda op: 0.25)
    >>> round(t.step, 2), [round(s.start, 2) for s in t.spans if s.rank == 1]
    (1.25, [0.75])
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .costmodel import seconds
from .memrec import collective, ring_bytes
from .plan import Cluster, Layout, Model
from .steptime import link_of, stage_flops

__all__ = ["Op", "Span", "Timeline", "program_of", "replay", "simulate", "COLOURS"]

COLOURS = {"forward": "#74c476", "backward": "#31a354", "all_gather": "#6baed6", "reduce_scatter": "#fd8d3c",
           "all_reduce": "#9e9ac8", "send": "#e377c2", "recv": "#e377c2", "optimizer": "#bdbdbd"}


@dataclass
class Op:
    """One item of a rank's program: "compute" (``cpu`` seconds on the CPU), "coll" (a collective of ``op`` over
    ``group``, ``nbytes`` sent, on ``lane`` "compute" or "comm"), "send"/"recv" (to or from ``peer``), or
    "wait" (the compute lane waits for the comm lane)."""

    kind: str
    phase: str
    cpu: float = 0.0
    op: str = ""
    dims: str = ""
    group: tuple = ()
    nbytes: float = 0.0
    peer: int | None = None
    lane: str = "compute"


@dataclass
class Span:
    rank: int
    lane: str
    label: str
    kind: str
    start: float
    end: float


@dataclass
class Timeline:
    """Every rank's spans on the replayed clock (seconds)."""

    world: int
    spans: list[Span]
    step: float
    meta: dict = field(default_factory=dict)

    def busy(self, rank: int, lane: str = "compute", kinds: tuple = ("forward", "backward")) -> float:
        return sum(s.end - s.start for s in self.spans if s.rank == rank and s.lane == lane and s.kind in kinds)

    def summary(self) -> dict[str, Any]:
        """The step, and per rank its compute, the communication that stalled it and its idle time."""
        rows = []
        for r in range(self.world):
            compute = self.busy(r)
            stalled = self.busy(r, kinds=("all_gather", "reduce_scatter", "all_reduce"))
            rows.append({"rank": r, "compute": compute, "stalled": stalled,
                         "idle": max(0.0, self.step - compute - stalled)})
        return {"step": self.step, "ranks": rows}

    def to_chrome(self, path: str | Path) -> Path:
        """Write the timeline as a Chrome trace (one process per rank, one thread per lane; microseconds)."""
        events: list[dict[str, Any]] = []
        for r in range(self.world):
            events.append({"name": "process_name", "ph": "M", "pid": r, "args": {"name": f"rank {r}"}})
            for tid, lane in enumerate(("compute", "comm")):
                events.append({"name": "thread_name", "ph": "M", "pid": r, "tid": tid, "args": {"name": lane}})
        for s in self.spans:
            events.append({"name": s.label, "cat": s.kind, "ph": "X", "pid": s.rank,
                           "tid": 0 if s.lane == "compute" else 1, "ts": s.start * 1e6,
                           "dur": max(0.0, s.end - s.start) * 1e6})
        path = Path(path)
        path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms", "otherData": self.meta}))
        return path

    def plot(self, ax: Any = None, title: str | None = None) -> Any:
        """Each rank's two lanes, one bar per span, coloured by kind; returns the figure."""
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch

        if ax is None:
            _, ax = plt.subplots(figsize=(11, 0.6 + 0.55 * self.world))
        scale, unit = (1e3, "ms") if self.step < 10 else (1, "s")
        for s in self.spans:
            y = s.rank + (0.0 if s.lane == "compute" else 0.42)
            ax.barh(y, (s.end - s.start) * scale, left=s.start * scale, height=0.38 if s.lane == "compute" else 0.2,
                    color=COLOURS.get(s.kind, "#969696"), edgecolor="none")
        ax.set_yticks(range(self.world))
        ax.set_yticklabels([f"rank {r}" for r in range(self.world)])
        ax.invert_yaxis()
        ax.set_xlabel(f"{unit} on the replayed clock")
        kinds = sorted({s.kind for s in self.spans})
        ax.legend([Patch(color=COLOURS.get(k, "#969696")) for k in kinds], [k.replace("_", "-") for k in kinds],
                  fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.set_title(title or f"one step: {self.step * scale:.1f} {unit}", fontsize=10)
        ax.figure.tight_layout()
        plt.close(ax.figure)
        return ax.figure


def program_of(step: dict, layout: Layout, rank: int) -> list[Op]:
    """A rank's program from its measured step (``Measured.steps[rank]``: phases and calls, in CPU seconds)."""
    calls = [c for c in step["calls"] if c[0] not in ("barrier", "monitored_barrier")]
    ops: list[Op] = []
    for label, start, end in step["phases"]:
        inside = [c for c in calls if start <= c[4] <= end]
        at = start
        for op, group, peer, nbytes, began, ended, sync in inside:
            ops.append(Op("compute", label, cpu=max(0.0, began - at)))
            kind = collective(op)
            if op in ("recv", "irecv"):
                ops.append(Op("recv", label, peer=peer))
            elif kind == "send":
                ops.append(Op("send", label, peer=peer, nbytes=float(nbytes or 0), dims="pp"))
            elif kind is not None:
                members = tuple(group) if group else tuple(range(layout.world))
                dims = layout.grad_dim if sync else layout.dims_of(list(members))
                behind = sync and kind != "all_gather"     # gradients reduce beside compute; weights are waited for
                ops.append(Op("coll", label, op=kind, dims=dims, group=members, lane="comm" if behind else "compute",
                              nbytes=ring_bytes(op, nbytes or 0, len(members))))
            at = max(at, ended)
        ops.append(Op("compute", label, cpu=max(0.0, end - at)))
        if label == "sync":
            ops.append(Op("wait", label))
    return ops


def simulate(programs: list[list[Op]], phase_seconds: dict[int, dict[str, float]],
             comm_seconds: Callable[[Op], float]) -> Timeline:
    """Play the programs: each phase's compute takes ``phase_seconds[rank][phase]``, spread over its pieces as
    their ``cpu`` times were; a collective, send or message takes ``comm_seconds(op)``."""
    world = len(programs)
    share: dict[tuple[int, str], float] = {}
    for r, prog in enumerate(programs):
        for op in prog:
            if op.kind == "compute":
                share[(r, op.phase)] = share.get((r, op.phase), 0.0) + op.cpu
    pieces = {(r, p): sum(1 for o in programs[r] if o.kind == "compute" and o.phase == p) for r, p in share}
    comp, comm = [0.0] * world, [0.0] * world
    pos = [0] * world
    spans: list[Span] = []
    posted: dict[tuple, dict[int, float]] = {}          # a collective instance -> when each member reached it
    lanes: dict[tuple, tuple[str, str, str]] = {}
    counts: dict[tuple, int] = {}
    keys: dict[tuple[int, int], tuple] = {}
    resolved: dict[tuple, float] = {}
    mine: list[list[tuple]] = [[] for _ in range(world)]
    messages: dict[tuple[int, int], list[float]] = {}
    received: dict[tuple[int, int], int] = {}

    def resolve(key: tuple, op: Op) -> None:
        if key in resolved or len(posted[key]) < len(op.group):
            return
        start = max(posted[key].values())
        if op.lane == "comm":                            # after the members' earlier exchanges
            start = max([start] + [comm[m] for m in op.group])
        end = start + comm_seconds(op)
        resolved[key] = end
        for m in op.group:
            if op.lane == "comm":
                comm[m] = end
            spans.append(Span(m, op.lane, f"{op.op} over {op.dims}", op.op, start, end))

    progress = True
    while progress:
        progress = False
        for r in range(world):
            while pos[r] < len(programs[r]):
                op = programs[r][pos[r]]
                if op.kind == "compute":
                    total = share.get((r, op.phase), 0.0)
                    frac = op.cpu / total if total > 0 else 1 / max(1, pieces[(r, op.phase)])
                    d = phase_seconds.get(r, {}).get(op.phase, 0.0) * frac
                    if d > 0:
                        kind = "forward" if op.phase.startswith("F") else "backward" if op.phase.startswith("B") \
                            else "optimizer"
                        spans.append(Span(r, "compute", op.phase, kind, comp[r], comp[r] + d))
                    comp[r] += d
                elif op.kind == "send":
                    took = comm_seconds(op)
                    messages.setdefault((r, op.peer), []).append(comp[r] + took)
                    spans.append(Span(r, "comm", f"send to rank {op.peer}", "send", comp[r], comp[r] + took))
                elif op.kind == "recv":
                    k = received.get((op.peer, r), 0)
                    arrivals = messages.get((op.peer, r), [])
                    if k >= len(arrivals):
                        break
                    received[(op.peer, r)] = k + 1
                    comp[r] = max(comp[r], arrivals[k])
                elif op.kind == "wait":
                    if any(key not in resolved for key in mine[r]):
                        break
                    comp[r] = max([comp[r]] + [resolved[key] for key in mine[r]])
                else:
                    key = keys.get((r, pos[r]))
                    if key is None:
                        n = counts.get((r, op.group), 0)
                        counts[(r, op.group)] = n + 1
                        key = keys[(r, pos[r])] = (op.group, n)
                        posted.setdefault(key, {})[r] = comp[r]
                        if op.lane == "comm":
                            mine[r].append(key)
                    resolve(key, op)
                    if op.lane == "compute":
                        if key not in resolved:
                            break
                        comp[r] = resolved[key]
                pos[r] += 1
                progress = True
    stuck = [r for r in range(world) if pos[r] < len(programs[r])]
    if stuck:
        raise RuntimeError(f"the replay could not go on: ranks {stuck} wait for one another")
    step = max(max(comp), max(comm))
    return Timeline(world, sorted(spans, key=lambda s: (s.rank, s.start)), step)


def replay(measured: Any, model: Model, cluster: Cluster, plan_traffic: Callable | None = None,
           efficiency: float = 1.0, flops: float | None = None, links: dict | None = None) -> Timeline:
    """``measured`` (a :class:`helpers.planrun.Measured`) on ``cluster``'s clock, sized as ``model`` under the same
    layout (see the module docstring). Without ``plan_traffic`` the bytes stay the measured ones."""
    layout = measured.layout
    rate = flops or cluster.flops * efficiency
    programs = [program_of(measured.steps[r], layout, r) for r in range(layout.world)]
    for stage in range(layout.pp):          # one stage's ranks do the same work: split it as they did on average
        ranks = layout.stage_ranks(stage)
        if len({len(programs[r]) for r in ranks}) == 1:
            for i, op in enumerate(programs[ranks[0]]):
                if op.kind == "compute":
                    mean = sum(programs[r][i].cpu for r in ranks) / len(ranks)
                    for r in ranks:
                        programs[r][i].cpu = mean
    planned = plan_traffic(model, layout) if plan_traffic else None
    phase_seconds: dict[int, dict[str, float]] = {}
    for r in range(layout.world):
        stage = layout.coords(r)["pp"]
        f = stage_flops(model, layout, stage)
        phase_seconds[r] = {f"F{i}": f["forward"] / rate for i in range(layout.microbatches)}
        phase_seconds[r].update({f"B{i}": (f["backward"] + f["recompute"]) / rate for i in range(layout.microbatches)})
    scale: dict[tuple[int, str, str], float] = {}
    if planned:
        for r in range(layout.world):
            stage = layout.coords(r)["pp"]
            for key, small in measured.traffic[r].items():
                scale[(r, *key)] = planned[stage].get(key, small) / small if small else 1.0

    sends = [v for (_, k, _), v in scale.items() if k == "send"]

    def comm_seconds(op: Op) -> float:
        kind = "send" if op.kind == "send" else op.op
        if kind == "send":                           # every message of a micro-batch has the same size
            nbytes = op.nbytes * (max(sends) if sends else 1.0)
        else:                                        # a group's ranks sit on one stage: its scale is theirs
            nbytes = op.nbytes * scale.get((op.group[0], kind, op.dims), 1.0)
        link = (links or {}).get(kind) or link_of(layout, op.dims, cluster)
        return seconds(kind, len(op.group) if op.group else 2, nbytes, link)

    timeline = simulate(programs, phase_seconds, comm_seconds)
    timeline.meta = {"model": model.name, "layout": layout.describe(), "cluster": cluster.name}
    return timeline
