"""A pipeline run replayed on a logical clock: each step's exact time, the bubble, the activations held.

Wall-clock pictures of a pipeline on a shared CPU are mostly noise: a rank that waits 3 ms
for a message may have waited for the scheduler, not for the pipeline. A logical clock
gives the schedule's own timing instead. Every rank's program (what
:meth:`helpers.pipeline.Stage.record` returns: its forwards, backwards, sends and
receives, in the order it ran them) is replayed with fixed costs: a forward takes 1 unit, a
backward 2, a message takes none. A rank's clock moves on with each step it computes; a
send carries the sender's clock; a receive sets the receiver's clock to the later of its own
and the message's. So each step starts as early as the rank's own order and the data it
waited for allow, and the result depends only on what the program did, never on the machine.
Messages pair up as in :meth:`helpers.trace.Trace.matched_messages`: the k-th send from a to b
with a tag meets the k-th receive on b from a with that tag. A split backward costs 1 for the
input's gradient and 1 for the weights' (``backward_input``, ``backward_weight``); a rank that
holds several chunks of the model runs each step on one of them, at the same costs.

With p stages and m micro-batches, all forwards and then all backwards (GPipe) take
(m + p - 1) x 3 units and each rank computes for 3m of them: the *bubble*, the share of
the ranks' time spent idle, is (p - 1) / (m + p - 1). 1F1B has the same. With v chunks per rank
the fill and drain take p - 1 chunk-steps instead of p - 1 stage-steps: (p - 1) / (v m + p - 1).
With the backward split, the zero-bubble schedule ZB-H1 leaves (p - 1) / (3m + p - 1).

Example::

    >>> gpipe = [{"rank": 0, "num_stages": 2, "program": [("forward", 0), ("send", 1, 0, 8), ("recv", 1, 0, 8), ("backward", 0)]},
    ...          {"rank": 1, "num_stages": 2, "program": [("recv", 0, 0, 8), ("forward", 0), ("backward", 0), ("send", 0, 0, 8)]}]
    >>> run = Schedule(gpipe)
    >>> run.makespan, run.bubble, Schedule.gpipe_bubble(2, 1)
    (6, Fraction(1, 2), Fraction(1, 2))
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Sequence

__all__ = ["Schedule", "Step", "COSTS"]

#: Logical time units of each kind of step (a backward costs about twice a forward; split, its two
#: halves, the input's gradient and the weights', one each).
COSTS = {"forward": 1, "backward": 2, "backward_input": 1, "backward_weight": 1}
_LETTERS = {"forward": "F", "backward": "B", "backward_input": "B", "backward_weight": "W"}


@dataclass(frozen=True)
class Step:
    """One forward or backward of one micro-batch on one stage, at its logical time."""

    rank: int
    kind: str
    microbatch: int
    start: int
    end: int
    held: int | None = None  # activations the stage held after it, where the record says
    chunk: int | None = None  # which of the rank's chunks, when it holds several

    @property
    def label(self) -> str:
        """``"F3"``, ``"B3"`` (a whole or an input-gradient backward) or ``"W3"``; ``"F3b"`` on chunk 1."""
        return f"{_LETTERS.get(self.kind, self.kind[0].upper())}{self.microbatch}" + (
            "abcdefghij"[self.chunk] if self.chunk is not None else "")


class Schedule:
    """The logical-clock replay of a pipeline run: one record per rank (:meth:`helpers.pipeline.Stage.record`)."""

    def __init__(self, records: Sequence[dict[str, Any]], costs: dict[str, int] | None = None) -> None:
        self.costs = dict(COSTS if costs is None else costs)
        self.records = sorted(records, key=lambda r: r["rank"])
        self.num_stages = len(self.records)
        self.steps: list[Step] = []
        self.unmatched: list[tuple[int, tuple]] = []  # receives no send matched: (rank, entry)
        self._replay()

    def _replay(self) -> None:
        programs = {rec["rank"]: list(rec["program"]) for rec in self.records}
        alive = {rec["rank"]: list(rec.get("alive") or []) for rec in self.records}
        sends = Counter((r, e[1], e[2]) for r, prog in programs.items() for e in prog if e[0] == "send")
        clock, pos, done_steps = dict.fromkeys(programs, 0), dict.fromkeys(programs, 0), dict.fromkeys(programs, 0)
        stamps: dict[tuple, int] = {}
        sent: Counter = Counter()
        received: Counter = Counter()
        while any(pos[r] < len(programs[r]) for r in programs):
            moved = False
            for r, prog in programs.items():
                while pos[r] < len(prog):
                    entry = prog[pos[r]]
                    kind = entry[0]
                    if kind in self.costs:
                        held = alive[r][done_steps[r]] if done_steps[r] < len(alive[r]) else None
                        start = clock[r]
                        clock[r] += self.costs[kind]
                        chunk = entry[2] if len(entry) > 2 else None
                        self.steps.append(Step(r, kind, entry[1], start, clock[r], held, chunk))
                        done_steps[r] += 1
                    elif kind == "send":
                        key = (r, entry[1], entry[2])
                        stamps[key + (sent[key],)] = clock[r]
                        sent[key] += 1
                    elif kind == "recv":
                        key = (entry[1], r, entry[2])
                        k = received[key]
                        if key + (k,) in stamps:
                            clock[r] = max(clock[r], stamps[key + (k,)])
                        elif k < sends[key]:
                            break  # its message is not stamped yet: let the sender catch up
                        else:
                            self.unmatched.append((r, tuple(entry)))
                        received[key] += 1
                    pos[r] += 1
                    moved = True
            if not moved:
                stuck = {r: programs[r][pos[r]] for r in programs if pos[r] < len(programs[r])}
                raise ValueError(f"the records wait on each other in a cycle (rank: next entry): {stuck}; "
                                 "were they recorded in one run?")

    # -- what the replay says ------------------------------------------------------------

    @property
    def makespan(self) -> int:
        """Logical units from the first step's start to the last step's end."""
        return max((s.end for s in self.steps), default=0)

    def busy(self, rank: int) -> int:
        """Units rank ``rank`` spent computing."""
        return sum(s.end - s.start for s in self.steps if s.rank == rank)

    @property
    def bubble(self) -> Fraction:
        """The share of the ranks' time spent idle, exactly: idle units / (stages x makespan)."""
        total = self.num_stages * self.makespan
        if total == 0:
            return Fraction(0)
        return Fraction(total - sum(self.busy(r) for r in range(self.num_stages)), total)

    @staticmethod
    def gpipe_bubble(num_stages: int, num_microbatches: int) -> Fraction:
        """GPipe's bubble, (p - 1) / (m + p - 1)."""
        return Fraction(num_stages - 1, num_microbatches + num_stages - 1)

    @staticmethod
    def interleaved_bubble(num_stages: int, num_microbatches: int, num_chunks: int) -> Fraction:
        """An interleaved schedule's bubble with v chunks per rank, (p - 1) / (v m + p - 1).

        >>> Schedule.interleaved_bubble(4, 8, 2)
        Fraction(3, 19)
        """
        return Fraction(num_stages - 1, num_chunks * num_microbatches + num_stages - 1)

    @staticmethod
    def zero_bubble_h1_bubble(num_stages: int, num_microbatches: int) -> Fraction:
        """ZB-H1's bubble on this clock, (p - 1) / (3m + p - 1): a third of 1F1B's idle time.

        >>> Schedule.zero_bubble_h1_bubble(4, 8)
        Fraction(1, 9)
        """
        return Fraction(num_stages - 1, 3 * num_microbatches + num_stages - 1)

    def for_rank(self, rank: int) -> list[Step]:
        """Rank ``rank``'s steps, in the order it ran them."""
        return [s for s in self.steps if s.rank == rank]

    def peak_held(self, rank: int) -> int:
        """The most micro-batches' activations rank ``rank`` held at once (from its record)."""
        return max((s.held or 0 for s in self.for_rank(rank)), default=0)

    def lanes(self, width: int | None = None) -> str:
        """A text picture: one line per stage, one column per unit (``.`` = idle).

        >>> print(Schedule([{"rank": 0, "num_stages": 1, "program": [("forward", 0), ("backward", 0)]}]).lanes())
        stage 0 | F0 B0 B0
        """
        width = width or 1 + max((len(s.label) for s in self.steps), default=2)
        rows = []
        for r in range(self.num_stages):
            cells = ["." .ljust(width - 1)] * self.makespan
            for s in self.for_rank(r):
                for t in range(s.start, s.end):
                    cells[t] = s.label.ljust(width - 1)
            rows.append(f"stage {r} | " + " ".join(cells).rstrip())
        return "\n".join(rows)

    # -- pictures ------------------------------------------------------------------------

    def plot(self, ax: Any = None, title: str | None = None):
        """Each stage's steps on the logical clock: forwards light, backwards dark, idle time hatched."""
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch

        own = ax is None
        if own:
            fig, ax = plt.subplots(figsize=(min(14, 1.5 + 0.35 * self.makespan), 0.8 + 0.55 * self.num_stages))
        colors = {"forward": "#9ecae1", "backward": "#3182bd", "backward_input": "#3182bd",
                  "backward_weight": "#31a354"}
        for r in range(self.num_stages):
            ax.barh(r, self.makespan, left=0, height=0.6, color="white", hatch="///", edgecolor="#bbbbbb", linewidth=0)
            for s in self.for_rank(r):
                ax.barh(r, s.end - s.start, left=s.start, height=0.6, color=colors.get(s.kind, "#cccccc"),
                        edgecolor="black", linewidth=0.5, alpha=0.55 if s.chunk else 1.0)
                ax.text((s.start + s.end) / 2, r, s.label[1:] if s.chunk is not None else str(s.microbatch),
                        ha="center", va="center", fontsize="small",
                        color="white" if s.kind in ("backward", "backward_input") and not s.chunk else "black")
        ax.set_yticks(range(self.num_stages))
        ax.set_yticklabels([f"stage {r}" for r in range(self.num_stages)])
        ax.set_ylim(self.num_stages - 0.5, -0.5)
        ax.set_xlim(0, self.makespan)
        ax.set_xlabel("logical time (a forward = 1 unit, a backward = 2)")
        ax.set_title(title or f"{self.num_stages} stages: bubble {self.bubble} = {float(self.bubble):.0%} of the time")
        kinds = {s.kind for s in self.steps}
        handles = [Patch(color=colors["forward"], label="forward"),
                   Patch(color=colors["backward"], label="backward (input's gradient)" if "backward_weight" in kinds
                         else "backward")]
        if "backward_weight" in kinds:
            handles.append(Patch(color=colors["backward_weight"], label="weights' gradient"))
        if any(s.chunk for s in self.steps):
            handles.append(Patch(facecolor="#cccccc", alpha=0.55, label="paler: a later chunk"))
        handles.append(Patch(facecolor="white", hatch="///", edgecolor="#bbbbbb", label="idle (bubble)"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
        if own:
            fig.tight_layout()
            plt.close(fig)
            return fig
        return ax.figure
