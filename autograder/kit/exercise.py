"""One shape for every graded exercise: declare it once, grade it from a one-line cell.

An exercise is one :class:`Exercise` object in its lesson's module
(``autograder/lessons/lessonNN.py``, in a tuple named ``EXERCISES``). It owns the exercise
number, the learner's function name, its graded parts (name, points, what each checks),
the calls switched off on the ranks with the sentence that explains why, and the visible
self-check. Notebook cells only name it::

    from autograder import exercise
    exercise("4.4").self_check(ring_allreduce)            # visible self-check

The check of each graded part is not here: it is the instructor's, in
``autograder/hidden/lessonNN.py``, and a hidden test cell runs one part with
``grade("4.4", ring_allreduce, "correct")`` from :mod:`autograder.hidden`, which hands that
check to :meth:`Exercise.grade`. What learners get (this package, the declarations, the
self-checks) therefore holds no hidden check, and needs nothing removed to ship.

:func:`exercise` finds ``"4.4"`` in ``autograder/lessons/lesson04.py``, so a new lesson adds its
module (and its notebook) and nothing else. ``tests/test_exercises.py`` checks that every
graded cell of every notebook matches a declared part, with the declared points.

A check receives an :class:`Attempt`: the learner's function (``fn``), a
:meth:`~Attempt.run` that starts fresh ranks with this exercise's switched-off calls,
and :meth:`~Attempt.fail` for feedback; a check whose answer is a whole script runs it
under real torchrun agents with :meth:`~Attempt.torchrun` instead. Small pieces checks share
(seeded tensors, differences, plural words) are in :mod:`autograder.kit.pieces`.

Example: a whole (tiny) exercise, graded on two ranks::

    >>> from autograder.kit.pieces import call_learner
    >>> def answer_check(attempt):
    ...     for world_size in (1, 2):
    ...         values = attempt.run(call_learner, world_size, (attempt.fn,))
    ...         if list(values) != [42] * world_size:
    ...             attempt.fail(f"on {plural(world_size, 'rank')}, got {list(values)} instead of 42 each.")
    >>> answer = Exercise(number="9.1", function="answer", title="the answer",
    ...                   parts=(Part("correct", 1, "returns 42 on every rank."),))
    >>> answer.grade(lambda rank, world_size: 42, "correct", answer_check)     # passes silently
"""

from __future__ import annotations

import re
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, NoReturn, Sequence

from helpers import LaunchResult

from .harness import CheckError, GradingFailure, fresh_seed, require_function, run_ranks
from .pieces import plural

if TYPE_CHECKING:
    from .torchrun import ScriptRun

__all__ = [
    "Exercise",
    "Part",
    "Attempt",
    "GradingFailure",
    "CheckError",
    "fresh_seed",
    "SELF_CHECK",
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
NUMBER = re.compile(r"(\d+)\.(\d+)$")  # an exercise number: lesson.exercise


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

    ``says`` is the sentence the cell's heading shows (what the hidden test checks). The
    check itself, ``check(attempt)``, is the instructor's (``autograder/hidden/``): it returns
    when the answer passes and raises GradingFailure (through ``attempt.fail``) when it does
    not. ``forbid`` switches more calls off in this part's runs than the exercise does, with
    ``forbid_reason`` for the learner (for example one method of a class that must be
    repaired without collectives).
    """

    name: str
    points: int
    says: str
    forbid: tuple[str, ...] = ()
    forbid_reason: str = ""

    def __post_init__(self) -> None:
        if self.forbid and not self.forbid_reason:
            raise ValueError(f"part {self.name!r} switches calls off: give the forbid_reason learners read")


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
        if not NUMBER.match(self.number):
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

    def forbidden(self, part: str | None = None) -> dict[str, str]:
        """The calls switched off in a run of ``part`` (None: the exercise's own), each with its reason.

        >>> ex = Exercise(number="9.1", function="f", title="t", forbid=("all_reduce",), forbid_reason="by hand",
        ...               parts=(Part("p", 1, "p.", forbid=("send",), forbid_reason="no send"),))
        >>> ex.forbidden(), ex.forbidden("p")
        ({'all_reduce': 'by hand'}, {'all_reduce': 'by hand', 'send': 'no send'})
        """
        calls = dict.fromkeys(self.forbid, self.forbid_reason)
        if part is not None and part != SELF_CHECK:
            own = self.part(part)
            calls.update(dict.fromkeys(own.forbid, own.forbid_reason))
        return calls

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

    def grade(self, fn: Any, part: str, check: Callable[["Attempt"], None] | None = None) -> None:
        """Run ``check``, the hidden test of ``part``, on ``fn``: returns when it passes, raises GradingFailure when not.

        The hidden tests call it through :func:`autograder.hidden.grade`, which holds every
        part's check; without one (a learner's copy of the course has none) it raises
        :class:`HiddenTestUnavailable`, naming the self-check to run instead.

        A check that breaks in the notebook, or a rank that fails inside the autograder's
        own files, raises :class:`CheckError` instead: the course's fault, not the learner's.

        While ``make grade`` runs the notebook (:func:`decided_by_clean_run`), the check
        does not run here: the clean re-grade (:mod:`autograder.grading.clean`) decides every part
        in a fresh process, and its verdict is written into this cell afterwards.
        """
        self.part(part)
        if check is None:
            instead = (f"To check `{self.function}` now, run its visible self-check: "
                       f'exercise("{self.number}").self_check({self.function}).' if self.visible_check is not None
                       else "This exercise has no visible self-check: run the lesson's cells that use it.")
            raise HiddenTestUnavailable(
                f'{self.label}, part "{part}": this copy of the course has no hidden tests.\n'
                "Hidden tests run only when your instructor grades the notebook you hand in. " + instead)
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
                f"`{self.function}` cannot be sent to the fresh processes the checks run it on "
                f"({type(exc).__name__}: {exc}). Create open files, locks, sockets and the like inside "
                "the function rather than using ones made outside it.", part
            ) from None
        return Attempt(self, part, fn)


@contextmanager
def _course_faults(ex: Exercise, part: str) -> Iterator[None]:
    """Let GradingFailure and CheckError through; report any other exception as the course's fault."""
    try:
        yield
    except GradingFailure as failure:
        failure.exercise = failure.exercise or ex.label  # the notebook shows which exercise failed
        raise
    except (CheckError, HiddenTestUnavailable):
        raise
    except Exception as exc:  # noqa: BLE001 - anything else is a bug in the check itself
        frames = traceback.format_tb(exc.__traceback__)[-2:]
        detail = "".join(frames).rstrip()
        raise CheckError(ex.label, part, f"{type(exc).__name__}: {exc}", detail) from exc


@dataclass
class Attempt:
    """What a part's check works with: the exercise, the part's name and the learner's ``fn``.

    ``rules`` is the part whose switched-off calls apply to this attempt's runs: its own part
    by default; a self-check that tries every part's program takes each part's rules with
    :meth:`under`.
    """

    exercise: Exercise
    part: str
    fn: Callable
    rules: str | None = None

    def under(self, part: str) -> "Attempt":
        """This attempt with ``part``'s switched-off calls (its name in feedback stays the same)."""
        self.exercise.part(part)  # a ValueError naming the parts there are, for a typo
        return Attempt(self.exercise, self.part, self.fn, rules=part)

    def run(
        self,
        worker: Callable,
        world_size: int,
        args: Sequence[Any] = (),
        *,
        context: str = "",
        label: str | None = None,
        function: str | None = None,
        **settings: Any,
    ) -> LaunchResult:
        """Run ``worker(rank, world_size, *args)`` on fresh ranks (see :func:`autograder.kit.harness.run_ranks`).

        The calls this attempt's part switches off (:meth:`Exercise.forbidden`) are off, with
        their reasons, in every run: every hidden part and the visible self-check, so an answer
        that leans on a built-in collective earns nothing, and "Self-check passed" means the
        same rules. ``label`` names the run in feedback (default: the part), ``function`` the
        learner's function (default: the exercise's); ``settings`` are launch settings
        (``timeout``, ``trace``, ``nnodes``, ``init``; see :class:`helpers.settings.LaunchSettings`).
        """
        ex = self.exercise
        return run_ranks(
            label or self.part, worker, world_size, args, exercise=ex.label, function=function or ex.function,
            context=context, hints=ex.hints, forbid=ex.forbidden(self.rules or self.part), **settings,
        )

    def torchrun(self, nnodes: int, nproc: int, **options: Any) -> "ScriptRun":
        """The learner's ``main()`` run as a script under ``nnodes`` torchrun agents of ``nproc`` processes.

        Returns the :class:`~autograder.kit.torchrun.ScriptRun` when every process exited
        0 in time; fails the part otherwise, with the first failing process's own account. A
        job runs once per answer and shape, shared by the parts that ask for it; ``options``
        go to :func:`autograder.kit.torchrun.run_script` (``replace``, ``timeout``).
        """
        from .torchrun import cached_run
        from .torchrun_feedback import failure_text

        options.setdefault("label", f"{self.exercise.label}'s torchrun job")
        run = cached_run(self.fn, nnodes, nproc, **options)
        problem = failure_text(run)
        if problem:
            self.fail(problem)
        return run

    def fail(self, text: str) -> NoReturn:
        """Raise GradingFailure with ``text``, after the part's name (``"correct: ..."``)."""
        raise GradingFailure(text, self.part)


class HiddenTestUnavailable(RuntimeError):
    """A graded part's hidden test was asked for without its check (the learner's copy of the course has none).

    >>> ex = Exercise(number="9.1", function="answer", title="the answer",
    ...               parts=(Part("correct", 1, "returns 42 on every rank."),))
    >>> try:
    ...     ex.grade(lambda rank, world_size: 42, "correct")
    ... except HiddenTestUnavailable as err:
    ...     print(str(err).splitlines()[0])
    Exercise 9.1, part "correct": this copy of the course has no hidden tests.
    """

    def _render_traceback_(self) -> list[str]:
        """Only the message in a notebook: it is not an error of the learner's code."""
        return [f"{type(self).__name__}: {line}" if i == 0 else line for i, line in enumerate(str(self).splitlines())]
