"""Lesson 11 graded end to end with the real nbgrader: ring, zig-zag and Ulysses attention, right and wrong.

A temporary copy of the course receives two learners' versions of lesson 11 and is graded
with `python -m autograder grade`, the instructor's command: amy hands in the instructor's
three answers, ben a ring that deadlocks (each run must end promptly). cid, dee and eli are
decided by the clean re-grade alone in tests/test_regrade_11.py: eli hands in right answers
of other shapes; the others make the mistakes these exercises invite, one per exercise in each
hand-in, since the exercises are graded apart (more of the usual mistakes are tried in
tests/test_lesson11.py, faster):

- ben: every rank sends its block with a blocking ``dist.send`` before receiving (a deadlock);
  a zig-zag with no communication at all (causal attention over the rank's own two chunks);
  11.3 untouched;
- cid: a ring attention that returns q at once (it sends nothing, so it cannot hang); a
  zig-zag that sends every rank's keys and values straight to every rank (right values, even
  work, no ring); a Ulysses that all-gathers the keys and values with all_to_all;
- dee: every received block kept as a tensor of its own and merged after the ring (right values,
  ring traffic, no tensor over the limit, memory that grows with p); 11.2 answered with 11.1's
  causal ring, whose mask is the contiguous layout's; 11.3 with the heads' pieces put back in the
  wrong order;
- eli: blocks merged through their log-sum-exp with the scores in float64 (also for float32
  inputs) and K and V as two messages a step; a zig-zag computing its diagonal block as three
  products; a Ulysses with q, k and v packed into one all_to_all. All right.
"""

from __future__ import annotations

import pytest

from _grading import variant
from devtools.scratch import solution_source

pytestmark = pytest.mark.slow  # every test reads the graded class

LESSON = "11-long-sequences"
RING, ZIGZAG, ULYSSES = "ex11_1-ring-attention", "ex11_2-zigzag-attention", "ex11_3-ulysses-attention"

POST = "            requests = [dist.isend(kv, right), dist.irecv(incoming, left)]"

# ben: every rank sends first, blocking: nobody reaches its receive.
BLOCKING = ((POST, "            dist.send(kv, right)\n            dist.recv(incoming, left)\n            requests = []"),)

# dee's 11.2: Exercise 11.1's causal ring on the zig-zag layout.
CONTIGUOUS = '''# Exercise 11.2: zig-zag causal ring attention
def zigzag_attention(q, k, v):
    return ring_attention(q, k, v, causal=True)
'''

# dee: every received block kept as a tensor of its own, merged once the ring has passed.
KEEPS_THE_BLOCKS = '''# Exercise 11.1: ring attention from point-to-point calls
def ring_attention(q, k, v, causal=False):
    rank, p = dist.get_rank(), dist.get_world_size()
    n = q.shape[-2]
    blocks = [torch.stack((k, v))]
    for step in range(p - 1):
        incoming = torch.empty_like(blocks[-1])
        requests = [dist.isend(blocks[-1], (rank + 1) % p), dist.irecv(incoming, (rank - 1) % p)]
        for request in requests:
            request.wait()
        blocks.append(incoming)
    partial = None
    for step, kv in enumerate(blocks):
        owner = (rank - step) % p
        if not causal or owner < rank:
            partial = merge(partial, block_attention(q, kv[0], kv[1]))
        elif owner == rank:
            partial = merge(partial, block_attention(q, kv[0], kv[1], torch.ones(n, n, dtype=torch.bool).tril()))
    o, m, l = partial
    return o / l
'''

# dee's 11.3: the heads' pieces put back in the wrong order (rank by rank within each head block).
WRONG_ORDER = (("    return arrived.reshape(heads, n, d)", "    return arrived.transpose(0, 1).reshape(heads, n, d)"),)

# cid: nothing sent, nothing waited for.
RETURNS_Q = '''# Exercise 11.1: ring attention from point-to-point calls
def ring_attention(q, k, v, causal=False):
    return q
'''

# ben: causal attention over the rank's own two chunks, no communication.
ZIGZAG_ALONE = '''# Exercise 11.2: zig-zag causal ring attention
def zigzag_attention(q, k, v):
    n = q.shape[-2]
    o, m, l = block_attention(q, k, v, torch.ones(n, n, dtype=torch.bool).tril())
    return o / l
'''

# cid: every rank's keys and values sent straight to every rank, then the same products as the ring.
ZIGZAG_STRAIGHT = '''# Exercise 11.2: zig-zag causal ring attention
def zigzag_attention(q, k, v):
    rank, p = dist.get_rank(), dist.get_world_size()
    n = q.shape[-2]
    c = n // 2
    kv = torch.stack((k, v))
    blocks, requests = {rank: kv}, []
    for other in range(p):
        if other != rank:
            blocks[other] = torch.empty_like(kv)
            requests += [dist.isend(kv, other), dist.irecv(blocks[other], other)]
    for request in requests:
        request.wait()
    both = block_attention(q, k, v, torch.ones(n, n, dtype=torch.bool).tril())
    second = None
    for owner, theirs in blocks.items():
        if owner < rank:
            both = merge(both, block_attention(q, theirs[0, :, :c], theirs[1, :, :c]))
        elif owner > rank:
            second = merge(second, block_attention(q[:, c:], theirs[0], theirs[1]))
    o, m, l = both
    if second is not None:
        o_2, _, l_2 = merge((o[:, c:], m[:, c:], l[:, c:]), second)
        o, l = torch.cat((o[:, :c], o_2), dim=1), torch.cat((l[:, :c], l_2), dim=1)
    return o / l
'''

# cid: every rank's keys and values to every rank through all_to_all: an all-gather, not the heads split.
ULYSSES_ALL_GATHER = '''# Exercise 11.3: (optional) Ulysses attention with all_to_all
def ulysses_attention(q, k, v, causal=False):
    rank, p = dist.get_rank(), dist.get_world_size()
    heads, n, d = q.shape

    def gather(x):
        arrived = torch.empty(p, heads, n, d, dtype=x.dtype)
        dist.all_to_all_single(arrived, x.unsqueeze(0).expand(p, heads, n, d).contiguous())
        return arrived.transpose(0, 1).reshape(heads, p * n, d)

    keys, values = gather(k), gather(v)
    scores = q @ keys.transpose(-1, -2) / math.sqrt(d)
    if causal:
        mine = torch.arange(rank * n, (rank + 1) * n)
        scores = scores.masked_fill(torch.arange(p * n)[None, :] > mine[:, None], float("-inf"))
    return torch.softmax(scores, dim=-1) @ values
'''

# eli: blocks merged through their log-sum-exp, scores in float64 whatever the inputs, K and V as two messages a step.
LOG_SUM_EXP = '''# Exercise 11.1: ring attention from point-to-point calls
def ring_attention(q, k, v, causal=False):
    rank, p = dist.get_rank(), dist.get_world_size()
    n = q.shape[-2]
    out = lse = None
    for step in range(p):
        if step < p - 1:
            k_in, v_in = torch.empty_like(k), torch.empty_like(v)
            requests = [dist.isend(k, (rank + 1) % p), dist.isend(v, (rank + 1) % p),
                        dist.irecv(k_in, (rank - 1) % p), dist.irecv(v_in, (rank - 1) % p)]
        owner = (rank - step) % p
        if not causal or owner <= rank:
            scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
            if causal and owner == rank:
                scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
            block_lse = torch.logsumexp(scores, dim=-1, keepdim=True)
            block_out = torch.softmax(scores, dim=-1) @ v.double()
            if out is None:
                out, lse = block_out, block_lse
            else:
                new = torch.logaddexp(lse, block_lse)
                out = out * torch.exp(lse - new) + block_out * torch.exp(block_lse - new)
                lse = new
        if step < p - 1:
            for request in requests:
                request.wait()
            k, v = k_in, v_in
    return out.to(q.dtype)
'''

# eli: the diagonal block as three c x c products (the hidden one skipped), K and V as two messages a step.
ZIGZAG_THREE_PRODUCTS = '''# Exercise 11.2: zig-zag causal ring attention
def zigzag_attention(q, k, v):
    rank, p = dist.get_rank(), dist.get_world_size()
    c = q.shape[-2] // 2
    triangle = torch.ones(c, c, dtype=torch.bool).tril()
    first = second = None
    for step in range(p):
        if step < p - 1:
            k_in, v_in = torch.empty_like(k), torch.empty_like(v)
            requests = [dist.isend(k, (rank + 1) % p), dist.isend(v, (rank + 1) % p),
                        dist.irecv(k_in, (rank - 1) % p), dist.irecv(v_in, (rank - 1) % p)]
        owner = (rank - step) % p
        if owner == rank:
            first = merge(first, block_attention(q[:, :c], k[:, :c], v[:, :c], triangle))
            second = merge(second, block_attention(q[:, c:], k[:, :c], v[:, :c]))
            second = merge(second, block_attention(q[:, c:], k[:, c:], v[:, c:], triangle))
        elif owner < rank:
            first = merge(first, block_attention(q[:, :c], k[:, :c], v[:, :c]))
            second = merge(second, block_attention(q[:, c:], k[:, :c], v[:, :c]))
        else:
            second = merge(second, block_attention(q[:, c:], k, v))
        if step < p - 1:
            for request in requests:
                request.wait()
            k, v = k_in, v_in
    return torch.cat((first[0] / first[2], second[0] / second[2]), dim=1)
'''

# eli: q, k and v packed into one all_to_all, the output back in another.
ULYSSES_PACKED = '''# Exercise 11.3: (optional) Ulysses attention with all_to_all
def ulysses_attention(q, k, v, causal=False):
    p = dist.get_world_size()
    heads, n, d = q.shape
    packed = torch.stack((q, k, v)).reshape(3, p, heads // p, n, d).transpose(0, 1).contiguous()
    arrived = torch.empty_like(packed)
    dist.all_to_all_single(arrived, packed)       # piece j: heads block j of q, k and v, to rank j
    q_h, k_h, v_h = arrived.permute(1, 2, 0, 3, 4).reshape(3, heads // p, p * n, d)
    scores = q_h @ k_h.transpose(-1, -2) / math.sqrt(d)
    if causal:
        scores = scores.masked_fill(~torch.ones(p * n, p * n, dtype=torch.bool).tril(), float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v_h
    back = out.reshape(heads // p, p, n, d).transpose(0, 1).contiguous()
    result = torch.empty_like(back)
    dist.all_to_all_single(result, back)
    return result.reshape(heads, n, d)
'''


def _answers(ring=(), *, ring_source=None, zigzag_source=None, ulysses=(), ulysses_source=None, skip=()):
    cells = {RING: ring_source or variant(LESSON, RING, *ring),
             ZIGZAG: zigzag_source or solution_source(LESSON, ZIGZAG),
             ULYSSES: ulysses_source or variant(LESSON, ULYSSES, *ulysses)}
    return {grade_id: source for grade_id, source in cells.items() if grade_id not in skip}


LEARNERS = {
    "amy": {grade_id: solution_source(LESSON, grade_id) for grade_id in (RING, ZIGZAG, ULYSSES)},
    "ben": _answers(BLOCKING, zigzag_source=ZIGZAG_ALONE, skip=(ULYSSES,)),
    "cid": _answers(ring_source=RETURNS_Q, zigzag_source=ZIGZAG_STRAIGHT, ulysses_source=ULYSSES_ALL_GATHER),
    "dee": _answers(ring_source=KEEPS_THE_BLOCKS, zigzag_source=CONTIGUOUS, ulysses=WRONG_ORDER),
    "eli": _answers(ring_source=LOG_SUM_EXP, zigzag_source=ZIGZAG_THREE_PRODUCTS, ulysses_source=ULYSSES_PACKED),
}
# amy and ben through the grade command; cid, dee and eli in tests/test_regrade_11.py.
HANDED_IN = {LESSON: {who: LEARNERS[who] for who in ("amy", "ben")}}


def _lose(graded_lesson, student: str, *parts: str) -> None:
    assert graded_lesson.scores(student) == {**graded_lesson.points, **dict.fromkeys(parts, 0)}


def test_the_instructors_answers_earn_full_marks(graded_lesson):
    """Do the instructor's three answers, handed in as a learner's, earn every point?"""
    assert graded_lesson.scores("amy") == graded_lesson.points


def test_a_ring_that_sends_first_everywhere_and_a_zigzag_alone_lose_everything(graded_lesson):
    """Does a ring where every rank sends first (blocking) lose every part of 11.1, each run ending promptly, with
    the fix (isend to the right, irecv from the left) in the feedback; a zig-zag with no communication both parts of
    11.2 (balanced: fewer scores than the mask leaves visible); and the untouched 11.3 both of its parts?"""
    _lose(graded_lesson, "ben", "11.1/correct", "11.1/ring", "11.1/memory", "11.1/no_hang", "11.2/correct",
          "11.2/balanced", "11.3/correct", "11.3/exchange")
    graded_lesson.check_feedback("ben", "dist.isend to the right and dist.irecv from the left",
                                 "its queries see through the causal mask", "still raises NotImplementedError")


def test_grading_run_records_every_learner(graded_lesson):
    """Does the run record hold every learner of lesson 11, each graded without an error?"""
    graded_lesson.check_every_learner_graded()
