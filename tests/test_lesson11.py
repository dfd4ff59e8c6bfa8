"""Exercises 11.1-11.3's checks against right answers written other ways and against the usual wrong ones.

Each test grades a part the way a hidden test cell does (``grade("11.1", ...)``) on
fresh gloo ranks, and reads the feedback a learner would read: every hole a graded answer could
slip through (holding every key, a collective, a merge that forgets to rescale, a mask built
from the wrong positions, a schedule that deadlocks, computing what the mask hides) is closed
with the sentence that names the fix.
"""

from __future__ import annotations

import pytest

from autograder import exercise
from autograder.kit.harness import GradingFailure
from autograder.hidden import grade

# The answers, defined outside this module so that the ranks receive them by value (cloudpickle).
_SOURCE = '''
import math

import torch
import torch.distributed as dist

from autograder.answers.lesson11 import block_attention, merge_blocks


def _block(q, k, v, mask=None):
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    return e @ v, m, e.sum(-1, keepdim=True)


def _merge(a, b, rescale=True):
    if a is None:
        return b
    (oa, ma, la), (ob, mb, lb) = a, b
    m = torch.maximum(ma, mb)
    if not rescale:                      # the mistake: earlier partials keep their old maximum
        return oa + ob * torch.exp(mb - m), m, la + lb * torch.exp(mb - m)
    return oa * torch.exp(ma - m) + ob * torch.exp(mb - m), m, la * torch.exp(ma - m) + lb * torch.exp(mb - m)


def _mask(kind, rank, source, n):
    tril = torch.ones(n, n, dtype=torch.bool).tril()
    if kind == "right":
        return None if source < rank else tril if source == rank else False
    if kind == "global_query":          # the query's global position against the key's position in its block
        qpos = torch.arange(rank * n, (rank + 1) * n)
        return (torch.arange(n)[None, :] <= qpos[:, None]) if source <= rank else False
    raise ValueError(kind)


def ring(q, k, v, causal=False, *, how="stacked", rescale=True, mask="right", divide=True):
    rank, p = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % p, (rank - 1) % p
    acc = None
    for step in range(p):
        if step < p - 1:
            k_in, v_in = torch.empty_like(k), torch.empty_like(v)
            if how == "batch":
                ops = [dist.P2POp(dist.isend, k, right), dist.P2POp(dist.isend, v, right),
                       dist.P2POp(dist.irecv, k_in, left), dist.P2POp(dist.irecv, v_in, left)]
                requests = dist.batch_isend_irecv(ops)
            elif how == "two":
                requests = [dist.isend(k, right), dist.isend(v, right), dist.irecv(k_in, left), dist.irecv(v_in, left)]
            elif how == "blocking":             # every rank sends first: nobody receives
                dist.send(torch.cat((k, v)), right)
                requests = []
            elif how == "stacked":
                kv_in = torch.empty((2, *k.shape), dtype=k.dtype)
                requests = [dist.isend(torch.stack((k, v)), right), dist.irecv(kv_in, left)]
        source = (rank - step) % p
        this = _mask(mask, rank, source, q.shape[-2]) if causal else None
        if this is not False:
            acc = _merge(acc, _block(q, k, v, this), rescale)
        if step < p - 1:
            for r in requests:
                r.wait()
            if how == "stacked":
                k_in, v_in = kv_in[0], kv_in[1]
            k, v = k_in, v_in
    o, _, l = acc
    return o / l if divide else o


def ring_divides_each_step(q, k, v, causal=False):
    """Divides the output by the running sum after every block, and keeps merging the divided output."""
    rank, p = dist.get_rank(), dist.get_world_size()
    o = m = l = None
    for step in range(p):
        if step < p - 1:
            kv_in = torch.empty((2, *k.shape), dtype=k.dtype)
            requests = [dist.isend(torch.stack((k, v)), (rank + 1) % p), dist.irecv(kv_in, (rank - 1) % p)]
        this = _mask("right", rank, (rank - step) % p, q.shape[-2]) if causal else None
        if this is not False:
            o, m, l = _merge(None if o is None else (o, m, l), _block(q, k, v, this))
            o = o / l
        if step < p - 1:
            for r in requests:
                r.wait()
            k, v = kv_in[0], kv_in[1]
    return o


def ring_kv_apart(q, k, v, causal=False):
    """Sends each step's keys with the values it held one step before: K and V of different ranks meet."""
    rank, p = dist.get_rank(), dist.get_world_size()
    acc, v_before = None, v
    for step in range(p):
        if step < p - 1:
            k_in, v_in = torch.empty_like(k), torch.empty_like(v)
            requests = [dist.isend(k, (rank + 1) % p), dist.isend(v_before, (rank + 1) % p),
                        dist.irecv(k_in, (rank - 1) % p), dist.irecv(v_in, (rank - 1) % p)]
        this = _mask("right", rank, (rank - step) % p, q.shape[-2]) if causal else None
        if this is not False:
            acc = _merge(acc, _block(q, k, v, this))
        if step < p - 1:
            for r in requests:
                r.wait()
            v_before, k, v = v, k_in, v_in
    o, _, l = acc
    return o / l


def ring_global_bool_mask(q, k, v, causal=False):
    """Right: one n x s boolean mask from global positions, sliced per block (small: booleans)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    n = q.shape[-2]
    row = torch.arange(p * n)[None, :] <= torch.arange(rank * n, (rank + 1) * n)[:, None]
    acc, kv = None, torch.stack((k, v))
    for step in range(p):
        if step < p - 1:
            kv_in = torch.empty_like(kv)
            requests = [dist.isend(kv, (rank + 1) % p), dist.irecv(kv_in, (rank - 1) % p)]
        j = (rank - step) % p
        mask = row[:, j * n:(j + 1) * n] if causal else None
        if mask is None or bool(mask.any()):
            acc = _merge(acc, _block(q, kv[0], kv[1], mask))
        if step < p - 1:
            for r in requests:
                r.wait()
            kv = kv_in
    o, _, l = acc
    return o / l


def ring_never_divides(q, k, v, causal=False):
    return ring(q, k, v, causal, divide=False)


def ring_two_messages(q, k, v, causal=False):
    return ring(q, k, v, causal, how="two")


def ring_batched(q, k, v, causal=False):
    return ring(q, k, v, causal, how="batch")


def ring_no_rescale(q, k, v, causal=False):
    return ring(q, k, v, causal, rescale=False)


def ring_global_query_mask(q, k, v, causal=False):
    return ring(q, k, v, causal, mask="global_query")


def ring_blocking(q, k, v, causal=False):
    return ring(q, k, v, causal, how="blocking")


def ring_one_send_too_many(q, k, v, causal=False):
    out = ring(q, k, v, causal)
    p, rank = dist.get_world_size(), dist.get_rank()
    if p > 1:                             # passes the last block on as well: p sends instead of p - 1
        got = torch.empty_like(k)
        requests = [dist.isend(k.clone(), (rank + 1) % p), dist.irecv(got, (rank - 1) % p)]
        for r in requests:
            r.wait()
    return out


def gathers_with_all_gather(q, k, v, causal=False):
    ks = [torch.empty_like(k) for _ in range(dist.get_world_size())]
    dist.all_gather(ks, k)
    return q


def holds_every_key(q, k, v, causal=False):
    """Right values and ring traffic, but every block kept and concatenated: the whole sequence's keys at once."""
    rank, p = dist.get_rank(), dist.get_world_size()
    ks, vs = [k], [v]
    for step in range(p - 1):
        k_in, v_in = torch.empty_like(k), torch.empty_like(v)
        requests = [dist.isend(ks[-1], (rank + 1) % p), dist.isend(vs[-1], (rank + 1) % p),
                    dist.irecv(k_in, (rank - 1) % p), dist.irecv(v_in, (rank - 1) % p)]
        for r in requests:
            r.wait()
        ks.append(k_in)
        vs.append(v_in)
    n = q.shape[-2]
    order = [(rank - s) % p for s in range(p)]
    keys = torch.cat([ks[order.index(j)] for j in range(p)], dim=1)
    values = torch.cat([vs[order.index(j)] for j in range(p)], dim=1)
    s = q @ keys.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        qpos = torch.arange(rank * n, (rank + 1) * n)
        s = s.masked_fill(torch.arange(p * n)[None, :] > qpos[:, None], float("-inf"))
    return torch.softmax(s, -1) @ values


def hides_from_the_recorder(q, k, v, causal=False):
    """Every key held at once, computed with the course's dispatch mode switched off: the checks must still see it."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return holds_every_key(q, k, v, causal)


def zigzag_unskipped(q, k, v):
    """Right values on the zig-zag layout, but every block computed whole and masked: nothing skipped."""
    rank, p = dist.get_rank(), dist.get_world_size()
    n = q.shape[-2]
    c = n // 2

    def positions(r):
        return torch.cat((torch.arange(r * c, (r + 1) * c), torch.arange((2 * p - 1 - r) * c, (2 * p - r) * c)))

    acc, kv = None, torch.stack((k, v))
    for step in range(p):
        if step < p - 1:
            incoming = torch.empty_like(kv)
            requests = [dist.isend(kv, (rank + 1) % p), dist.irecv(incoming, (rank - 1) % p)]
        source = (rank - step) % p
        mask = positions(source)[None, :] <= positions(rank)[:, None]
        s = q @ kv[0].transpose(-1, -2) / q.shape[-1] ** 0.5
        s = s.masked_fill(~mask, -1e30)   # masked, not skipped (a large negative number keeps rows finite)
        m = s.amax(-1, keepdim=True)
        e = torch.exp(s - m)
        acc = _merge(acc, (e @ kv[1], m, e.sum(-1, keepdim=True)))
        if step < p - 1:
            for r in requests:
                r.wait()
            kv = incoming
    o, _, l = acc
    return o / l


def zigzag_contiguous_mask(q, k, v):
    """The ring of 11.1, causal, on the zig-zag layout: the mask of the wrong layout."""
    return ring(q, k, v, True)


def zigzag_uneven(q, k, v):
    """The instructor's zig-zag, plus one more block of scores on rank 0 only: right values, uneven work."""
    from autograder.answers.lesson11 import zigzag_attention

    if dist.get_rank() == 0:
        q @ k.transpose(-1, -2)
    return zigzag_attention(q, k, v)


def ulysses_twice(q, k, v, causal=False):
    """The instructor's Ulysses, then the output exchanged a second time for nothing: right values, 4 blocks too many."""
    from autograder.answers.lesson11 import ulysses_attention

    out = ulysses_attention(q, k, v, causal)
    dist.all_to_all_single(torch.empty_like(out), out.contiguous())
    dist.all_to_all_single(torch.empty_like(out), out.contiguous())
    return out


def ulysses_list(q, k, v, causal=False):
    """Ulysses with the list form of all_to_all (a tensor per peer), which gloo has only in recent torch."""
    p, (h, n, d) = dist.get_world_size(), q.shape

    def swap(pieces, cat_dim):
        got = [torch.empty_like(pieces[0]) for _ in range(p)]
        dist.all_to_all(got, [t.contiguous() for t in pieces])
        return torch.cat(got, dim=cat_dim)

    qh, kh, vh = (swap(list(x.chunk(p, dim=0)), 1) for x in (q, k, v))
    s = qh @ kh.transpose(-1, -2) / d ** 0.5
    if causal:
        s = s.masked_fill(~torch.ones(p * n, p * n, dtype=torch.bool).tril(), float("-inf"))
    return swap(list((torch.softmax(s, -1) @ vh).chunk(p, dim=1)), 0)


def ulysses_gathers(q, k, v, causal=False):
    ks = [torch.empty_like(k) for _ in range(dist.get_world_size())]
    dist.all_gather(ks, k)
    return q


def returns_q(q, k, v, causal=False):
    """Sends nothing, so it cannot hang."""
    return q

def keeps_the_blocks_then_merges(q, k, v, causal=False):
    """Right values and ring traffic, every block a tensor of its own, but all of them kept and merged after the ring."""
    rank, p = dist.get_rank(), dist.get_world_size()
    n = q.shape[-2]
    blocks=[torch.stack((k,v))]
    for step in range(p-1):
        incoming = torch.empty_like(blocks[-1])
        reqs=[dist.isend(blocks[-1],(rank+1)%p), dist.irecv(incoming,(rank-1)%p)]
        for r in reqs: r.wait()
        blocks.append(incoming)
    acc=None
    for step, kv in enumerate(blocks):
        owner = (rank - step) % p
        if causal and owner > rank: continue
        mask = torch.ones(n, n, dtype=torch.bool).tril() if causal and owner == rank else None
        acc = merge_blocks(acc, block_attention(q,kv[0],kv[1], mask))
    o,_,l=acc; return o/l

def lse_merge_in_float64(q, k, v, causal=False):
    """Right, another shape: blocks merged through their log-sum-exp, scores in float64 for any input, K and V as
    two messages a step."""
    rank, p = dist.get_rank(), dist.get_world_size()
    n = q.shape[-2]; out = lse = None
    for step in range(p):
        if step < p - 1:
            k_in, v_in = torch.empty_like(k), torch.empty_like(v)
            reqs = [dist.isend(k, (rank+1)%p), dist.isend(v, (rank+1)%p), dist.irecv(k_in, (rank-1)%p), dist.irecv(v_in, (rank-1)%p)]
        owner = (rank - step) % p
        if not causal or owner <= rank:
            s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
            if causal and owner == rank:
                s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
            block_lse = torch.logsumexp(s, -1, keepdim=True)
            block_out = torch.softmax(s, -1) @ v.double()
            if out is None:
                out, lse = block_out, block_lse
            else:
                new = torch.logaddexp(lse, block_lse)
                out = out * torch.exp(lse - new) + block_out * torch.exp(block_lse - new)
                lse = new
        if step < p - 1:
            for r in reqs: r.wait()
            k, v = k_in, v_in
    return out.to(q.dtype)

def zigzag_alone(q, k, v):
    """No communication: causal attention over the rank's own two chunks."""
    n = q.shape[-2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v

def zigzag_straight_to_every_rank(q, k, v):
    """Right values and even work, but every rank's keys and values sent straight to every rank: no ring."""
    rank, p = dist.get_rank(), dist.get_world_size()
    n = q.shape[-2]; c = n // 2
    kv = torch.stack((k, v)); got = {rank: kv}
    reqs = []
    bufs = {}
    for j in range(p):
        if j != rank:
            reqs.append(dist.isend(kv, j)); bufs[j] = torch.empty_like(kv); reqs.append(dist.irecv(bufs[j], j))
    for r in reqs: r.wait()
    got.update(bufs)
    whole = late = None
    for source in range(p):
        kvs = got[source]
        if source == rank:
            whole = merge_blocks(whole, block_attention(q, kvs[0], kvs[1], torch.ones(n, n, dtype=torch.bool).tril()))
        elif source < rank:
            whole = merge_blocks(whole, block_attention(q, kvs[0, :, :c], kvs[1, :, :c]))
        else:
            late = merge_blocks(late, block_attention(q[:, c:], kvs[0], kvs[1]))
    o, m, l = whole
    if late is not None:
        o2, m2, l2 = merge_blocks((o[:, c:], m[:, c:], l[:, c:]), late)
        o, l = torch.cat((o[:, :c], o2), 1), torch.cat((l[:, :c], l2), 1)
    return o / l

def zigzag_three_diagonal_products(q, k, v):
    """Right, another shape: the diagonal block as three c x c products, K and V as two messages a step."""
    rank, p = dist.get_rank(), dist.get_world_size()
    n = q.shape[-2]; c = n // 2
    tri = torch.ones(c, c, dtype=torch.bool).tril()
    first = second = None
    for step in range(p):
        if step < p - 1:
            k_in, v_in = torch.empty_like(k), torch.empty_like(v)
            reqs = [dist.isend(k, (rank+1)%p), dist.isend(v, (rank+1)%p), dist.irecv(k_in, (rank-1)%p), dist.irecv(v_in, (rank-1)%p)]
        owner = (rank - step) % p
        if owner == rank:
            first = merge_blocks(first, block_attention(q[:, :c], k[:, :c], v[:, :c], tri))
            second = merge_blocks(second, block_attention(q[:, c:], k[:, :c], v[:, :c]))
            second = merge_blocks(second, block_attention(q[:, c:], k[:, c:], v[:, c:], tri))
        elif owner < rank:
            first = merge_blocks(first, block_attention(q[:, :c], k[:, :c], v[:, :c]))
            second = merge_blocks(second, block_attention(q[:, c:], k[:, :c], v[:, :c]))
        else:
            second = merge_blocks(second, block_attention(q[:, c:], k, v))
        if step < p - 1:
            for r in reqs: r.wait()
            k, v = k_in, v_in
    return torch.cat((first[0] / first[2], second[0] / second[2]), 1)

def ulysses_all_gather(q, k, v, causal=False):
    """An all-gather made of all_to_all: every rank's keys and values to every rank, no heads split."""
    p, rank = dist.get_world_size(), dist.get_rank()
    h, n, d = q.shape
    def gather(x):
        out = torch.empty(p, h, n, d, dtype=x.dtype)
        dist.all_to_all_single(out, x.unsqueeze(0).expand(p, h, n, d).contiguous())
        return out.permute(1, 0, 2, 3).reshape(h, p * n, d)
    kk, vv = gather(k), gather(v)
    s = q @ kk.transpose(-1, -2) / math.sqrt(d)
    if causal:
        pos = torch.arange(rank * n, (rank + 1) * n)
        s = s.masked_fill(torch.arange(p * n)[None, :] > pos[:, None], float("-inf"))
    return torch.softmax(s, -1) @ vv

def ulysses_packed(q, k, v, causal=False):
    """Right, another shape: q, k and v packed into one all_to_all."""
    p = dist.get_world_size()
    h, n, d = q.shape
    qkv = torch.stack((q, k, v))                      # (3, h, n, d)
    send = qkv.reshape(3, p, h // p, n, d).transpose(0, 1).contiguous()   # piece j: heads block j of q, k, v
    got = torch.empty_like(send)
    dist.all_to_all_single(got, send)                 # got[j]: rank j's tokens of my heads
    qh, kh, vh = got.permute(1, 2, 0, 3, 4).reshape(3, h // p, p * n, d)
    s = qh @ kh.transpose(-1, -2) / math.sqrt(d)
    if causal:
        s = s.masked_fill(~torch.ones(p * n, p * n, dtype=torch.bool).tril(), float("-inf"))
    out = torch.softmax(s, -1) @ vh                   # (h/p, p n, d)
    back = out.reshape(h // p, p, n, d).transpose(0, 1).contiguous()
    res = torch.empty_like(back)
    dist.all_to_all_single(res, back)
    return res.reshape(h, n, d)
'''
_ANSWERS = {"__name__": "lesson11_test_answers"}
exec(compile(_SOURCE, "<11.x test answers>", "exec"), _ANSWERS)


@pytest.mark.parametrize("answer", ["ring_two_messages", "ring_batched", "ring_global_bool_mask"])
def test_11_1_gives_full_marks_to_k_and_v_as_two_messages_or_batched(factory, answer):
    """Does a ring that sends K and V as two messages a step (isend/irecv, or batch_isend_irecv) earn every part,
    since it moves the same p - 1 blocks of keys and values to the same neighbour? And one whose causal mask is one
    n x s boolean tensor, sliced per block (fewer bytes than a block of scores)?"""
    ex = exercise("11.1")
    for part in ("correct", "ring", "memory"):
        grade(ex.number, _ANSWERS[answer], part)


def test_11_1_refuses_all_gather_with_the_exercises_reason(factory):
    """Does an answer that all-gathers the keys fail, saying collectives are switched off and why?"""
    ex = exercise("11.1")
    with pytest.raises(GradingFailure, match=r"ring: rank \d called a built-in collective.*all_gather is switched off "
                                             r"here") as info:
        grade(ex.number, _ANSWERS["gathers_with_all_gather"], "ring")
    assert ex.forbid_reason in str(info.value)


def test_11_1_memory_fails_an_answer_that_holds_every_key(factory):
    """Does an answer with right values and ring traffic that concatenates every rank's keys pass correct and ring
    but fail memory, naming the tensor and saying that it holds every rank's keys?"""
    ex = exercise("11.1")
    grade(ex.number, _ANSWERS["holds_every_key"], "correct")
    grade(ex.number, _ANSWERS["holds_every_key"], "ring")
    with pytest.raises(GradingFailure, match=r"memory: on 3 ranks, .*created a tensor of shape \(2, 24, 4\) \(192 "
                                             r"numbers, by aten\.cat\.default\); the most a step needs is 128.*every "
                                             r"rank's keys or values at once"):
        grade(ex.number, _ANSWERS["holds_every_key"], "memory")


def test_11_1_memory_fails_an_answer_that_switches_the_recorder_off(factory):
    """Does an answer that holds every key while switching the checks' TorchDispatchMode off fail memory, since the
    recorder then sees fewer scores than every query against every key takes?"""
    with pytest.raises(GradingFailure, match=r"memory: on 3 ranks, not causal, float64, rank 0: the recorder saw 0 "
                                             r"scores computed, fewer than the 384"):
        grade("11.1", _ANSWERS["hides_from_the_recorder"], "memory")


def test_11_1_names_the_merge_that_forgets_to_rescale(factory):
    """Does a merge that keeps earlier blocks at their old maximum fail correct, with the fix (multiply by
    exp(m_old - m_new)) in the feedback?"""
    with pytest.raises(GradingFailure, match=r"(?s)correct: on 2 ranks, .*differs from one process's full attention.*"
                                             r"merging the blocks without rescaling.*exp\(m_old - m_new\)"):
        grade("11.1", _ANSWERS["ring_no_rescale"], "correct")


def test_11_1_names_a_division_before_the_last_block(factory):
    """Does an answer that divides by the running sum at every step fail correct, saying to divide once at the end?"""
    with pytest.raises(GradingFailure, match=r"(?s)correct: on 2 ranks, .*dividing by the running sum at every step.*"
                                             r"divide by the sum l once, after the last block"):
        grade("11.1", _ANSWERS["ring_divides_each_step"], "correct")


def test_11_1_names_an_output_never_divided(factory):
    """Does an answer that returns the merged o without dividing by l fail correct already on 1 rank, saying to
    return o / l?"""
    with pytest.raises(GradingFailure, match=r"(?s)correct: on 1 rank, .*never divided by their sum.*return o / l"):
        grade("11.1", _ANSWERS["ring_never_divides"], "correct")


def test_11_1_points_at_the_blocks_when_k_and_v_travel_apart(factory):
    """Does an answer whose K and V come from different ranks (right on 1 and 2 ranks, wrong from 3) fail correct on
    3 ranks, saying that K and V must come from the same rank, sent in the same step?"""
    with pytest.raises(GradingFailure, match=r"(?s)correct: on 3 ranks, .*the K and V you compute with at each step "
                                             r"must come from the same rank, sent in the same step"):
        grade("11.1", _ANSWERS["ring_kv_apart"], "correct")


def test_11_1_names_a_causal_mask_from_global_query_positions(factory):
    """Does a causal mask that compares the query's global position with the key's position inside its block fail
    correct, saying to use positions in the whole sequence for both?"""
    with pytest.raises(GradingFailure, match=r"(?s)correct: on 2 ranks, causal, float64, rank 1: .*compares the "
                                             r"query's position in the whole sequence with the key's position inside "
                                             r"its block"):
        grade("11.1", _ANSWERS["ring_global_query_mask"], "correct")


def test_11_1_counts_a_block_passed_on_once_too_often(factory):
    """Does a ring that sends p blocks instead of p - 1 (right values) fail the ring part, with the counts?"""
    ex = exercise("11.1")
    grade(ex.number, _ANSWERS["ring_one_send_too_many"], "correct")
    with pytest.raises(GradingFailure, match=r"ring: on 2 ranks, not causal, float64, rank \d sent \d+ bytes and "
                                             r"received \d+ in 2 messages: 1.5 key/value blocks.*p - 1 = 1 block of keys"):
        grade("11.1", _ANSWERS["ring_one_send_too_many"], "ring")


def test_11_1_no_hang_ends_a_deadlocked_ring_promptly_with_the_fix(factory):
    """Does a ring where every rank sends first (blocking) fail no_hang within its time limit, with feedback that
    says to post isend and irecv before computing?"""
    import time

    start = time.monotonic()
    with pytest.raises(GradingFailure, match=r"(?s)no_hang: .*dist\.isend to the right and dist\.irecv from the left"):
        grade("11.1", _ANSWERS["ring_blocking"], "no_hang")
    assert time.monotonic() - start < 20


def test_11_2_balanced_fails_an_answer_that_masks_instead_of_skipping(factory):
    """Does a zig-zag answer with right values that computes every block whole and masks it fail balanced, quoting
    the most scores a rank may compute and how many it did?"""
    ex = exercise("11.2")
    grade(ex.number, _ANSWERS["zigzag_unskipped"], "correct")
    with pytest.raises(GradingFailure, match=r"balanced: on 2 ranks, each rank computed 144 scores; skipping what the "
                                             r"causal mask hides leaves at most 108 \(144 without skipping\)"):
        grade(ex.number, _ANSWERS["zigzag_unskipped"], "balanced")


def test_11_2_names_the_contiguous_layouts_mask(factory):
    """Does 11.1's causal ring run on the zig-zag layout fail correct, naming the layout's positions?"""
    with pytest.raises(GradingFailure, match=r"(?s)correct: on 2 ranks, causal, .*mask of Exercise 11\.1's contiguous "
                                             r"layout.*zigzag_positions"):
        grade("11.2", _ANSWERS["zigzag_contiguous_mask"], "correct")


def test_11_2_balanced_names_uneven_work(factory):
    """Does a zig-zag answer with right values where one rank computes more scores than the others fail balanced,
    listing each rank's count?"""
    with pytest.raises(GradingFailure, match=r"balanced: on 2 ranks, the ranks computed \[180, 108\] scores: the "
                                             r"zig-zag split gives every rank the same causal work"):
        grade("11.2", _ANSWERS["zigzag_uneven"], "balanced")


def test_11_3_exchange_counts_the_bytes_through_all_to_all(factory):
    """Does a Ulysses answer with right values that exchanges its output twice more lose the exchange part, with the
    bytes it moved and the 4 blocks it should?"""
    ex = exercise("11.3")
    grade(ex.number, _ANSWERS["ulysses_twice"], "correct")
    with pytest.raises(GradingFailure, match=r"exchange: on 2 ranks, not causal, float64, rank 0 passed 3456 bytes "
                                             r"through all_to_all; .*4 x 576 = 2304 bytes per rank"):
        grade(ex.number, _ANSWERS["ulysses_twice"], "exchange")


def test_11_3_list_form_all_to_all_earns_full_marks_or_is_told_to_use_all_to_all_single(factory):
    """Does the list form of all_to_all earn both parts where this torch's gloo has it, and, where it does not
    (torch 2.4: "Backend gloo does not support alltoall"), does the learner read that all_to_all_single runs?"""
    ex = exercise("11.3")
    try:
        grade(ex.number, _ANSWERS["ulysses_list"], "correct")
    except GradingFailure as failure:
        assert "does not support alltoall" in str(failure) and "use dist.all_to_all_single(output, input)" in str(failure)
        assert "fault in the course's grading code" not in str(failure)
    else:
        grade(ex.number, _ANSWERS["ulysses_list"], "exchange")


def test_11_3_refuses_all_gather(factory):
    """Does a Ulysses answer that all-gathers fail, saying only all_to_all is on?"""
    ex = exercise("11.3")
    with pytest.raises(GradingFailure, match=r"exchange: rank \d called a built-in collective.*all_gather is switched "
                                             r"off here") as info:
        grade(ex.number, _ANSWERS["ulysses_gathers"], "exchange")
    assert ex.forbid_reason in str(info.value)


def test_11_1_memory_fails_a_list_of_received_blocks_merged_after_the_ring(factory):
    """Does an answer that keeps every received block as a tensor of its own (none larger than the limit) and merges
    them after the ring lose memory, because what it holds grows from 3 ranks to 4, by one block pair? (That it loses
    memory alone, through the grade command: tests/test_grading_e2e_11.py.)"""
    ex = exercise("11.1")
    answer = _ANSWERS["keeps_the_blocks_then_merges"]
    with pytest.raises(GradingFailure, match=r"memory: not causal, float64: the tensors your function created and still "
                                             r"held at one moment took up to [\d,]+ bytes on 4 ranks and [\d,]+ on 3: "
                                             r"1,024 bytes more for 1 rank more.*a list of the received blocks"):
        grade(ex.number, answer, "memory")


def test_11_1_memory_counts_numbers_so_float64_scores_of_float32_inputs_pass(factory):
    """Does a ring that computes its scores in float64 whatever its inputs (blocks merged through their log-sum-exp,
    K and V as two messages) earn the memory part, its float64 block of scores for float32 inputs being as many
    numbers as the limit allows? (Every part, through the grade command: tests/test_grading_e2e_11.py.)"""
    grade("11.1", _ANSWERS["lse_merge_in_float64"], "memory")


def test_11_1_float32_tolerance_admits_every_right_merge_and_no_usual_mistake():
    """On 30 seeds, 2 and 4 ranks, causal and not, does every rank's float32 output of a rescaling merge and of a
    log-sum-exp merge stay within cpdata.tolerance, while every usual mistake's output (on 3 of those seeds) stays
    far outside it?"""
    import math

    import torch

    from autograder.lessons.cpcheck import _data
    from autograder.lessons.cpdata import full_attention, mistakes, tolerance

    def merged(q, ks, vs, masks, lse):
        out = m = l = None
        for k, v, mask in zip(ks, vs, masks):
            s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            if lse:
                block, block_lse = torch.softmax(s, -1) @ v, torch.logsumexp(s, -1, keepdim=True)
                if out is None:
                    out, m = block, block_lse
                else:
                    new = torch.logaddexp(m, block_lse)
                    out, m = out * torch.exp(m - new) + block * torch.exp(block_lse - new), new
                continue
            bm = s.amax(-1, keepdim=True)
            e = torch.exp(s - bm)
            if out is None:
                out, m, l = e @ v, bm, e.sum(-1, keepdim=True)
            else:
                top = torch.maximum(m, bm)
                out = out * torch.exp(m - top) + (e @ v) * torch.exp(bm - top)
                l, m = l * torch.exp(m - top) + e.sum(-1, keepdim=True) * torch.exp(bm - top), top
        return out if lse else out / l

    worst, closest = 0.0, float("inf")
    for seed in range(30):
        for p in (2, 4):
            for causal in (False, True):
                q, k, v = _data(seed, 2, 8 * p, 4, "float32")
                tol = tolerance("float32", q, k, v)
                want = full_attention(q.double(), k.double(), v.double(), causal)
                for rank in range(p):
                    mine = slice(8 * rank, 8 * rank + 8)
                    order = [(rank - step) % p for step in range(p) if not causal or (rank - step) % p <= rank]
                    ks = [k[:, 8 * j:8 * j + 8] for j in order]
                    vs = [v[:, 8 * j:8 * j + 8] for j in order]
                    masks = [torch.ones(8, 8, dtype=torch.bool).tril() if causal and j == rank else None for j in order]
                    for lse in (False, True):
                        error = float((merged(q[:, mine], ks, vs, masks, lse).double() - want[:, mine]).abs().max())
                        worst = max(worst, error / tol)
                    if seed >= 3:
                        continue
                    for got in mistakes(q.double(), k.double(), v.double(), rank, p, "ring", causal, 8).values():
                        error = float((got - want[:, mine]).abs().max())
                        if error > 1e-9:  # a mistake that happens to be right here (on rank 0, say) says nothing
                            closest = min(closest, error / tol)
    assert worst < 0.5, f"a right float32 merge reached {worst:.2f} of the tolerance"
    assert closest > 10, f"a usual mistake came within {closest:.2f} tolerances of the right output"


def test_11_1_no_hang_pays_only_a_ring_that_passed_its_blocks(factory):
    """Does an answer that returns q at once (it sends nothing, so it cannot hang) lose no_hang, saying what the part
    pays for?"""
    with pytest.raises(GradingFailure, match=r"no_hang: on 2 ranks, rank 0 finished, but sent 0 bytes to rank 1 and "
                                             r"received 0 from rank 1; a ring attention passes p - 1 = 1 block"):
        grade("11.1", _ANSWERS["returns_q"], "no_hang")


def test_11_2_balanced_pays_only_the_rings_work_done_evenly(factory):
    """Does a zig-zag answer with no communication lose balanced with fewer scores than the mask leaves visible,
    and correct naming what it computed with, one that sends every rank's keys straight to every rank lose balanced
    (not a ring), and one that computes the diagonal block as three products pass the self-check? (Their grades
    through the grade command: tests/test_grading_e2e_11.py.)"""
    ex = exercise("11.2")
    with pytest.raises(GradingFailure, match=r"(?s)correct: on 2 ranks, causal, float64, rank 0: .*own keys and values "
                                             r"alone"):
        grade(ex.number, _ANSWERS["zigzag_alone"], "correct")
    with pytest.raises(GradingFailure, match=r"balanced: on 2 ranks, each rank computed 72 scores, fewer than the 78 its "
                                             r"queries see through the causal mask"):
        grade(ex.number, _ANSWERS["zigzag_alone"], "balanced")
    with pytest.raises(GradingFailure, match=r"balanced: on 3 ranks, causal, float64, rank 0 sent to rank 2; in a ring "
                                             r"each rank sends only to its right neighbour"):
        grade(ex.number, _ANSWERS["zigzag_straight_to_every_rank"], "balanced")
    ex.self_check(_ANSWERS["zigzag_three_diagonal_products"])


def test_11_3_an_all_gather_made_of_all_to_all_fails_the_self_check(factory):
    """Does a Ulysses that all-gathers the keys and values with all_to_all (right values; on 2 ranks as many bytes as
    the heads split) fail its self-check, naming the all-gather, while q, k and v packed into one all_to_all pass it?
    (The exchange part of both, through the grade command: tests/test_grading_e2e_11.py.)"""
    ex = exercise("11.3")
    with pytest.raises(GradingFailure, match=r"self-check: on 4 ranks, not causal, float64, rank 0 passed 4608 bytes "
                                             r"through all_to_all.*8 blocks are your keys and values sent whole to each "
                                             r"of the 4 ranks: an all-gather made of all_to_all"):
        ex.self_check(_ANSWERS["ulysses_all_gather"])
    ex.self_check(_ANSWERS["ulysses_packed"])


def test_recorder_sees_the_largest_tensor_and_counts_scores_only():
    """Does TensorRecorder note the largest new tensor (not views) and count q k^T's elements but not p v's?"""
    import torch

    from helpers.attention import TensorRecorder

    q, k, v = torch.randn(2, 6, 5), torch.randn(2, 3, 5), torch.randn(2, 3, 5)
    with TensorRecorder(d=5) as rec:
        s = q @ k.transpose(-1, -2)       # (2, 6, 3): 36 scores
        _ = torch.softmax(s, -1) @ v      # contracts over 3 keys: not scores
        _ = s.expand(4, 2, 6, 3)          # a view: nothing new
    assert rec.scores == 36
    assert rec.largest[:2] == (240, (2, 6, 5))  # bytes: 60 float32 numbers


def test_helpers_attention_examples_run():
    """Do the runnable examples in helpers.attention's docstrings (the zig-zag layout, the recorder) give what they show?"""
    import doctest

    import helpers.attention

    result = doctest.testmod(helpers.attention)
    assert result.attempted > 0 and result.failed == 0, result
