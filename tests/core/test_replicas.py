"""Replicas as they are (DESIGN §5): KV budgets, the engines' preemption, per-replica speed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.core import two_stage
from balanceroute.core.dynamics import StepModel
from balanceroute.core.policies import get_policy
from balanceroute.core.policies.br0 import BR0Policy, kv_window
from balanceroute.core.replica_engine import RECOMPUTE_S_PER_TOKEN
from balanceroute.core.simulator import SimConfig, simulate
from balanceroute.core.state import ClusterState, PoolView, planned_overflow, validate_assignment
from balanceroute.core.workloads.base import Workload
from tests.factories import lognormal_workload, random_tick


def _same_run(a, b):
    for key, value in a.metrics.items():
        assert b.metrics[key] == value or (np.isnan(value) and np.isnan(b.metrics[key])), key
    for name in ("replica", "start_step", "finish_step", "ttft_s", "pool_wait_s"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.mark.parametrize("name", ["br0", "jsq", "power_of_two"])
def test_engines_without_a_binding_budget_run_as_the_plain_loop(name):
    w = lognormal_workload(300, seed=3, prompt_mu=5.0, output_mu=3.5)
    plain = simulate(w, get_policy(name, seed=1), SimConfig(num_replicas=3, slots=4))
    equal = (StepModel(),) * 3
    engine = simulate(w, get_policy(name, seed=1),
                      SimConfig(num_replicas=3, slots=4, kv_budget=10**12, replica_steps=equal))
    _same_run(plain, engine)
    assert engine.metrics["preemptions"] == 0


def test_the_newest_running_request_is_preempted_and_recomputed():
    # one replica, budget 100 KV tokens; A (60 + 10) then B (30 + 10), both routed at step 0.
    # Loads 90 + 2(k + 1) after step k pass 100 after step 5: step 6 preempts B (the newest,
    # 30 + 6 = 36 tokens) and admits nothing; B waits until A has finished (step 9), then
    # recomputes its 36 tokens in step 10 and finishes its last 4 tokens in step 13.
    w = Workload(name="two", prompt_len=np.array([60, 30]), output_len=np.array([10, 10]))
    step = StepModel(b=0.01, a=0.0, c=0.0)
    cfg = SimConfig(num_replicas=1, slots=2, kv_budget=100, replica_steps=(step,), pool_size=2)
    r = simulate(w, get_policy("jsq"), cfg)
    assert r.metrics["preemptions"] == 1
    assert r.metrics["recomputed_tokens"] == 36
    assert r.finish_step.tolist() == [9, 13]
    # 14 steps of 10 ms, one of them paying the recompute
    assert r.metrics["busy_time_s"] == pytest.approx(14 * 0.01 + 36 * RECOMPUTE_S_PER_TOKEN)


def test_a_full_replica_makes_the_request_wait_there():
    # budget 100: A (80 + 5) runs; B (50 + 5) waits at the replica until A is gone
    w = Workload(name="two", prompt_len=np.array([80, 50]), output_len=np.array([5, 5]))
    cfg = SimConfig(num_replicas=1, slots=2, kv_budget=100, pool_size=2,
                    replica_steps=(StepModel(b=0.01, a=0.0),))
    r = simulate(w, get_policy("jsq"), cfg)
    assert r.start_step.tolist() == [0, 0]  # both routed at once (the router saw free slots)
    assert r.finish_step.tolist() == [4, 9]  # B ran steps 5..9
    assert r.metrics["preemptions"] == 0


def test_br0_waits_in_the_pool_instead():
    w = Workload(name="two", prompt_len=np.array([80, 50]), output_len=np.array([5, 5]))
    cfg = SimConfig(num_replicas=1, slots=2, kv_budget=100, pool_size=2,
                    replica_steps=(StepModel(b=0.01, a=0.0),))
    r = simulate(w, BR0Policy(kv_growth_steps=4), cfg)
    assert sorted(r.start_step.tolist()) == [0, 5]  # the second routed only once it fits
    assert r.metrics["preemptions"] == 0


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), replicas=st.integers(1, 5), pool=st.integers(1, 24),
       steps=st.sampled_from([0, 16, 64]), r_max=st.sampled_from([0, 3]))
def test_br0_never_plans_a_load_above_a_budget(seed, replicas, pool, steps, r_max):
    rng = np.random.default_rng(seed)
    state, view = random_tick(rng, replicas=replicas, pool=pool)
    state.kv_budget = state.loads + rng.integers(0, 12_000, size=replicas)
    view.wait = rng.choice([0.0, 1.0, 40.0], size=pool)  # some past the pool deadline
    out = BR0Policy(kv_growth_steps=steps, r_max=r_max).assign(state, view)
    validate_assignment(state, view, out, budget=True)
    room, cost = kv_window(state, view.prompt_len, steps=steps)
    taken = np.zeros(replicas)
    np.add.at(taken, out.replica, cost[out.pool_index, 0])
    assert np.all(taken <= room[:, 0])
    assert not planned_overflow(state, view, out).any()


def test_validate_assignment_rejects_a_request_larger_than_the_budget():
    state = ClusterState(loads=np.array([0, 0]), free_slots=np.array([2, 2]),
                         num_active=np.array([0, 0]), kv_budget=np.array([100, 1000]))
    pool = PoolView(prompt_len=np.array([500]), wait=np.zeros(1), request_ids=np.arange(1))
    validate_assignment(state, pool, two_stage.Assignment(np.array([0]), np.array([1])),
                        budget=True)
    with pytest.raises(ValueError, match="budget"):
        validate_assignment(state, pool, two_stage.Assignment(np.array([0]), np.array([0])),
                            budget=True)
    validate_assignment(state, pool, two_stage.Assignment(np.array([0]), np.array([0])))
    overflow = planned_overflow(state, pool, two_stage.Assignment(np.array([0]), np.array([0])))
    assert overflow.tolist() == [400, 0]


# --- speed: step time instead of tokens ------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), replicas=st.integers(1, 6), pool=st.integers(0, 30),
       a=st.sampled_from([1e-7, 2e-7, 3.3e-7]), b=st.sampled_from([0.0, 0.03]),
       c=st.sampled_from([0.0, 1e-4]), r_max=st.sampled_from([0, 2]))
def test_equal_coefficients_decide_exactly_as_tokens(seed, replicas, pool, a, b, c, r_max):
    rng = np.random.default_rng(seed)
    state, view = random_tick(rng, replicas=replicas, pool=pool)
    view.wait = rng.choice([0.0, 3.0, 40.0], size=pool)
    policy = BR0Policy(r_max=r_max)
    tokens = policy.assign(state, view)
    state.step_a, state.step_b, state.step_c = (np.full(replicas, x) for x in (a, b, c))
    timed = policy.assign(state, view)
    assert tokens.pool_index.tolist() == timed.pool_index.tolist()
    assert tokens.replica.tolist() == timed.replica.tolist()


tick_cases = st.integers(1, 6).flatmap(lambda g: st.fixed_dictionaries({
    "loads": st.lists(st.integers(0, 30_000), min_size=g, max_size=g),
    "free": st.lists(st.integers(0, 5), min_size=g, max_size=g),
    "weights": st.lists(st.sampled_from([0.5, 1.0, 2.0, 4.0]), min_size=g, max_size=g),
    "offsets": st.lists(st.sampled_from([0.0, 512.0, 4096.0]), min_size=g, max_size=g),
    "room": st.one_of(st.none(), st.lists(st.integers(-100, 40_000), min_size=g, max_size=g)),
    "pool": st.lists(st.tuples(st.integers(1, 6000), st.sampled_from([0.0, 0.5, 31.0])),
                     max_size=20),
    "s_greedy": st.integers(0, 10),
    "r_max": st.integers(0, 4),
    "options": st.fixed_dictionaries({
        "stage1": st.sampled_from(["fit", "paper"]), "ttft_slo_s": st.sampled_from([None, 2.0]),
        "lpt_batches": st.booleans()}),
}))


@settings(max_examples=150, deadline=None)
@given(tick_cases)
def test_tick_kernel_equals_numpy_path_with_speeds_and_budgets(case):
    # power-of-two weights, integer loads and costs: every operation is exact, so the compiled
    # kernel and the numpy path must decide identically
    prompt = np.array([p for p, _ in case["pool"]], dtype=np.int64)
    wait = np.array([w for _, w in case["pool"]])
    extras = dict(weights=np.array(case["weights"]), offsets=np.array(case["offsets"]))
    if case["room"] is not None:
        extras.update(room=np.array(case["room"], dtype=float)[:, None],
                      cost=(prompt + 64.0)[:, None])
    kwargs = dict(d=np.ones(1), alpha=1.0, beta=float(3 * len(case["loads"])),
                  s_greedy=case["s_greedy"], r_max=case["r_max"], deadline_s=30.0,
                  growth_steps=64.0, **case["options"], **extras)
    loads = np.array(case["loads"], dtype=float)[:, None]
    got = two_stage.two_stage_assign(loads, np.array(case["free"]), prompt, wait, **kwargs)
    alt = two_stage._two_stage_numpy(loads, np.array(case["free"]), prompt, wait, **kwargs)
    assert got.pool_index.tolist() == alt.pool_index.tolist()
    assert got.replica.tolist() == alt.replica.tolist()
    if case["room"] is not None:  # and neither plans above a budget
        taken = np.zeros(len(case["loads"]))
        np.add.at(taken, got.replica, prompt[got.pool_index] + 64.0)
        assert np.all((taken == 0) | (taken <= np.array(case["room"])))


def test_unit_weights_through_the_kernel_change_nothing():
    rng = np.random.default_rng(5)
    for _ in range(50):
        state, view = random_tick(rng, replicas=5, pool=20)
        kwargs = dict(d=np.ones(1), alpha=1.0, beta=15.0, s_greedy=8, r_max=0, deadline_s=30.0,
                      growth_steps=256.0, ttft_slo_s=4.0, lpt_batches=True)
        plain = two_stage.two_stage_assign(state.loads[:, None], state.free_slots,
                                           view.prompt_len, view.wait, **kwargs)
        unit = two_stage.two_stage_assign(state.loads[:, None], state.free_slots,
                                          view.prompt_len, view.wait, weights=np.ones(5),
                                          offsets=np.zeros(5), **kwargs)
        assert plain.pool_index.tolist() == unit.pool_index.tolist()
        assert plain.replica.tolist() == unit.replica.tolist()


def test_a_late_request_goes_to_the_replica_that_finishes_first():
    # equal token loads: in tokens a tie (the lower index, the slow replica); in step time the
    # slow replica (a twice as large) is the envelope and the fast one has the margin
    state = ClusterState(loads=np.array([1000, 1000]), free_slots=np.array([4, 4]),
                         num_active=np.array([4, 4]))
    pool = PoolView(prompt_len=np.array([500]), wait=np.array([40.0]), request_ids=np.arange(1))
    policy = BR0Policy(s_greedy=100)
    assert policy.assign(state, pool).replica.tolist() == [0]
    state.step_a, state.step_b = np.array([4e-7, 2e-7]), np.array([0.03, 0.03])
    assert policy.assign(state, pool).replica.tolist() == [1]


def test_slow_replicas_get_less_load_and_the_barrier_idles_less():
    w = lognormal_workload(800, seed=2, prompt_mu=6.5, output_mu=4.0)
    steps = (StepModel(b=0.03, a=2e-7),) * 3 + (StepModel(b=0.045, a=3e-7),)
    cfg = SimConfig(num_replicas=4, slots=8, replica_steps=steps)
    timed = simulate(w, BR0Policy(), cfg)
    tokens = simulate(w, get_policy("least_load"), cfg)
    assert timed.metrics["step_idle_fraction"] < tokens.metrics["step_idle_fraction"]
    assert timed.metrics["throughput_loaded_tok_s"] > tokens.metrics["throughput_loaded_tok_s"]


def test_least_load_counts_tokens_against_capacity():
    state = ClusterState(loads=np.array([10, 50]), free_slots=np.array([1, 1]),
                         num_active=np.array([1, 1]))
    pool = PoolView(prompt_len=np.array([5]), wait=np.zeros(1), request_ids=np.arange(1))
    assert get_policy("least_load").assign(state, pool).replica.tolist() == [0]
    state.kv_budget = np.array([100, 1000])  # replica 1 has 950 tokens free, replica 0 90
    assert get_policy("least_load").assign(state, pool).replica.tolist() == [1]
    state.kv_budget = np.array([500, 500])  # equal budgets: the token order
    assert get_policy("least_load").assign(state, pool).replica.tolist() == [0]
