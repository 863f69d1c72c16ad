"""The two-stage tick against enumeration and against the literal reference of DESIGN §2."""

from itertools import combinations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.core.model import f_score, horizon_f_score
from balanceroute.core.two_stage import best_subset, subset_masks, two_stage_assign
from benchmarks.reference import reference_tick


def test_subset_masks_enumerate_every_nonempty_subset():
    masks = subset_masks(4)
    assert masks.shape == (15, 4)
    assert len({tuple(r) for r in masks}) == 15
    assert list(masks.sum(axis=1)) == sorted(masks.sum(axis=1))


@given(
    sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=6),
    margin=st.integers(0, 12_000),
    g_count=st.integers(2, 16),
    cap=st.integers(1, 6),
)
def test_best_subset_equals_enumeration_br0(sizes, margin, g_count, cap):
    sizes = np.array(sizes, dtype=float)
    chosen, best = best_subset(sizes, np.array([float(margin)]), cap, np.ones(1), 1.0, float(g_count))
    brute = max(
        f_score(sum(sizes[list(q)]), margin, g_count)
        for r in range(1, min(cap, len(sizes)) + 1)
        for q in combinations(range(len(sizes)), r)
    )
    assert best == brute
    assert 1 <= len(chosen) <= cap
    assert f_score(sizes[chosen].sum(), margin, g_count) == brute


@given(
    sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=5),
    margin=st.lists(st.integers(0, 8000), min_size=3, max_size=3),
    cap=st.integers(1, 5),
)
def test_best_subset_equals_enumeration_horizon(sizes, margin, cap):
    sizes = np.array(sizes, dtype=float)
    m = np.array(margin, dtype=float)
    d = np.array([1.0, 0.5, 0.25])
    _, best = best_subset(sizes, m, cap, d, 1.5, 6.0)
    brute = max(
        float(horizon_f_score(sum(sizes[list(q)]), m, d, 1.5, 6.0))
        for r in range(1, min(cap, len(sizes)) + 1)
        for q in combinations(range(len(sizes)), r)
    )
    assert best == brute


tick_instances = st.integers(1, 6).flatmap(
    lambda g: st.tuples(
        st.lists(st.integers(0, 20_000), min_size=g, max_size=g),
        st.lists(st.integers(0, 4), min_size=g, max_size=g),
        st.lists(st.tuples(st.integers(1, 6000), st.sampled_from([0.0, 1.0, 40.0, 50.0])), max_size=12),
        st.integers(0, 8),
        st.integers(1, 5),
    )
)


@settings(max_examples=300, deadline=None)
@given(tick_instances)
def test_tick_matches_literal_reference_br0(instance):
    loads, free, pool, s_greedy, r_max = instance
    prompt = [p for p, _ in pool]
    wait = [w for _, w in pool]
    g_count = len(loads)
    kwargs = dict(d=[1.0], alpha=1.0, beta=float(g_count), s_greedy=s_greedy, r_max=r_max, deadline_s=30.0)
    got = two_stage_assign(
        np.array(loads, dtype=float)[:, None], np.array(free), np.array(prompt, dtype=np.int64),
        np.array(wait), **kwargs,
    )
    want = reference_tick([[float(x)] for x in loads], free, prompt, wait, **kwargs)
    assert list(zip(got.pool_index.tolist(), got.replica.tolist())) == want
    assert len(got) == min(sum(free), len(pool))  # work-conserving


@settings(max_examples=150, deadline=None)
@given(tick_instances, st.data())
def test_tick_matches_literal_reference_horizon(instance, data):
    loads, free, pool, s_greedy, r_max = instance
    prompt = [p for p, _ in pool]
    wait = [w for _, w in pool]
    g_count = len(loads)
    proj = [[float(x) + data.draw(st.integers(-500, 500)) * h for h in range(3)] for x in loads]
    growth = [[float(h * (h < 2)) for h in range(3)] for _ in prompt]
    kwargs = dict(d=[1.0, 0.5, 0.25], alpha=1.0, beta=float(g_count), s_greedy=s_greedy,
                  r_max=r_max, deadline_s=30.0)
    got = two_stage_assign(
        np.array(proj), np.array(free), np.array(prompt, dtype=np.int64), np.array(wait),
        growth=np.array(growth).reshape(len(prompt), 3), **kwargs,
    )
    want = reference_tick(proj, free, prompt, wait, growth=growth, **kwargs)
    assert list(zip(got.pool_index.tolist(), got.replica.tolist())) == want


def test_stage1_gives_the_freest_replica_its_best_scoring_request():
    # G = 2, both empty with 4 free slots, S_greedy = 0 → Stage 1 throughout (while Σ free > 0).
    # 1) tie on free slots, lower load → replica 0; margins 0, so F(s) = s − 2s = −s: the
    #    smallest prompt scores best → 100 to g0 (envelope M = 100).
    # 2) g1 has more free slots (4 > 3); margin 100: F(200) = 200 − 2·100 = 0 beats
    #    F(300) = 300 − 2·200 = −100 → 200 to g1 (M = 200).
    # 3) tie at 3 free, lower load → g0, margin 100: only 300 is left → g0.
    got = two_stage_assign(
        np.zeros((2, 1)), np.array([4, 4]), np.array([100, 300, 200]), np.zeros(3),
        d=np.ones(1), alpha=1.0, beta=2.0, s_greedy=0, r_max=4, deadline_s=30.0,
    )
    assert got.pool_index.tolist() == [0, 2, 1]
    assert got.replica.tolist() == [0, 1, 0]


def test_deadline_goes_first():
    # the request that waited 31 s is placed before a better-scoring one
    got = two_stage_assign(
        np.array([[1000.0], [0.0]]), np.array([1, 1]), np.array([500, 10]), np.array([0.0, 31.0]),
        d=np.ones(1), alpha=1.0, beta=2.0, s_greedy=0, r_max=4, deadline_s=30.0,
    )
    assert got.pool_index.tolist()[0] == 1
    assert got.replica.tolist()[0] == 1  # margin 1000 on replica 1 absorbs it


def test_starvation_guard_places_a_request_even_when_all_overflow():
    # one replica at the envelope (margin 0): every subset has F < 0, still one is placed
    got = two_stage_assign(
        np.array([[10.0], [10.0]]), np.array([1, 0]), np.array([7, 3]), np.zeros(2),
        d=np.ones(1), alpha=1.0, beta=2.0, s_greedy=0, r_max=4, deadline_s=30.0,
    )
    assert got.pool_index.tolist() == [1]  # F(3) = 3 - 6 = -3 beats F(7) = -7
