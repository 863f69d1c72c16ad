"""The shared suite every registered policy passes, and policy-specific behaviour."""

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.catalogue import CATALOGUE, build_policy
from balanceroute.core.policies import get_policy, policy_names
from balanceroute.core.simulator import SimConfig, simulate
from balanceroute.core.state import ClusterState, PoolView, validate_assignment
from balanceroute.core.workloads.base import Workload
from tests.factories import random_tick

ALL = policy_names()
DETERMINISTIC = [n for n in ALL if n not in ("random", "power_of_two", "round_robin")]


def test_registry_lists_valid_names_on_a_wrong_one():
    with pytest.raises(ValueError, match="valid: random, round_robin"):
        get_policy("nope")


def test_bad_parameters_are_value_errors():
    with pytest.raises(ValueError, match="r_max"):
        get_policy("br0", r_max=-1)
    with pytest.raises(ValueError, match="policy .jsq.: .*argument"):
        get_policy("jsq", bogus=1)
    for name in ("br0", "brh"):  # a JSON params file saying "yes" is refused, not truthy
        with pytest.raises(ValueError, match="lpt_batches.*true or false"):
            get_policy(name, lpt_batches="yes")


@pytest.mark.parametrize("name", ALL)
class TestEveryPolicy:
    """Contract of ``Policy.assign`` (core/policies/base.py)."""

    @settings(max_examples=60, deadline=None)
    @given(seed=st.integers(0, 2**32 - 1), replicas=st.integers(1, 9), pool=st.integers(0, 40))
    def test_valid_work_conserving_and_pure(self, name, seed, replicas, pool):
        policy = get_policy(name, seed=0)
        state, view = random_tick(np.random.default_rng(seed), replicas=replicas, pool=pool)
        before = copy.deepcopy((state, view))
        out = policy.assign(state, view)
        validate_assignment(state, view, out)
        assert len(out) == min(int(state.free_slots.sum()), pool)
        for a, b in zip((state, view), before):
            for field in a.__slots__:
                np.testing.assert_array_equal(getattr(a, field), getattr(b, field))

    def test_empty_pool_and_full_cluster(self, name):
        policy = get_policy(name, seed=0)
        state = ClusterState(loads=np.array([5, 6]), free_slots=np.array([0, 0]), num_active=np.array([2, 2]))
        view = PoolView(prompt_len=np.array([3]), wait=np.zeros(1), request_ids=np.array([0]))
        assert len(policy.assign(state, view)) == 0
        state.free_slots = np.array([1, 0])
        empty = PoolView(prompt_len=np.zeros(0, np.int64), wait=np.zeros(0), request_ids=np.zeros(0, np.int64))
        assert len(policy.assign(state, empty)) == 0

    def test_name_matches_registry(self, name):
        assert get_policy(name, seed=0).name == name


def _distinct_tick(data, replicas: int, pool: int):
    # loads in distinct multiples of 2^20 and prompts distinct powers of two below 2^20: every
    # load reachable within the tick is distinct, so no tie depends on replica order.
    bases = data.draw(st.lists(st.integers(0, 50), min_size=replicas, max_size=replicas, unique=True))
    exps = data.draw(st.lists(st.integers(0, 19), min_size=pool, max_size=pool, unique=True))
    free = data.draw(st.lists(st.integers(0, 3), min_size=replicas, max_size=replicas))
    state = ClusterState(
        loads=np.array(bases, dtype=np.int64) << 20,
        free_slots=np.array(free, dtype=np.int64),
        num_active=4 - np.array(free, dtype=np.int64),
    )
    view = PoolView(
        prompt_len=np.array([1 << e for e in exps], dtype=np.int64),
        wait=np.zeros(pool),
        request_ids=np.arange(pool, dtype=np.int64),
    )
    return state, view


@pytest.mark.parametrize("name", DETERMINISTIC)
@settings(max_examples=80, deadline=None)
@given(data=st.data(), replicas=st.integers(1, 6), pool=st.integers(0, 12))
def test_permuting_replicas_permutes_nothing_else(name, data, replicas, pool):
    state, view = _distinct_tick(data, replicas, pool)
    perm = np.array(data.draw(st.permutations(range(replicas))))
    permuted = ClusterState(
        loads=state.loads[perm], free_slots=state.free_slots[perm], num_active=state.num_active[perm]
    )
    a = get_policy(name).assign(state, view)
    b = get_policy(name).assign(permuted, view)
    assert a.pool_index.tolist() == b.pool_index.tolist()
    assert a.replica.tolist() == perm[b.replica].tolist()


def _tick(loads, free, prompts):
    state = ClusterState(
        loads=np.array(loads), free_slots=np.array(free), num_active=4 - np.array(free)
    )
    view = PoolView(prompt_len=np.array(prompts), wait=np.zeros(len(prompts)),
                    request_ids=np.arange(len(prompts)))
    return state, view


def test_baselines_take_the_pool_head_in_order():
    state, view = _tick([100, 0, 50], [1, 1, 1], [7, 8, 9, 10])
    out = get_policy("least_load").assign(state, view)
    assert out.pool_index.tolist() == [0, 1, 2]
    # 7 → load 0 (g1: 7); 8 → g1 is full → least of g0=100, g2=50 → g2; 9 → g0
    assert out.replica.tolist() == [1, 2, 0]


def test_jsq_prefers_fewest_running_then_lower_load():
    state, view = _tick([100, 0, 50], [2, 1, 2], [5, 5])
    # active = 4 - free = (2, 3, 2): tie g0/g2 → lower load g2; then g0 (active 2 < 3)
    assert get_policy("jsq").assign(state, view).replica.tolist() == [2, 0]


def test_round_robin_cursor_persists_and_skips_full():
    policy = get_policy("round_robin")
    state, view = _tick([0, 0, 0], [1, 0, 1], [1, 1])
    assert policy.assign(state, view).replica.tolist() == [0, 2]
    assert policy.assign(state, view).replica.tolist() == [0, 2]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 7).flatmap(lambda g: st.tuples(
    st.lists(st.integers(0, 2), min_size=g, max_size=g).filter(any),
    st.lists(st.integers(0, 50), min_size=g, max_size=g),
    st.lists(st.integers(0, 3), min_size=g, max_size=g),
    st.integers(0, g - 1))))
def test_fifo_keys_choose_the_lexicographic_minimum(case):
    # brute force: the smallest (key features..., index) among replicas with a free slot
    free, loads, active, cursor = case
    g_count = len(free)
    rules = {"jsq": lambda g: (active[g], loads[g], g),
             "least_load": lambda g: (loads[g], active[g], g),
             "round_robin": lambda g: ((g - cursor) % g_count, g)}
    for name, rank in rules.items():
        policy = get_policy(name)
        policy.cursor = cursor
        got = policy.choose(np.array(free), np.array(loads), np.array(active))
        assert got == min((g for g in range(g_count) if free[g] > 0), key=rank)
        assert policy.cursor == (got + 1) % g_count


def test_random_policies_are_seeded():
    state, view = random_tick(np.random.default_rng(3), replicas=8, pool=30, slots=8)
    for name in ("random", "power_of_two"):
        a = get_policy(name, seed=7).assign(state, view).replica
        b = get_policy(name, seed=7).assign(state, view).replica
        np.testing.assert_array_equal(a, b)


def test_br0_fills_the_margin_instead_of_overflowing():
    # loads 10, 7, 6, 5 (DESIGN example), one free slot on the replica at 6, pool {4, 5}:
    # F(4) = 4 (fills exactly), F(5) = 5 - 4*(5-4) = 1 → BR-0 takes 4; FIFO baselines take 5.
    state, view = _tick([10, 7, 6, 5], [0, 0, 1, 0], [5, 4])
    assert get_policy("br0", s_greedy=0).assign(state, view).pool_index.tolist() == [1]
    assert get_policy("least_load").assign(state, view).pool_index.tolist() == [0]


@pytest.mark.parametrize("name", [n for n, e in CATALOGUE.items() if e.extra is None])
def test_every_catalogue_name_runs_a_simulation_to_the_end(name):
    # every catalogue name without an extra (brh-learned and the exact policies have their own
    # tests) builds from the catalogue and serves every request exactly once
    rng = np.random.default_rng(5)
    n = 80
    workload = Workload(name="w", prompt_len=rng.integers(1, 400, n), output_len=rng.integers(1, 60, n))
    train, test = workload.take(np.arange(40)), workload.take(np.arange(40, n))
    policy = build_policy(name, train=train, test=test, seed=1)
    assert callable(policy.assign)
    res = simulate(test, policy, SimConfig(num_replicas=3, slots=2))
    assert res.metrics["generated_tokens"] == test.output_len.sum()
    assert (res.start_step >= 0).all() and set(res.replica.tolist()) <= {0, 1, 2}
    assert (res.finish_step - res.start_step + 1 == test.output_len).all()


@settings(max_examples=200, deadline=None)
@given(loads=st.lists(st.integers(0, 5_000), min_size=1, max_size=8), data=st.data(),
       prompt=st.integers(1, 4_000))
def test_br0_with_one_pooled_request_picks_least_loads_replica(loads, data, prompt):
    # one pooled request and no growth window (T = 0): the largest margin is the smallest load,
    # ties more free slots (= fewer running, B equal) — least_load's rule, in Stage 1 (either
    # Stage 2) and in the fill (the paper's Stage 2, r_max ≥ 1, visits the freest replica first)
    g_count = len(loads)
    active = np.array(data.draw(st.lists(st.integers(0, 4), min_size=g_count, max_size=g_count)))
    if active.sum() == 4 * g_count:
        active[0] -= 1
    state = ClusterState(loads=np.array(loads, dtype=np.int64), free_slots=(4 - active).astype(np.int64),
                         num_active=active.astype(np.int64))
    pool = PoolView(prompt_len=np.array([prompt]), wait=np.zeros(1), request_ids=np.zeros(1, np.int64))
    want = get_policy("least_load").assign(state, pool).replica.tolist()
    for s_greedy, r_max in ((0, 4), (0, 0), (1 << 20, 0)):  # Stage 1, Stage 1, the fill
        br0 = get_policy("br0", growth_steps=0.0, s_greedy=s_greedy, r_max=r_max)
        assert br0.assign(state, pool).replica.tolist() == want
