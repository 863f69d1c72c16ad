"""KV budgets with bounded outputs: BR's window runs until every request on a replica has ended,
so the engines never preempt, whatever the outputs up to the cap (``kv_until_end``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.catalogue import build_policy
from balanceroute.core.dynamics import StepModel
from balanceroute.core.policies import get_policy
from balanceroute.core.policies.br0 import BR0Policy, kv_until_end, kv_window
from balanceroute.core.simulator import SimConfig, simulate
from balanceroute.core.state import ClusterState, PoolView
from balanceroute.core.workloads.base import Workload


def _state(replica, prompt, age, budget, cap, replicas=2):
    loads = np.bincount(replica, weights=np.add(prompt, age), minlength=replicas).astype(np.int64)
    n = np.bincount(replica, minlength=replicas).astype(np.int64)
    return ClusterState(loads=loads, free_slots=8 - n, num_active=n,
                        active_replica=np.array(replica, dtype=np.int64),
                        active_prompt=np.array(prompt, dtype=np.int64),
                        active_age=np.array(age, dtype=np.int64),
                        kv_budget=np.array(budget, dtype=np.int64), output_cap=cap)


def test_window_by_hand():
    # cap 10: a request of age a runs at most until t = 9 − a. Replica 0 holds A (s 100, age 2:
    # until t = 7) and B (s 50, age 6: until t = 3); replica 1 is empty. Columns t = 0, 3, 7, 9:
    # P_0 = 158 + 0, (102 + 3) + (56 + 3) = 164, 102 + 7 = 109, 0.
    state = _state([0, 0], [100, 50], [2, 6], [200, 200], cap=10)
    room, cost = kv_until_end(state, np.array([30, 195]))
    assert room.tolist() == [[42, 36, 91, 200], [200, 200, 200, 200]]
    # request 0 costs s + t; request 1 (195 + 9 > 200) cannot fit even alone: it costs the whole
    # budget after t = 0, so it fits only the empty replica
    assert cost.tolist() == [[30, 33, 37, 39], [195, 200, 200, 200]]
    assert kv_window(state, np.array([30, 195]))[0].tolist() == room.tolist()  # the cap decides


def test_merged_columns_stay_above_the_exact_projection():
    rng = np.random.default_rng(4)
    n, cap = 200, 3000
    state = _state(rng.integers(0, 4, n), rng.integers(1, 2000, n), rng.integers(0, cap, n),
                   [10**7] * 4, cap=cap, replicas=4)
    exact_room, exact_cost = kv_until_end(state, np.array([500]), max_columns=10**6)
    room, cost = kv_until_end(state, np.array([500]), max_columns=16)
    assert room.shape[1] <= 16 < exact_room.shape[1]
    # every exact column t lies in a merged interval whose check is at least as strict
    for k in range(exact_room.shape[1]):
        t = exact_cost[0, k] - 500
        j = int(np.searchsorted(cost[0] - 500, t))
        assert np.all(room[:, j] <= exact_room[:, k]) and cost[0, j] >= exact_cost[0, k]


def _fit_workload(seed, n=400, cap=300):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(20, 2000, n)
    output = np.minimum(rng.lognormal(4.0, 1.0, n).astype(np.int64) + 1, cap)
    return Workload(name=f"fit-{seed}", prompt_len=prompt, output_len=output)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["br0", "brh-survival"])
def test_no_preemption_whatever_the_outputs(seed, name):
    w = _fit_workload(seed)
    cfg = SimConfig(num_replicas=3, slots=16, kv_budget=9_000, output_cap=300,
                    replica_steps=(StepModel(),) * 3)
    policy = (BR0Policy() if name == "br0" else
              build_policy(name, train=_fit_workload(seed + 50), test=w, seed=seed))
    r = simulate(w, policy, cfg)
    assert r.metrics["preemptions"] == 0
    assert r.metrics["kv_lease_failed"] == 0
    assert (r.finish_step >= 0).all()
    # the same budget and cap, the window of 16 steps instead: the engines preempt
    old = simulate(w, BR0Policy(kv_growth_steps=16, kv_until_end=False), cfg)
    assert old.metrics["preemptions"] > 0


def test_a_request_that_cannot_fit_runs_alone():
    # budget 1000, cap 100: the 950-token prompt (950 + 99 > 1000) runs alone on its replica,
    # which takes nothing else until it has ended; nothing is preempted
    prompt = np.array([950, 300, 300, 300, 300])
    output = np.array([100, 50, 50, 50, 50])
    w = Workload(name="big", prompt_len=prompt, output_len=output)
    cfg = SimConfig(num_replicas=2, slots=4, kv_budget=1000, output_cap=100, pool_size=5,
                    replica_steps=(StepModel(),) * 2)
    r = simulate(w, BR0Policy(), cfg)
    # the four small ones run two by two on both replicas (2·(300 + 99) ≤ 1000) for steps 0..49;
    # the big one waits until a replica is empty and runs there alone, steps 50..149
    assert r.start_step.tolist() == [50, 0, 0, 0, 0] and r.finish_step[0] == 149
    same = np.flatnonzero(r.replica == r.replica[0])[1:]
    assert (r.finish_step[same] < r.start_step[0]).all()
    assert r.metrics["preemptions"] == 0
    assert r.metrics["kv_oversize"] == 1  # 950 + 100 − 1 > 1000


def test_output_cap_stops_long_outputs():
    w = Workload(name="two", prompt_len=np.array([10, 10]), output_len=np.array([5, 50]))
    r = simulate(w, get_policy("jsq"), SimConfig(num_replicas=1, slots=2, output_cap=20))
    assert (r.finish_step - r.start_step).tolist() == [4, 19]
    with pytest.raises(ValueError, match="output_cap"):
        SimConfig(output_cap=0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), replicas=st.integers(1, 4), pool=st.integers(1, 16),
       cap=st.sampled_from([1, 50, 400]))
def test_any_outputs_below_the_cap_stay_within_the_budget(seed, replicas, pool, cap):
    # a random tick: running requests with ages < cap; BR-0 places some pooled ones; then every
    # request draws an output in (age, cap] and the loads are replayed step by step: no replica
    # ever holds more than its budget (the engine's check at the start of each step)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 12))
    rep = rng.integers(0, replicas, n)
    prompt = rng.integers(1, 3000, n)
    age = rng.integers(0, cap, n)
    loads = np.bincount(rep, weights=prompt + age, minlength=replicas).astype(np.int64)
    budget = loads + rng.integers(0, 6000, replicas)
    count = np.bincount(rep, minlength=replicas)
    state = ClusterState(loads=loads, free_slots=(16 - count).astype(np.int64),
                         num_active=count.astype(np.int64), active_replica=rep,
                         active_prompt=prompt, active_age=age, kv_budget=budget, output_cap=cap)
    view = PoolView(prompt_len=rng.integers(1, 3000, pool), wait=rng.choice([0.0, 40.0], pool),
                    request_ids=np.arange(pool))
    room, _ = kv_until_end(state, view.prompt_len)
    out = BR0Policy().assign(state, view)
    ok = np.all(room >= 0, axis=1)  # replicas whose running requests fit whatever their outputs
    assert np.isin(out.replica, np.flatnonzero(ok)).all()  # BR never adds to one that may not
    all_rep = np.concatenate([rep, out.replica])
    all_s = np.concatenate([prompt, view.prompt_len[out.pool_index]])
    all_a = np.concatenate([age, np.zeros(len(out), dtype=np.int64)])
    for _ in range(5):
        o = rng.integers(all_a + 1, cap + 1)  # outputs in (age, cap]
        for t in range(cap):
            alive = all_a + t < o
            held = np.bincount(all_rep[alive], weights=(all_s + all_a + t)[alive],
                               minlength=replicas)
            alone = np.bincount(all_rep[alive], minlength=replicas) <= 1  # runs alone: no preemption
            assert np.all((held <= budget) | alone | ~ok), (t, held, budget)


def test_the_cap_without_a_budget_changes_no_decision():
    # outputs all below the cap and no budget: the same run, decision for decision
    w = _fit_workload(7, n=300, cap=300)
    plain = simulate(w, BR0Policy(), SimConfig(num_replicas=3, slots=8))
    capped = simulate(w, BR0Policy(), SimConfig(num_replicas=3, slots=8, output_cap=300))
    assert plain.replica.tolist() == capped.replica.tolist()
    assert plain.start_step.tolist() == capped.start_step.tolist()
    assert plain.metrics == capped.metrics
