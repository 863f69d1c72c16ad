"""Property: every bound is valid against brute force on random tiny instances — both
objectives, horizons H > 0 with discounts, fractional loads and α > β for ticks; releases, work
conservation on and off and both objectives for clairvoyant episodes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from balanceroute.solvers import ClairvoyantInstance, TickInstance, get_solver
from balanceroute.solvers.aggregate_bound import (
    RELAXATIONS,
    aggregate_bound,
    relaxation_at_schedule,
)
from balanceroute.solvers.bounds import (
    clairvoyant_lp_bound,
    clairvoyant_trivial_bound,
    tick_lp_bound,
    tick_trivial_bound,
)
from balanceroute.solvers.bridge import simulate_schedule
from balanceroute.solvers.migration import _TooLarge, migration_bound_dp, partition_envelope
from tests.solvers.brute import enumerate_clairvoyant
from tests.solvers.extras import needs

pytestmark = needs("ortools", "cvxpy")


PROPERTY = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def tick_instances(draw) -> TickInstance:
    g = draw(st.integers(2, 3))
    p = draw(st.integers(1, 5))
    h = draw(st.integers(0, 2))
    tenths = draw(st.booleans())  # fractional loads (multiples of 0.1) or integers
    loads = np.array(draw(st.lists(st.integers(0, 400 if tenths else 40), min_size=g * (h + 1),
                                   max_size=g * (h + 1))), dtype=float).reshape(g, h + 1)
    if tenths:
        loads /= 10
    free = draw(st.lists(st.integers(0, 2), min_size=g, max_size=g))
    free[0] = max(free[0], 1)
    return TickInstance(
        proj_loads=loads, free_slots=free,
        prompt_len=draw(st.lists(st.integers(1, 20), min_size=p, max_size=p)),
        d=draw(st.sampled_from([0.5, 1.0])) ** np.arange(h + 1),
        alpha=draw(st.sampled_from([0.5, 1.0, 2.0])),
        beta=draw(st.sampled_from([0.0, 0.5, 1.0, float(g), 2.0 * g])),
        objective=draw(st.sampled_from(["f_score", "imbalance"])),
        work_conserving=draw(st.booleans()),
    )


@PROPERTY
@given(tick_instances())
def test_tick_bounds_are_valid(inst: TickInstance) -> None:
    best = get_solver("tick-brute").solve(inst).objective
    for bound in (tick_lp_bound(inst), tick_trivial_bound(inst)):
        if inst.sense == "max":
            assert bound >= best - 1e-6, inst.to_json()
        else:
            assert bound <= best + 1e-6, inst.to_json()


@st.composite
def clairvoyant_instances(draw) -> ClairvoyantInstance:
    n = draw(st.integers(1, 3))
    return ClairvoyantInstance(
        num_replicas=draw(st.integers(1, 2)), slots=draw(st.integers(1, 2)),
        prompt_len=draw(st.lists(st.integers(1, 30), min_size=n, max_size=n)),
        output_len=draw(st.lists(st.integers(1, 3), min_size=n, max_size=n)),
        release=sorted(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))),
        objective=draw(st.sampled_from(["imbalance", "step_time"])),
        work_conserving=draw(st.booleans()),
        step_b=0.03, step_a=draw(st.sampled_from([2e-7, 0.01])),
    )


@st.composite
def crowded_instances(draw, max_requests: int = 3) -> ClairvoyantInstance:
    """More requests than replicas (G = 1 or 2), so the pigeonhole cuts bind; releases 0 or
    spread, work conservation on or off."""
    n = draw(st.integers(2, max_requests))
    g = draw(st.integers(1, 2))
    spread = draw(st.booleans())
    return ClairvoyantInstance(
        num_replicas=g, slots=draw(st.integers(2, 3)),
        prompt_len=draw(st.lists(st.integers(1, 30), min_size=n, max_size=n)),
        output_len=draw(st.lists(st.integers(1, 3), min_size=n, max_size=n)),
        release=sorted(draw(st.lists(st.integers(0, 2 if spread else 0), min_size=n,
                                     max_size=n))),
        objective=draw(st.sampled_from(["imbalance", "step_time"])),
        work_conserving=draw(st.booleans()), step_b=0.03, step_a=0.01,
    )


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(clairvoyant_instances(), crowded_instances()))
def test_clairvoyant_bounds_are_valid(inst: ClairvoyantInstance) -> None:
    best = enumerate_clairvoyant(inst)
    agg, cut, mig = (aggregate_bound(inst, time_limit_s=60, relaxation=r) for r in RELAXATIONS)
    # Tiny: all proven, so the check is on the relaxations themselves; each is the one before
    # plus constraints (pigeonhole cuts, then an exact partition at every step), and the cuts
    # hold for every partition.
    assert agg.status == cut.status == mig.status == "OPTIMAL"
    assert agg.bound - 1e-9 <= cut.bound <= mig.bound + 1e-9
    for bound in (clairvoyant_lp_bound(inst), clairvoyant_trivial_bound(inst), agg.bound,
                  cut.bound, mig.bound):
        assert bound <= best * (1 + 1e-9) + 1e-9, inst.to_json()
    sol = get_solver("clairvoyant-cpsat").solve(inst, time_limit_s=60)
    assert sol.objective == pytest.approx(best, rel=1e-9, abs=1e-9)


def test_migration_relaxation_hand_value() -> None:
    # G = 2, B = 2, four requests of one step, loads 40, 35, 30, 20, all at step 0: the best
    # partition is {40, 20} | {35, 30} → M = 65, I = 130 − 125 = 5 = the optimum (one step, no
    # binding to lose). The aggregated relaxation only knows M ≥ ⌈125/2⌉ = 63: I ≥ 1.
    inst = ClairvoyantInstance(num_replicas=2, slots=2, prompt_len=[40, 35, 30, 20],
                               output_len=[1, 1, 1, 1])
    assert aggregate_bound(inst, relaxation="migration").bound == 5.0
    assert aggregate_bound(inst).bound == 1.0
    assert enumerate_clairvoyant(inst) == 5.0


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(clairvoyant_instances())
def test_migration_dp_is_valid_and_equals_its_cp_sat_model(inst: ClairvoyantInstance) -> None:
    dp = migration_bound_dp(inst)
    assert dp is not None
    assert dp <= enumerate_clairvoyant(inst) * (1 + 1e-9) + 1e-9, inst.to_json()
    cp = aggregate_bound(inst, time_limit_s=60, relaxation="migration")
    assert cp.status == "OPTIMAL"
    assert cp.bound == pytest.approx(max(dp, 0.0), rel=1e-6, abs=1e-9)


def test_partition_envelope_known_values() -> None:
    assert partition_envelope((40, 35, 30, 20), 2, 2) == 65
    assert partition_envelope((10, 1, 1, 1), 2, 3) == 10
    assert partition_envelope((9, 8, 7, 6, 5, 4), 3, 2) == 13  # {9,4} {8,5} {7,6}
    assert partition_envelope((9, 8, 7, 6, 5, 4), 2, 3) == 20  # {9,7,4} {8,6,5} → 20, 19
    assert partition_envelope((), 4, 3) == 0


def test_migration_dp_on_the_hand_instance() -> None:
    inst = ClairvoyantInstance(num_replicas=2, slots=2, prompt_len=[40, 35, 30, 20],
                               output_len=[1, 1, 1, 1])
    assert migration_bound_dp(inst) == 5.0
    assert migration_bound_dp(inst, max_states=0) is None  # gives up instead of running on
    # The work budget: one step partitions 4 loads into 2 parts of 2 — {40, 20} {35, 30}, P* = 65
    # (I = 2·65 − 125 = 5) — which takes more than one branch-and-bound node but fewer than 100.
    assert migration_bound_dp(inst, max_nodes=1) is None
    assert migration_bound_dp(inst, max_nodes=100) == 5.0


def test_migration_dp_gives_up_past_its_longest_horizon() -> None:
    """A horizon of MAX_STEPS + 1 decode steps: the DP's recursion (a level per step) would be
    that deep, so it gives up at once; at MAX_STEPS it answers (one request of loads 3, 4 on
    G = 2: Σ_k (G − 1)·L_k = 7)."""
    from balanceroute.solvers.migration import MAX_STEPS

    def one(horizon: int) -> ClairvoyantInstance:
        return ClairvoyantInstance(num_replicas=2, slots=1, prompt_len=[3], output_len=[2], horizon=horizon)

    assert [one(h).model_horizon for h in (MAX_STEPS + 1, MAX_STEPS)] == [MAX_STEPS + 1, MAX_STEPS]
    assert migration_bound_dp(one(MAX_STEPS + 1)) is None
    assert migration_bound_dp(one(MAX_STEPS)) == 7.0


def test_partition_envelope_spends_its_budget_node_by_node() -> None:
    budget = [10**6]
    assert partition_envelope((9, 8, 7, 6, 5, 4), 2, 3, budget=budget) == 20
    used = 10**6 - budget[0]
    assert used > 6  # at least one node per load placed
    with pytest.raises(_TooLarge):
        partition_envelope((9, 8, 7, 6, 5, 4), 2, 3, budget=[used - 1])
    assert partition_envelope((9, 8, 7, 6, 5, 4), 2, 3, budget=[used]) == 20


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(crowded_instances(max_requests=5))
def test_pigeonhole_relaxation_sits_below_the_migration_dp(inst: ClairvoyantInstance) -> None:
    # Larger than brute force reaches: the migration DP (itself checked against brute force
    # above) is the exact partition at every step, so it dominates every partition cut.
    dp = migration_bound_dp(inst)
    assert dp is not None
    cut = aggregate_bound(inst, time_limit_s=60, relaxation="partition")
    assert cut.status == "OPTIMAL"
    assert cut.bound <= max(dp, 0.0) * (1 + 1e-9) + 1e-9, inst.to_json()


def test_pigeonhole_cuts_hand_values() -> None:
    # (P3) G = 2, B = 2, one step, loads 50, 10, 10, 10: four requests on two replicas of two
    # slots, so the replica of the 50 holds one more (≥ 10): M ≥ 60, I ≥ 2·60 − 80 = 40, the
    # optimum ({50, 10} | {10, 10}). The aggregated relaxation knows only M ≥ 50: I ≥ 20.
    inst = ClairvoyantInstance(num_replicas=2, slots=2, prompt_len=[50, 10, 10, 10],
                               output_len=[1, 1, 1, 1])
    assert aggregate_bound(inst).bound == 20.0
    assert aggregate_bound(inst, relaxation="partition").bound == 40.0
    assert enumerate_clairvoyant(inst) == 40.0
    # (P1, P2) G = 2, B = 3, three prompts of 30: two share a replica, M ≥ 60, I ≥ 120 − 90 = 30
    # (the optimum); the mean bound gives M ≥ 45, I ≥ 0.
    inst = ClairvoyantInstance(num_replicas=2, slots=3, prompt_len=[30, 30, 30],
                               output_len=[1, 1, 1])
    assert aggregate_bound(inst).bound == 0.0
    assert aggregate_bound(inst, relaxation="partition").bound == 30.0
    assert enumerate_clairvoyant(inst) == 30.0


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(crowded_instances(max_requests=4))
def test_relaxation_at_a_schedule_caps_what_it_proves(inst: ClairvoyantInstance) -> None:
    # A policy's schedule is work-conserving, so it is feasible for every relaxed model: each
    # relaxation's optimum is at most its value there, and that value at most the schedule's.
    run = simulate_schedule(inst, "br0")
    tops = [relaxation_at_schedule(inst, run.start, name) for name in RELAXATIONS]
    assert tops == sorted(tops)  # aggregated ≤ pigeonhole ≤ migration, step by step
    assert tops[-1] <= run.metrics["objective"] * (1 + 1e-9) + 1e-9
    for name, top in zip(RELAXATIONS, tops, strict=True):
        solved = aggregate_bound(inst, time_limit_s=60, relaxation=name)
        assert solved.status == "OPTIMAL"
        assert solved.bound <= top * (1 + 1e-6) + 1e-6, (name, inst.to_json())


def test_relaxation_at_schedule_hand_values() -> None:
    # Loads 50, 10, 10, 10 then 51, 11, 11, 11 on G = 2, B = 2 (all start at 0): aggregated
    # M = 50, 51 → I = 20 + 18; the pigeonhole cut (P3) M = 60, 62 → 40 + 40, as the exact
    # partition ({50, 10} | {10, 10}).
    inst = ClairvoyantInstance(num_replicas=2, slots=2, prompt_len=[50, 10, 10, 10],
                               output_len=[2, 2, 2, 2])
    start = np.zeros(4, dtype=int)
    assert [relaxation_at_schedule(inst, start, r) for r in RELAXATIONS] == [38.0, 80.0, 80.0]
    with pytest.raises(ValueError, match="relaxation="):
        relaxation_at_schedule(inst, start, "exact")
    one = ClairvoyantInstance(num_replicas=1, slots=1, prompt_len=[5, 5], output_len=[1, 1],
                              release=[0, 1])
    with pytest.raises(ValueError, match="2 requests run at step 1"):
        relaxation_at_schedule(dataclasses.replace(one, work_conserving=False), np.array([1, 1]))
    with pytest.raises(ValueError, match="before its release"):
        relaxation_at_schedule(one, np.array([0, 0]))
    with pytest.raises(ValueError, match="not work-conserving"):
        relaxation_at_schedule(one, np.array([2, 1]))  # request 0 waits at step 0, slot free
    assert relaxation_at_schedule(one, np.array([0, 1])) == 0.0
