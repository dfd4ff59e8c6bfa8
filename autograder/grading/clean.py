"""Grade a submission again in a clean process that holds only the learner's definitions.

The hidden test cells of a notebook run in the learner's own kernel, after all of the
learner's cells: whatever those cells did to the kernel (replacing a check function of
``autograder.lessons.lessonNN``, ``helpers.launch`` or ``torch.distributed``) is in force while
their grade is computed there. ``make grade`` therefore decides every graded part here
instead, in a fresh process (inside the grading sandbox, see :mod:`autograder.grading.sandbox`):
the notebook's definitions alone (:mod:`autograder.learner.definitions`, the reading
``make check`` shares), defined in a fresh ``__main__`` namespace, and every graded part's
hidden check run on them (:func:`grade_lesson`), exactly as the hidden test cell would. The
learner's functions run only on the fresh ranks the checks start, never in this process: what
the ranks send back is loaded as data only (``helpers._runtime.wire.restrict``), and the
process cannot be traced or have its memory read by them (it is not dumpable).

``python -m autograder.grading.clean NOTEBOOK LESSON`` prints one JSON line per graded part::

    {"exercise": "4.4", "part": "correct", "points": 4, "score": 0, "message": "correct: ..."}
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from ..learner.definitions import define, exercise_code

_STARTED = time.monotonic()

__all__ = ["grade_lesson", "main"]


def grade_lesson(lesson: int, namespace: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Grade every part of every exercise of ``lesson`` against the definitions in ``namespace``."""
    from ..hidden import checks
    from ..kit.harness import CheckError, GradingFailure
    from ..kit.registry import exercises

    for ex in exercises(lesson):
        hidden = checks(ex.number)
        for part in ex.parts:
            result = {"exercise": ex.number, "part": part.name, "points": part.points, "score": 0, "message": None,
                      "text": None}
            if ex.function not in namespace:
                result["text"] = (f"no `{ex.function}` is defined by a function or class "
                                  f"definition in your notebook.")
                result["message"] = f"{part.name}: {result['text']}"
            else:
                try:
                    ex.grade(namespace[ex.function], part.name, hidden[part.name])
                    result["score"] = part.points
                except GradingFailure as failure:
                    result["message"], result["text"] = str(failure), failure.text
                except CheckError as error:
                    result["message"] = result["text"] = str(error)
                    result["check_error"] = True
            yield result


def _not_traceable() -> None:
    """Keep the learner's ranks (same user, same sandbox) from reading or writing this process's memory."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m autograder.grading.clean NOTEBOOK LESSON_NUMBER", file=sys.stderr)
        return 2
    # First thing, before any torch operation: this process's rank factory is a fork of it, so
    # torch is imported once for both (helpers._runtime.factory.fork_factory says why it is safe).
    from helpers._runtime.factory import fork_factory

    fork_factory()
    _not_traceable()
    from ..hidden.sealed import unseal

    unseal()  # the instructor modules the hidden checks need, read now that no rank can inherit them
    from helpers._runtime import wire as _wire

    _wire.restrict()  # what the learner's ranks send back is loaded as data only
    # Nothing on sys.path may be a folder the learner's code can write to.
    sys.path[:] = [p for p in sys.path if p not in ("", ".") and Path(p).resolve() != Path.cwd().resolve()]
    code, left_out = exercise_code(argv[0])
    namespace, skipped = define(code)
    from ..kit import harness

    harness.reuse_ranks()  # the checks of this one submission run on warm ranks (see reuse_ranks)
    print(json.dumps({"left_out": left_out + skipped, "ready": round(time.monotonic() - _STARTED, 2)}), flush=True)
    began = time.monotonic()
    try:
        for result in grade_lesson(int(argv[1]), namespace):
            stats = harness.take_stats()
            result.update(seconds=round(time.monotonic() - began, 2), launches=stats["runs"],
                          launch_seconds=round(stats["seconds"], 2), fresh_groups=stats["started"])
            print(json.dumps(result), flush=True)
            began = time.monotonic()
    finally:
        harness.reuse_ranks(False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
