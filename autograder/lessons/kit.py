"""One shape for every graded exercise: declare it once, grade it from a one-line cell.

An exercise is one :class:`Exercise` object in its lesson's module
(``autograder/lessons/lessonNN.py``, in a tuple named ``EXERCISES``). It owns the exercise
number, the learner's function name, its graded parts (name, points, what each checks),
the calls switched off on the ranks with the sentence that explains why, and the visible
self-check. Notebook cells only name it::

    from autograder import exercise
    exercise("4.4").self_check(ring_allreduce)            # visible self-check
    exercise("4.4").grade(ring_allreduce, "correct")      # hidden test of one part

:func:`exercise` finds ``"4.4"`` in ``autograder/lessons/lesson04.py``, so a new lesson adds its
module (and its notebook) and nothing else. ``tests/test_exercises.py`` checks that every
graded cell of every notebook matches a declared part, with the declared points.

A part's ``check`` receives an :class:`Attempt`: the learner's function (``fn``), a
:meth:`~Attempt.run` that starts fresh ranks with this exercise's switched-off calls,
and :meth:`~Attempt.fail` for feedback. Shared pieces for checks live here too: seeded
test tensors, the first difference between two tensors, cases grouped by world size,
point-to-point traffic from a trace, and plural words.

Example: a whole (tiny) exercise, graded on two ranks::

    >>> def answer_check(attempt):
    ...     for world_size in (1, 2):
    ...         values = attempt.run(call_learner, world_size, (attempt.fn,))
    ...         if list(values) != [42] * world_size:
    ...             attempt.fail(f"on {plural(world_size, 'rank')}, got {list(values)} instead of 42 each.")
    >>> answer = Exercise(number="9.1", function="answer", title="the answer",
    ...                   parts=(Part("correct", 1, "returns 42 on every rank.", answer_check),))
    >>> answer.grade(lambda rank, world_size: 42, "correct")     # passes silently
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, NoReturn, Sequence

from helpers import LaunchResult

from .harness import CheckError, GradingFailure, fresh_seed, require_function, run_ranks

__all__ = [
    "Exercise",
    "Part",
    "Attempt",
    "exercise",
    "exercises",
    "GradingFailure",
    "CheckError",
    "fresh_seed",
    "call_learner",
    "plural",
    "seeded_tensor",
    "Difference",
    "first_difference",
    "by_world_size",
    "silent_ranks",
    "SELF_CHECK",
    "HIDDEN_CHECK",
    "HiddenTestUnavailable",
    "decided_by_clean_run",
    "CLEAN_RUN_DECIDES",
    "DEFERRED",
]

SELF_CHECK = "self-check"  # the part name feedback shows for the visible self-check
#: Set (to ``"1"``) in the environment of a notebook's kernel while ``make grade`` runs it: the
#: clean re-grade decides every graded part, so the kernel runs no check (see :meth:`Exercise.grade`).
CLEAN_RUN_DECIDES = "COURSE_CLEAN_RUN_DECIDES"
#: What a hidden test cell prints in the kernel while ``make grade`` runs the notebook; grading
#: then replaces it with the clean re-grade's verdict.
DEFERRED = "Graded in a fresh process once the notebook has run: the verdict replaces this line."
_LESSON_MODULE = re.compile(r"lesson(\d{2})$")
_NUMBER = re.compile(r"(\d+)\.(\d+)$")


def decided_by_clean_run() -> bool:
    """Whether this is a notebook's kernel under ``make grade``, where the clean re-grade decides every part.

    Only while nbgrader autogrades (``NBGRADER_EXECUTION=autograde``) and the grading
    workflow asked for it (:data:`CLEAN_RUN_DECIDES`): a plain ``nbgrader autograde`` or the
    formgrader, which have no clean re-grade after them, still run every check in the kernel.

    >>> decided_by_clean_run()
    False
    """
    import os

    return os.environ.get("NBGRADER_EXECUTION") == "autograde" and os.environ.get(CLEAN_RUN_DECIDES) == "1"


# -- declarations ------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One graded part of an exercise: one hidden test cell, worth ``points``.

    ``says`` is the sentence the cell's heading shows (what the hidden test checks);
    ``check(attempt)`` returns when the answer passes and raises GradingFailure (through
    ``attempt.fail``) when it does not.
    """

    name: str
    points: int
    says: str
    check: Callable[["Attempt"], None]


@dataclass(frozen=True)
class Exercise:
    """A graded exercise: its number, the learner's function, its parts and its self-check.

    ``forbid`` names calls switched off on the ranks in every run of the exercise's checks
    (hidden parts and self-check alike), from :data:`helpers.DATA_COLLECTIVES` and friends;
    ``forbid_reason`` is the sentence the learner reads when they call one.
    ``visible_check(attempt, **options)`` runs the visible self-check and returns the message to
    print when it passes. ``hints`` maps the type name of an exception a rank raised to a
    sentence added to the feedback.
    """

    number: str
    function: str
    title: str
    parts: tuple[Part, ...]
    visible_check: Callable[..., str] | None = None
    forbid: tuple[str, ...] = ()
    forbid_reason: str = ""
    hints: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NUMBER.match(self.number):
            raise ValueError(f"exercise number {self.number!r} should look like '4.1' (lesson.exercise)")
        names = [p.name for p in self.parts]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"Exercise {self.number} needs parts with distinct names (got {names})")
        if self.forbid and not self.forbid_reason:
            raise ValueError(f"Exercise {self.number} switches calls off: give the forbid_reason learners read")

    @property
    def label(self) -> str:
        """``"Exercise 4.1"``, as feedback names it."""
        return f"Exercise {self.number}"

    @property
    def lesson(self) -> int:
        """The lesson number: 4 for exercise 4.1."""
        return int(self.number.split(".")[0])

    @property
    def points(self) -> int:
        """The exercise's points: the sum over its parts."""
        return sum(p.points for p in self.parts)

    def part(self, name: str) -> Part:
        """The part called ``name``; a ValueError naming the parts there are otherwise."""
        for part in self.parts:
            if part.name == name:
                return part
        raise ValueError(f"{self.label} has no part {name!r}; its parts are {', '.join(p.name for p in self.parts)}")

    def heading(self, name: str) -> str:
        """The first line of the part's hidden test cell: number, part, points and what it checks."""
        part = self.part(name)
        return f'# Exercise {self.number}, part "{part.name}" ({plural(part.points, "point")}): {part.says}'

    def grade(self, fn: Any, part: str) -> None:
        """The hidden test of one part: returns when ``fn`` passes, raises GradingFailure when not.

        A check that breaks in the notebook, or a rank that fails inside the autograder's
        own files, raises :class:`CheckError` instead: the course's fault, not the learner's.

        While ``make grade`` runs the notebook (:func:`decided_by_clean_run`), the check
        does not run here: the clean re-grade (:mod:`autograder.grading.clean`) decides every part
        in a fresh process, and its verdict is written into this cell afterwards.
        """
        check = self.part(part).check
        if decided_by_clean_run():
            print(DEFERRED)
            return
        with _course_faults(self, part):
            check(self._attempt(fn, part))

    def self_check(self, fn: Any, **options: Any) -> None:
        """The visible check learners run; prints what passed, raises GradingFailure when not."""
        if self.visible_check is None:
            raise ValueError(f"{self.label} has no visible self-check")
        if decided_by_clean_run():
            print(f"{self.label}: the self-check is skipped while your notebook is graded; the graded parts below "
                  "are decided in a fresh process.")
            return
        with _course_faults(self, SELF_CHECK):
            message = self.visible_check(self._attempt(fn, SELF_CHECK), **options)
        print(message)

    def _attempt(self, fn: Any, part: str) -> Attempt:
        """An Attempt at ``part`` with ``fn``, once ``fn`` is a function the ranks can receive."""
        import cloudpickle

        fn = require_function(fn, self.function, self.label)
        try:
            cloudpickle.dumps(fn)
        except Exception as exc:  # noqa: BLE001 - whatever the pickler refuses
            raise GradingFailure(
                f"{part}: `{self.function}` cannot be sent to the fresh processes the checks run it on "
                f"({type(exc).__name__}: {exc}). Create open files, locks, sockets and the like inside "
                "the function rather than using ones made outside it."
            ) from None
        return Attempt(self, part, fn)


@contextmanager
def _course_faults(ex: Exercise, part: str) -> Iterator[None]:
    """Let GradingFailure and CheckError through; report any other exception as the course's fault."""
    try:
        yield
    except (GradingFailure, CheckError, HiddenTestUnavailable):
        raise
    except Exception as exc:  # noqa: BLE001 - anything else is a bug in the check itself
        frames = traceback.format_tb(exc.__traceback__)[-2:]
        detail = "".join(frames).rstrip()
        raise CheckError(ex.label, part, f"{type(exc).__name__}: {exc}", detail) from exc


@dataclass
class Attempt:
    """What a part's check works with: the exercise, the part's name and the learner's ``fn``."""

    exercise: Exercise
    part: str
    fn: Callable

    def run(
        self,
        worker: Callable,
        world_size: int,
        args: Sequence[Any] = (),
        *,
        timeout: float = 10.0,
        context: str = "",
        trace: bool = False,
        nnodes: int = 1,
        init: bool = True,
    ) -> LaunchResult:
        """Run ``worker(rank, world_size, *args)`` on fresh ranks (see :func:`autograder.lessons.harness.run_ranks`).

        The exercise's ``forbid`` calls are switched off, with its reason, in every run:
        every hidden part and the visible self-check, so an answer that leans on a
        built-in collective earns nothing, and "Self-check passed" means the same rules.
        """
        ex = self.exercise
        return run_ranks(
            self.part, worker, world_size, args, exercise=ex.label, function=ex.function, context=context,
            timeout=timeout, forbid=dict.fromkeys(ex.forbid, ex.forbid_reason),
            trace=trace, nnodes=nnodes, init=init, hints=ex.hints,
        )

    def fail(self, text: str) -> NoReturn:
        """Raise GradingFailure with ``text``, after the part's name (``"correct: ..."``)."""
        raise GradingFailure(f"{self.part}: {text}")


class HiddenTestUnavailable(RuntimeError):
    """A graded part's hidden test was asked for in the learner distribution, which has none."""


def HIDDEN_CHECK(attempt: Attempt) -> NoReturn:  # noqa: N802 - named like the constant it stands in for
    """The check of every graded part in the learner distribution: it says the hidden test is not here.

    ``python -m autograder release`` (see :mod:`autograder.release`) writes each lesson's
    module with this function in place of every ``Part``'s own check, so learners keep the
    exercises' parts, points and visible self-checks while the hidden tests stay with the
    instructor. It raises :class:`HiddenTestUnavailable`, naming the exercise, the part and
    the self-check to run instead; the kit passes it on as it is, not as a fault of the course.

    >>> ex = Exercise(number="9.1", function="answer", title="the answer",
    ...               parts=(Part("correct", 1, "returns 42 on every rank.", HIDDEN_CHECK),))
    >>> try:
    ...     ex.grade(lambda rank, world_size: 42, "correct")
    ... except HiddenTestUnavailable as err:
    ...     print(str(err).splitlines()[0])
    Exercise 9.1, part "correct": this copy of the course has no hidden tests.
    """
    ex = attempt.exercise
    instead = (f"To check `{ex.function}` now, run its visible self-check: "
               f'exercise("{ex.number}").self_check({ex.function}).' if ex.visible_check is not None else
               "This exercise has no visible self-check: run the lesson's cells that use it.")
    raise HiddenTestUnavailable(
        f'{ex.label}, part "{attempt.part}": this copy of the course has no hidden tests.\n'
        "Hidden tests run only when your instructor grades the notebook you hand in. " + instead
    )


# -- the registry ------------------------------------------------------------------------


def _lesson_modules() -> dict[int, str]:
    """Lesson number -> module name, for every ``autograder/lessons/lessonNN.py``."""
    # The package's search path, read where Python keeps it (no import of the package from
    # inside it: a folder added to autograder.__path__ is searched too).
    found = {}
    for info in pkgutil.iter_modules(sys.modules[__package__].__path__):
        match = _LESSON_MODULE.match(info.name)
        if match:
            found[int(match[1])] = f"{__package__}.{info.name}"
    return found


def _declared(module_name: str, lesson: int) -> tuple[Exercise, ...]:
    module = importlib.import_module(module_name)
    declared = getattr(module, "EXERCISES", None)
    if not isinstance(declared, tuple) or not all(isinstance(e, Exercise) for e in declared):
        raise TypeError(f"{module_name} must declare EXERCISES, a tuple of autograder.lessons.kit.Exercise")
    for ex in declared:
        if ex.lesson != lesson:
            raise ValueError(f"{module_name} declares {ex.label}, which belongs in lesson {ex.lesson:02d}")
    return declared


def exercises(lesson: int | None = None) -> list[Exercise]:
    """Every declared exercise (of one lesson when ``lesson`` is given), in number order.

    >>> [e.number for e in exercises(3)]
    ['3.1', '3.2', '3.3']
    """
    modules = _lesson_modules()
    chosen = sorted(modules) if lesson is None else [lesson] if lesson in modules else []
    found = [ex for n in chosen for ex in _declared(modules[n], n)]
    numbers = [ex.number for ex in found]
    if len(set(numbers)) != len(numbers):
        raise ValueError(f"an exercise number is declared twice: {numbers}")
    return sorted(found, key=lambda ex: tuple(int(x) for x in ex.number.split(".")))


def exercise(number: str) -> Exercise:
    """The exercise numbered ``number`` ("4.4"), from ``autograder/lessons/lessonNN.py``.

    >>> exercise("4.4").function
    'ring_allreduce'
    """
    match = _NUMBER.match(str(number))
    if not match:
        raise ValueError(f"exercise numbers look like '4.1' (lesson.exercise); got {number!r}")
    lesson = int(match[1])
    modules = _lesson_modules()
    if lesson not in modules:
        raise LookupError(f"no module autograder/lessons/lesson{lesson:02d}.py declares exercise {number}")
    for ex in _declared(modules[lesson], lesson):
        if ex.number == number:
            return ex
    known = ", ".join(e.number for e in _declared(modules[lesson], lesson))
    raise LookupError(f"autograder/lessons/lesson{lesson:02d}.py declares no exercise {number} (it has {known})")


# -- shared pieces for checks ------------------------------------------------------------


def call_learner(rank: int, world_size: int, fn: Callable) -> Any:
    """A worker that returns ``fn(rank, world_size)``: for exercises judged by return values."""
    return fn(rank, world_size)


def plural(n: int, word: str, many: str | None = None) -> str:
    """``"1 rank"``, ``"3 ranks"``.

    >>> plural(1, "rank"), plural(0, "element"), plural(2, "host")
    ('1 rank', '0 elements', '2 hosts')
    """
    return f"{n} {word if n == 1 else many or word + 's'}"


def seeded_tensor(shape: tuple, dtype_name: str, seed: int, rank: int, *, int_range: tuple[int, int] = (-1000, 1000)):
    """Rank ``rank``'s test tensor for ``seed``: the same on every process, new at every grading.

    Integers are drawn from ``int_range`` (uint8 from 0 to 255), floats are normal times 10.

    >>> seeded_tensor((3,), "int64", 7, 1).equal(seeded_tensor((3,), "int64", 7, 1))
    True
    """
    import torch

    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype_name == "uint8":
        return torch.randint(0, 256, shape, generator=g).to(torch.uint8)
    if dtype_name in ("int64", "int32", "int16", "int8"):
        return torch.randint(*int_range, shape, generator=g).to(getattr(torch, dtype_name))
    return (torch.randn(shape, generator=g) * 10).to(getattr(torch, dtype_name))


@dataclass(frozen=True)
class Difference:
    """How a tensor differs from the expected one: ``what`` in words, and an ``excerpt`` of values.

    ``str()`` gives both: ``"first wrong element at flat index 3\\n  expected [...]\\n  actual   [...]"``.
    """

    what: str
    excerpt: str = ""

    def __str__(self) -> str:
        return self.what + self.excerpt


def first_difference(actual, expected, *, tolerance: float | None = None) -> Difference | None:
    """None when ``actual`` equals ``expected``; else the first difference (shape, dtype, or element).

    Floats are compared within ``tolerance`` (relative and absolute) when it is given,
    exactly otherwise. The excerpt shows a few values round the first wrong element.

    >>> import torch
    >>> print(first_difference(torch.tensor([1, 2, 3]), torch.tensor([1, 5, 3])))
    first wrong element at flat index 1
      expected [1, 5, 3]
      actual   [1, 2, 3]
    """
    import torch

    if tuple(actual.shape) != tuple(expected.shape):
        return Difference(f"its shape became {tuple(actual.shape)} instead of {tuple(expected.shape)}")
    if actual.dtype != expected.dtype:
        return Difference(f"its dtype became {actual.dtype} instead of {expected.dtype}")
    if tolerance is not None and expected.is_floating_point():
        bad = ~torch.isclose(actual.double(), expected.double(), rtol=tolerance, atol=tolerance)
    else:
        bad = actual != expected
    if not bool(bad.any()):
        return None
    i = int(bad.reshape(-1).nonzero()[0])
    a, e = actual.reshape(-1), expected.reshape(-1)
    return Difference(
        f"first wrong element at flat index {i}",
        f"\n  expected {e[max(0, i - 2): i + 6].tolist()}\n  actual   {a[max(0, i - 2): i + 6].tolist()}",
    )


def by_world_size(cases: Iterable[tuple]) -> list[tuple[int, list[tuple]]]:
    """Cases ``(world size, *rest)`` grouped by world size, smallest first: one launch per size.

    >>> by_world_size([(2, "a"), (1, "b"), (2, "c")])
    [(1, [('b',)]), (2, [('a',), ('c',)])]
    """
    grouped: dict[int, list[tuple]] = {}
    for world, *rest in cases:
        grouped.setdefault(world, []).append(tuple(rest))
    return sorted(grouped.items())


def silent_ranks(
    result: LaunchResult, directions: Sequence[str] = ("sent", "received"), ranks: Iterable[int] | None = None
) -> list[tuple[int, str]]:
    """The ranks that sent or received no point-to-point message, in rank order, with the word for it.

    Reads the trace of a launch run with ``trace=True``. ``directions`` holds ``"sent"``
    and/or ``"received"``; for each rank of ``ranks`` (every rank by default) the first
    direction in which it was silent is reported: ``[(2, "received")]``.
    """
    keys = {"sent": "sent_messages", "received": "recv_messages"}
    unknown = [d for d in directions if d not in keys]
    if unknown:
        raise ValueError(f"directions are 'sent' and 'received', not {unknown}")
    summary = result.trace.summary()
    found = []
    for rank in range(len(result)) if ranks is None else ranks:
        word = next((d for d in directions if summary[rank][keys[d]] == 0), None)
        if word:
            found.append((rank, word))
    return found
