"""The launch benchmark's targets and its report: what bench/launch_bench.py prints.

:func:`evaluate` judges the results against the targets (reported, not enforced); :func:`render`
turns the whole run (machine, load, the CPU other processes took, every timing, the targets)
into the table printed on stdout, ending in the ``RESULT:`` line.

Example (targets of a run without baselines)::

    >>> one = {"median": 0.1, "min": 0.1, "max": 0.1, "n": 1, "samples": [0.1]}
    >>> results = {"warm": {"2": one, "4": one}, "cold": {n: {"launch_s": one} for n in ("2", "4")}}
    >>> [t["passed"] for t in evaluate(results)]
    [True, None, True, True]
"""

from __future__ import annotations

from _common import NOISY_SHARE

__all__ = ["TARGET_WARM_4_S", "TARGET_RATIO_4", "TARGET_COLD_S", "evaluate", "render"]

TARGET_WARM_4_S = 0.15
TARGET_RATIO_4 = 10.0
TARGET_COLD_S = 2.5


def evaluate(results: dict) -> list[dict]:
    """Each target, its measured value and whether it was met (None: not measured)."""
    targets = []
    warm4 = results["warm"]["4"]["median"]
    targets.append({
        "name": "warm 4-rank median",
        "value": warm4, "limit": TARGET_WARM_4_S, "unit": "s", "op": "<=",
        "passed": warm4 <= TARGET_WARM_4_S,
    })
    ratio4 = (results.get("ratio_spawn_over_warm") or {}).get("4")
    targets.append({
        "name": "mp.spawn / warm, 4 ranks (medians)",
        "value": ratio4, "limit": TARGET_RATIO_4, "unit": "x", "op": ">=",
        "passed": None if ratio4 is None else ratio4 >= TARGET_RATIO_4,
        **({"note": "not measured (--no-baselines)"} if ratio4 is None else {}),
    })
    for n, cold_n in results["cold"].items():
        cold = cold_n["launch_s"]["median"]
        targets.append({
            "name": f"cold (a) median, {n} ranks",
            "value": cold, "limit": TARGET_COLD_S, "unit": "s", "op": "<=",
            "passed": cold <= TARGET_COLD_S,
        })
    return targets


def render(data: dict) -> str:
    """The report of a whole run, as printed."""
    m, r = data["machine"], data["results"]
    world_sizes = data["settings"]["world_sizes"]
    lines = []
    lines.append("helpers.launch benchmark (trivial fn: one all_reduce of a 1-element tensor)")
    lines.append(
        f"machine: {m['cpu_model']}, {m['cores']} cores ({m['usable_cores']} usable), "
        f"Python {m['python']}, torch {m['torch']}"
    )
    la0, la1 = data["load_before"], data["load_after"]
    if la0 is not None:
        lines.append(f"load average (1 min): {la0:.2f} before, {la1:.2f} after")
    phases = data.get("interference") or {}
    if phases:
        lines.append(
            "CPU used by other processes while measuring: "
            + ", ".join(f"{name} {p['other_share'] * 100:.0f}%" for name, p in phases.items())
            + " of the machine"
        )
        noisy = [name for name, p in phases.items() if p["other_share"] > NOISY_SHARE]
        if noisy:
            lines.append(
                f"WARNING: the machine was busy with other work during {', '.join(noisy)}; "
                "those timings are noisy -- re-run on an idle machine"
            )
    lines.append("")

    head = f"{'wall time, seconds':<34}"
    sub = f"{'':<34}"
    for n in world_sizes:
        head += f"{f'{n} ranks':^30}"
        sub += f"{'median':>8}{'min':>8}{'max':>8}{'n':>4}  "
    lines += [head, sub, "-" * len(sub.rstrip())]

    def row(label: str, per_n: dict | None, note: str = "") -> None:
        text = f"{label:<34}"
        for n in world_sizes:
            s = (per_n or {}).get(str(n))
            if s is None or "skipped" in s:
                text += f"{'-':>8}{'-':>8}{'-':>8}{'':>4}  "
            else:
                text += f"{s['median']:8.3f}{s['min']:8.3f}{s['max']:8.3f}{s['n']:4d}  "
        lines.append(text.rstrip() + (f"  {note}" if note else ""))

    cold = r["cold"]
    row("cold (a) import helpers -> return", {k: v["launch_s"] for k, v in cold.items()})
    row("cold (b) whole subprocess", {k: v["process_s"] for k, v in cold.items()})
    notebook = r.get("notebook") or {}
    row("notebook: set-up cell", {k: v["setup_s"] for k, v in notebook.items()})
    row("notebook: first launch cell", {k: v["first_launch_s"] for k, v in notebook.items()})
    row("warm launch", r["warm"])
    row("torch.multiprocessing.spawn", r.get("spawn"))
    row("torchrun --standalone", r.get("torchrun"))
    ratio = r.get("ratio_spawn_over_warm")
    text = f"{'ratio spawn / warm (medians)':<34}"
    for n in world_sizes:
        v = (ratio or {}).get(str(n))
        text += f"{(f'{v:.1f}x' if v is not None else '-'):>8}{'':>22}"
    lines.append(text.rstrip())
    lines.append("")

    before = any(v["torch_imported_before_launch"] for v in cold.values())
    after = any(v["torch_imported_after_launch"] for v in cold.values())
    lines.append(
        f"cold subprocess: torch imported in its main process before launch: {'yes' if before else 'no'}; "
        f"after launch: {'yes' if after else 'no'}"
    )
    lines.append(f"warm: rank factory ready {data['warm_info']['factory_ready_s']:.3f} s after import in this process")
    if r.get("spawn") is None:
        lines.append("baselines: skipped (--no-baselines)")
    for n in world_sizes:
        tr = (r.get("torchrun") or {}).get(str(n))
        if tr and "skipped" in tr:
            lines.append(f"torchrun {n} ranks skipped: {tr['skipped']}")
    lines.append("")

    lines.append("targets:")
    for t in data["targets"]:
        if t["passed"] is None:
            lines.append(f"  SKIP  {t['name']}: {t.get('note', 'not measured')}")
            continue
        value = f"{t['value']:.1f}x" if t["unit"] == "x" else f"{t['value']:.3f} s"
        limit = f"{t['limit']:.0f}x" if t["unit"] == "x" else f"{t['limit']:.2f} s"
        lines.append(f"  {'PASS' if t['passed'] else 'FAIL'}  {t['name']}: {value} {t['op']} {limit}")
    failed = [t for t in data["targets"] if t["passed"] is False]
    checked = [t for t in data["targets"] if t["passed"] is not None]
    if failed:
        lines.append(
            f"RESULT: FAIL -- {len(failed)} of {len(checked)} targets missed: "
            + "; ".join(t["name"] for t in failed)
        )
    else:
        skipped = len(data["targets"]) - len(checked)
        lines.append(
            f"RESULT: PASS -- all {len(checked)} targets checked were met"
            + (f" ({skipped} skipped)" if skipped else "")
        )
    return "\n".join(lines)
