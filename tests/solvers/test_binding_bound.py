"""The partial-binding bound (K largest requests bound for life, the rest a fluid fill): valid
against brute force on random tiny instances, exact when every request is bound, and its value
at a schedule caps what it proves."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from balanceroute.solvers import ClairvoyantInstance
from balanceroute.solvers.aggregate_bound import relaxation_at_schedule
from balanceroute.solvers.binding_bound import (
    binding_at_schedule,
    binding_bound,
    bound_requests,
    fill_caps,
)
from balanceroute.solvers.bridge import simulate_schedule
from balanceroute.solvers.clairvoyant_eval import schedule_objective
from balanceroute.solvers.migration import (
    migration_bound_dp,
    partial_binding_at_schedule,
    partial_binding_dp,
)
from tests.solvers.brute import enumerate_clairvoyant
from tests.solvers.extras import needs

pytestmark = needs("ortools")

PROPERTY = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def episodes(draw, max_requests: int = 3) -> ClairvoyantInstance:
    """Tiny imbalance episodes: G = 1..2, B = 1..3, releases at 0 or spread, work conservation
    on or off."""
    n = draw(st.integers(1, max_requests))
    spread = draw(st.booleans())
    return ClairvoyantInstance(
        num_replicas=draw(st.integers(1, 2)), slots=draw(st.integers(1, 3)),
        prompt_len=draw(st.lists(st.integers(1, 40), min_size=n, max_size=n)),
        output_len=draw(st.lists(st.integers(1, 3), min_size=n, max_size=n)),
        release=sorted(draw(st.lists(st.integers(0, 2 if spread else 0), min_size=n,
                                     max_size=n))),
        work_conserving=draw(st.booleans()),
    )


@PROPERTY
@given(episodes(), st.integers(0, 3))
def test_binding_bound_is_valid(inst: ClairvoyantInstance, k: int) -> None:
    best = enumerate_clairvoyant(inst)
    res = binding_bound(inst, k=k, time_limit_s=30)
    assert res.status == "OPTIMAL"
    assert res.bound <= best * (1 + 1e-9) + 1e-9, (k, inst.to_json())


@PROPERTY
@given(episodes())
def test_binding_every_request_without_work_conservation_is_exact(inst) -> None:
    # 𝒦 = every request: no fluid (u ≡ 0), e_g(k) = M(k) − L_g(k), so the model is the
    # clairvoyant problem itself once work conservation (kept only as start windows) is off.
    inst = dataclasses.replace(inst, work_conserving=False)
    res = binding_bound(inst, k=inst.num_requests, time_limit_s=30)
    assert res.status == "OPTIMAL"
    assert res.bound == pytest.approx(enumerate_clairvoyant(inst), abs=1e-9)


@PROPERTY
@given(episodes(max_requests=5), st.integers(0, 5))
def test_value_at_a_schedule_caps_the_bound(inst: ClairvoyantInstance, k: int) -> None:
    # A policy's schedule is feasible for the model: its value there is ≥ the model's optimum
    # (CP-SAT's bound) and ≤ the schedule's own Σ I.
    run = simulate_schedule(inst, "br0")
    top = binding_at_schedule(inst, run.replica, run.start, k)
    assert top <= run.metrics["objective"] + 1e-9
    res = binding_bound(inst, k=k, time_limit_s=30, hint=(run.replica, run.start))
    assert res.bound <= top + 1e-9


def test_hand_values() -> None:
    # G = 2, B = 1, prompts 10 and 4, one step each, both at step 0 (work conservation: both
    # start at 0, one per replica): I = 2·10 − 14 = 6. With 𝒦 = {10}: the fluid 4 fills the
    # empty replica's gap of 10 at most u(0) = 4 → bound 6 (exact). With 𝒦 = ∅: nothing bound,
    # bound 0.
    inst = ClairvoyantInstance(num_replicas=2, slots=1, prompt_len=[10, 4], output_len=[1, 1])
    assert enumerate_clairvoyant(inst) == 6.0
    assert bound_requests(inst, 1) == [0] and fill_caps(inst, [0]) == [4, 0]
    assert binding_bound(inst, k=1).bound == 6.0
    assert binding_bound(inst, k=0).bound == 0.0
    # G = 2, B = 2, prompts 9, 8, 7, 6, one step: 𝒦 = {9, 8}. Apart: gap 1 on the 8's replica,
    # filled. Together: gap 17 on the empty replica, fill u(0) = 7 + 6 = 13 → 4. Bound 0 (apart),
    # and the optimum is {9, 6} | {8, 7}: I = 2·15 − 30 = 0.
    inst = ClairvoyantInstance(num_replicas=2, slots=2, prompt_len=[9, 8, 7, 6],
                               output_len=[1, 1, 1, 1])
    assert binding_bound(inst, k=2).bound == 0.0 == enumerate_clairvoyant(inst)
    with pytest.raises(ValueError, match="imbalance"):
        binding_bound(dataclasses.replace(inst, objective="step_time"))


@PROPERTY
@given(episodes(max_requests=4), st.integers(0, 4))
def test_partial_binding_dp_sits_between_migration_and_the_optimum(inst, k) -> None:
    # Binding more of the largest requests only removes schedules from the relaxation:
    # migration (k = 0) ≤ partial binding (k) ≤ partial binding (k + 1) ≤ the optimum, and
    # binding every request is the clairvoyant problem itself.
    values = [partial_binding_dp(inst, j) for j in (0, k, k + 1, inst.num_requests)]
    assert values[0] == migration_bound_dp(inst)
    for low, high in zip(values, values[1:]):
        assert low <= high + 1e-9, (k, inst.to_json())
    assert values[-1] == pytest.approx(enumerate_clairvoyant(inst), abs=1e-9), inst.to_json()


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(episodes(max_requests=3), st.integers(0, 3))
def test_partial_binding_dp_with_the_step_time_objective(inst, k) -> None:
    # Σ_busy (b + a·M(k)): the same nesting, exact with every request bound.
    inst = dataclasses.replace(inst, objective="step_time", step_b=0.03, step_a=0.01)
    low, mid, full = (partial_binding_dp(inst, j) for j in (0, k, inst.num_requests))
    assert low <= mid + 1e-9 and mid <= full + 1e-9
    assert full == pytest.approx(enumerate_clairvoyant(inst), rel=1e-9), inst.to_json()


@PROPERTY
@given(episodes(max_requests=4), st.integers(0, 4))
def test_partial_binding_at_a_schedule_caps_the_dp(inst, k) -> None:
    # A policy's schedule is a schedule of the relaxation: its value there is at least the
    # relaxation's optimum (the DP) and at most the schedule's own objective; nothing bound is
    # the migration relaxation's value at the same starts, everything bound the objective.
    run = simulate_schedule(inst, "br0")
    n = inst.num_requests
    values = [partial_binding_at_schedule(inst, run.replica, run.start, j)
              for j in (0, k, k + 1, n)]
    assert values[0] == relaxation_at_schedule(inst, run.start, "migration")
    for low, high in zip(values, values[1:]):
        assert low <= high + 1e-9, (k, inst.to_json())
    assert values[-1] == pytest.approx(schedule_objective(inst, run.replica, run.start), abs=1e-9)
    assert partial_binding_dp(inst, k) <= values[1] + 1e-9, (k, inst.to_json())


def test_partial_binding_at_a_schedule_by_hand() -> None:
    # G = 2, B = 2, prompts 9, 8, 7, 6, one step, {9, 8} on replica 0 and {7, 6} on replica 1:
    # I = 2·17 − 30 = 4. Binding {9, 8} (k = 2) keeps that pair together: the best completion
    # puts 7 and 6 on the other replica, 4 again; binding only 9 (k = 1) lets 8 move: {9, 6} |
    # {8, 7}, I = 0.
    inst = ClairvoyantInstance(num_replicas=2, slots=2, prompt_len=[9, 8, 7, 6],
                               output_len=[1, 1, 1, 1])
    rep, start = [0, 0, 1, 1], [0, 0, 0, 0]
    assert [partial_binding_at_schedule(inst, rep, start, k) for k in (1, 2, 4)] == [0.0, 4.0, 4.0]
    with pytest.raises(ValueError, match="slots"):
        partial_binding_at_schedule(inst, [0, 0, 0, 1], start, 1)
    with pytest.raises(ValueError, match="not work-conserving: a request waits at step 0"):
        partial_binding_at_schedule(inst, rep, [0, 0, 0, 1], 1)


def test_the_method_names_its_bound_set():
    from balanceroute.solvers.binding_bound import BindingBound

    b = BindingBound(bound=1.0, relaxation=2.0, status="OPTIMAL", wall_s=0.0, bound_requests=(3, 1, 2))
    assert b.method == "partial binding (3 largest bound for life, fluid rest; CP-SAT)"
