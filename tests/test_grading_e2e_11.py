"""Lesson 11 graded end to end with the real nbgrader: ring, zig-zag and Ulysses attention, right and wrong.

A temporary copy of the course receives five learners' versions of lesson 11 and is graded
with `python -m autograder grade`, the instructor's command. amy hands in the instructor's
three answers; the others make the mistakes these exercises invite, each a line or two away
from the answer:

- ben: every rank sends its block with a blocking ``dist.send`` before receiving (a deadlock);
  11.2 and 11.3 untouched;
- cid: the merge adds a new block without rescaling the old terms to the new maximum;
- dee: the keys and values passed round the ring but kept and concatenated, the scores computed
  in one row (right values, ring traffic, the memory the exercise avoids); 11.2 answered with
  that causal ring, whose mask is the contiguous layout's; 11.3 with the heads' pieces put back
  in the wrong order;
- eli: the block received at the last step passed on once more (p sends instead of p - 1); a
  zig-zag that computes every block whole and masks it instead of skipping.
"""

from __future__ import annotations

import pytest

from _grading import variant
from devtools.scratch import solution_source

pytestmark = pytest.mark.slow  # every test reads the graded class

LESSON = "11-long-sequences"
RING, ZIGZAG, ULYSSES = "ex11_1-ring-attention", "ex11_2-zigzag-attention", "ex11_3-ulysses-attention"

POST = "            requests = [dist.isend(kv, right), dist.irecv(incoming, left)]"
DIAGONAL = ("            partial = merge(partial, block_attention(q, kv[0], kv[1], torch.ones(n, n, "
            "dtype=torch.bool).tril()))")

# ben: every rank sends first, blocking: nobody reaches its receive.
BLOCKING = ((POST, "            dist.send(kv, right)\n            dist.recv(incoming, left)\n            requests = []"),)

# cid: the old terms keep their old maximum (the merge of section 2 without its rescale).
NO_RESCALE = (("    partial = None\n",
               "    partial = None\n\n"
               "    def merge(a, b):\n"
               "        if a is None:\n"
               "            return b\n"
               "        m = torch.maximum(a[1], b[1])\n"
               "        return a[0] + b[0] * torch.exp(b[1] - m), m, a[2] + b[2] * torch.exp(b[1] - m)\n"),)

# dee's 11.2: Exercise 11.1's causal ring on the zig-zag layout.
CONTIGUOUS = '''# Exercise 11.2: zig-zag causal ring attention
def zigzag_attention(q, k, v):
    return ring_attention(q, k, v, causal=True)
'''

# dee: every block kept and concatenated; one whole row of scores.
HOLDS_EVERYTHING = '''# Exercise 11.1: ring attention from point-to-point calls
def ring_attention(q, k, v, causal=False):
    rank, p = dist.get_rank(), dist.get_world_size()
    blocks = {rank: torch.stack((k, v))}
    kv = blocks[rank]
    for step in range(1, p):
        incoming = torch.empty_like(kv)
        requests = [dist.isend(kv, (rank + 1) % p), dist.irecv(incoming, (rank - 1) % p)]
        for request in requests:
            request.wait()
        kv = blocks[(rank - step) % p] = incoming
    keys = torch.cat([blocks[j][0] for j in range(p)], dim=1)
    values = torch.cat([blocks[j][1] for j in range(p)], dim=1)
    n = q.shape[-2]
    scores = q @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        positions = torch.arange(rank * n, (rank + 1) * n)
        scores = scores.masked_fill(torch.arange(p * n)[None, :] > positions[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ values
'''

# dee's 11.3: the heads' pieces put back in the wrong order (rank by rank within each head block).
WRONG_ORDER = (("    return arrived.reshape(heads, n, d)", "    return arrived.transpose(0, 1).reshape(heads, n, d)"),)

# eli: one send too many (the block received at the last step passed on as well).
ONE_MORE = (("    o, m, l = partial\n",
             "    if p > 1:\n"
             "        extra = torch.empty_like(kv)\n"
             "        for request in [dist.isend(kv, right), dist.irecv(extra, left)]:\n"
             "            request.wait()\n"
             "    o, m, l = partial\n"),)

# eli's 11.2: every block computed whole and masked, nothing skipped.
MASKED_NOT_SKIPPED = '''# Exercise 11.2: zig-zag causal ring attention
def zigzag_attention(q, k, v):
    rank, p = dist.get_rank(), dist.get_world_size()
    c = q.shape[-2] // 2
    mine = torch.tensor(zigzag_positions(rank, p, c))
    kv, partial = torch.stack((k, v)), None
    for step in range(p):
        if step < p - 1:
            incoming = torch.empty_like(kv)
            requests = [dist.isend(kv, (rank + 1) % p), dist.irecv(incoming, (rank - 1) % p)]
        theirs = torch.tensor(zigzag_positions((rank - step) % p, p, c))
        scores = q @ kv[0].transpose(-1, -2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(theirs[None, :] > mine[:, None], -1e30)   # masked, not skipped
        m = scores.amax(dim=-1, keepdim=True)
        e = torch.exp(scores - m)
        partial = merge(partial, (e @ kv[1], m, e.sum(dim=-1, keepdim=True)))
        if step < p - 1:
            for request in requests:
                request.wait()
            kv = incoming
    o, m, l = partial
    return o / l
'''


def _answers(ring=(), *, ring_source=None, zigzag_source=None, ulysses=(), skip=()):
    cells = {RING: ring_source or variant(LESSON, RING, *ring),
             ZIGZAG: zigzag_source or solution_source(LESSON, ZIGZAG),
             ULYSSES: variant(LESSON, ULYSSES, *ulysses)}
    return {grade_id: source for grade_id, source in cells.items() if grade_id not in skip}


HANDED_IN = {LESSON: {
    "amy": {grade_id: solution_source(LESSON, grade_id) for grade_id in (RING, ZIGZAG, ULYSSES)},
    "ben": _answers(BLOCKING, skip=(ZIGZAG, ULYSSES)),
    "cid": _answers(NO_RESCALE),
    "dee": _answers(ring_source=HOLDS_EVERYTHING, zigzag_source=CONTIGUOUS, ulysses=WRONG_ORDER),
    "eli": _answers(ONE_MORE, zigzag_source=MASKED_NOT_SKIPPED),
}}


def _lose(graded_lesson, student: str, *parts: str) -> None:
    assert graded_lesson.scores(student) == {**graded_lesson.points, **dict.fromkeys(parts, 0)}


def test_the_instructors_answers_earn_full_marks(graded_lesson):
    """Do the instructor's three answers, handed in as a learner's, earn every point?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


def test_a_ring_that_sends_first_everywhere_loses_every_part_and_is_told_how_to_post(graded_lesson):
    """Does a ring where every rank sends first (blocking) lose every part of 11.1, each run ending promptly, with
    the fix (isend to the right, irecv from the left) in the feedback, and the untouched 11.2 and 11.3 named?"""
    _lose(graded_lesson, "ben", "11.1/correct", "11.1/ring", "11.1/memory", "11.1/no_hang", "11.2/correct",
          "11.2/balanced", "11.3/correct", "11.3/exchange")
    graded_lesson.check_feedback("ben", "dist.isend to the right and dist.irecv from the left",
                                 "still raises NotImplementedError")


def test_a_merge_without_rescale_loses_correct_alone_with_the_fix(graded_lesson):
    """Does a merge that forgets the rescale lose 11.1's correct part alone (its traffic and memory are right), with
    the fix named?"""
    _lose(graded_lesson, "cid", "11.1/correct")
    graded_lesson.check_feedback("cid", "exp(m_old - m_new)")


def test_holding_every_key_loses_memory_and_the_contiguous_mask_is_named(graded_lesson):
    """Does an answer with right values and ring traffic that holds every key at once lose 11.1's memory part alone,
    saying so; its causal ring on the zig-zag layout all of 11.2, naming the contiguous mask; and a Ulysses that puts
    the pieces back along the wrong dimension its correct part?"""
    _lose(graded_lesson, "dee", "11.1/memory", "11.2/correct", "11.2/balanced", "11.3/correct")
    graded_lesson.check_feedback("dee", "keys or values at once", "contiguous layout")


def test_one_send_too_many_and_masking_instead_of_skipping_are_counted(graded_lesson):
    """Does a ring that sends p blocks lose the ring part alone, and a zig-zag that masks instead of skipping the
    balanced part alone, both with the counts?"""
    _lose(graded_lesson, "eli", "11.1/ring", "11.2/balanced")
    graded_lesson.check_feedback("eli", "Do not send the block you received at the last step",
                                 "skipping what the causal mask hides leaves at most")


def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 11, each graded without an error?"""
    graded_lesson.check_every_learner_graded()
