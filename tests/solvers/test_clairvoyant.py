"""The clairvoyant multi-step models: hand optimum, cross-solver agreement, an independent
enumeration, the simulator bridge, and optimum ≤ every policy."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from balanceroute.core.policies import policy_names
from balanceroute.solvers import ClairvoyantInstance, get_solver
from balanceroute.solvers.bounds import clairvoyant_lp_bound, clairvoyant_trivial_bound
from balanceroute.solvers.bridge import simulate_schedule
from balanceroute.solvers.clairvoyant_eval import (
    canonical_replicas,
    evaluate_schedule,
    greedy_schedule,
    is_work_conserving,
    model_tables,
)
from balanceroute.solvers.clairvoyant_milp import build_clairvoyant_milp, mip_start
from balanceroute.solvers.factories import tiny_clairvoyant_instance
from balanceroute.solvers.incumbent import improve_schedule, work_conserving_repair
from tests.solvers.brute import enumerate_clairvoyant as _enumerate
from tests.solvers.extras import needs

pytestmark = needs("ortools", "pulp", "highspy", "cvxpy")


EXACT = ("clairvoyant-cpsat", "clairvoyant-cbc", "clairvoyant-highs")


def test_hand_optimum_two_replicas() -> None:
    # G = 2, B = 1, all released at 0. Request a: s = 5, o = 2; request b: s = 1, o = 2.
    # Work conservation starts both at step 0 on different replicas:
    # step 0 loads (5, 1): I = 2·5 − 6 = 4; step 1 loads (6, 2): I = 12 − 8 = 4 → Σ I = 8.
    inst = ClairvoyantInstance(num_replicas=2, slots=1, prompt_len=[5, 1], output_len=[2, 2])
    for name in EXACT:
        sol = get_solver(name).solve(inst, time_limit_s=20)
        assert sol.status == "optimal" and sol.objective == pytest.approx(8.0), name
    # Without work conservation b could wait, but running a then b on one replica gives
    # steps (5,0), (6,0), (1,0), (2,0): I = 5 + 6 + 1 + 2 = 14 > 8, so 8 stays optimal.
    loose = dataclasses.replace(inst, work_conserving=False)
    assert get_solver("clairvoyant-cpsat").solve(loose).objective == pytest.approx(8.0)


def test_hand_optimum_split_by_size() -> None:
    # G = 2, B = 2, s = 4, 3, 1, o = 1: {4} | {3, 1} gives loads (4, 4), I = 0 — the optimum.
    inst = ClairvoyantInstance(num_replicas=2, slots=2, prompt_len=[4, 3, 1], output_len=[1, 1, 1])
    sol = get_solver("clairvoyant-cpsat").solve(inst)
    assert sol.objective == 0.0
    assert sol.replica[1] == sol.replica[2] != sol.replica[0]


@pytest.mark.parametrize("objective", ["imbalance", "step_time"])
def test_solvers_agree_and_match_enumeration(objective: str) -> None:
    rng = np.random.default_rng(5)
    for _ in range(8):
        inst = tiny_clairvoyant_instance(rng, num_requests=int(rng.integers(2, 5)), max_output=3,
                                         max_release=2, objective=objective)
        values = [get_solver(n).solve(inst, time_limit_s=30).objective for n in EXACT]
        assert values == pytest.approx([values[0]] * 3, rel=1e-9, abs=1e-9)
        assert values[0] == pytest.approx(_enumerate(inst), rel=1e-9, abs=1e-9)


def test_simulator_bridge_matches_exact_evaluation() -> None:
    rng = np.random.default_rng(9)
    for k in range(10):
        inst = tiny_clairvoyant_instance(rng, max_release=0 if k % 2 else 3)
        for name in policy_names():
            run = simulate_schedule(inst, name)
            assert run.metrics["imbalance"] == pytest.approx(run.sim_imbalance)


def test_optimum_never_worse_than_any_policy() -> None:
    rng = np.random.default_rng(13)
    solver = get_solver("clairvoyant-cpsat")
    for k in range(12):
        inst = tiny_clairvoyant_instance(rng, max_release=0 if k % 3 == 0 else 3)
        sol = solver.solve(inst, time_limit_s=20)
        assert sol.status == "optimal"
        for name in policy_names():
            run = simulate_schedule(inst, name)
            assert sol.objective <= run.metrics["imbalance"] + 1e-9, (name, inst.to_json())


def test_lower_bounds_below_optimum() -> None:
    rng = np.random.default_rng(17)
    for objective in ("imbalance", "step_time"):
        for _ in range(5):
            inst = tiny_clairvoyant_instance(rng, objective=objective)
            opt = get_solver("clairvoyant-cpsat").solve(inst).objective
            assert clairvoyant_lp_bound(inst) <= opt + 1e-6
            assert clairvoyant_trivial_bound(inst) <= opt + 1e-6


def test_coarsened_schedule_is_work_conserving_per_decode_step() -> None:
    # D4: a coarse model starts requests on block boundaries, which can idle a slot while a
    # request waits; the reported schedule is repaired so that it is work-conserving per step.
    rng = np.random.default_rng(21)
    for q in (2, 3):
        for _ in range(3):
            inst = tiny_clairvoyant_instance(rng, num_requests=5, max_output=6, step=q)
            for name in EXACT:
                sol = get_solver(name).solve(inst, time_limit_s=20)
                assert np.all(sol.start >= inst.release)
                exact = evaluate_schedule(inst, sol.replica, sol.start)["objective"]  # feasible
                assert sol.objective == exact
                assert is_work_conserving(inst, sol.replica, sol.start), (name, inst.to_json())
                assert np.isnan(sol.bound) and "coarsened" in sol.message


def test_repair_of_a_block_schedule_fills_the_idle_slot() -> None:
    # G = 1, B = 2; a (o = 1) and b (o = 3) at step 0, c (o = 2) released at 0 too. With q = 2
    # the coarse model holds a's slot for a whole block (steps 0–1), so c starts at 2 at best;
    # per decode step a's slot is free at step 1 and c must start there.
    inst = ClairvoyantInstance(num_replicas=1, slots=2, prompt_len=[1, 1, 1],
                               output_len=[1, 3, 2], step=2)
    rep, start = work_conserving_repair(inst, np.zeros(3, dtype=np.int64), np.array([0, 0, 2]))
    assert start.tolist() == [0, 0, 1] and rep.tolist() == [0, 0, 0]
    assert not is_work_conserving(inst, np.zeros(3, dtype=np.int64), np.array([0, 0, 2]))
    assert is_work_conserving(inst, rep, start)


def test_repair_keeps_a_policy_schedule_and_local_search_never_worsens() -> None:
    rng = np.random.default_rng(23)
    for _ in range(4):
        inst = tiny_clairvoyant_instance(rng, num_requests=6, max_release=3)
        run = simulate_schedule(inst, "jsq")
        rep, start = work_conserving_repair(inst, run.replica, run.start)
        assert np.array_equal(rep, run.replica) and np.array_equal(start, run.start)
        rep, start, value = improve_schedule(inst, run.replica, run.start, max_iters=60, seed=1)
        assert value <= run.metrics["objective"]
        assert value == evaluate_schedule(inst, rep, start)["objective"]
        assert is_work_conserving(inst, rep, start)


@pytest.mark.parametrize(("name", "limit"), [("clairvoyant-highs", ("mip_max_nodes", "0")),
                                             ("clairvoyant-cbc", ("maxNodes", "0"))])
def test_node_limited_milp_returns_its_mip_start(name: str, limit: tuple[str, str]) -> None:
    # A deterministic node limit of 0: the incumbent can only be the MIP start (or better).
    rng = np.random.default_rng(2)
    inst = tiny_clairvoyant_instance(rng, num_requests=10, num_replicas=3, slots=2,
                                     max_output=6, max_release=0, max_prompt=500)
    start = evaluate_schedule(inst, *greedy_schedule(inst, model_tables(inst)))["objective"]
    sol = get_solver(name).solve(inst, time_limit_s=600, params=dict([limit]))
    assert sol.status == "feasible" and sol.objective <= start
    assert "limit" in sol.message


def test_mip_start_is_a_feasible_point_of_the_milp() -> None:
    import pulp

    rng = np.random.default_rng(29)
    inst = tiny_clairvoyant_instance(rng, num_requests=5, max_release=2)
    prob, z, tab = build_clairvoyant_milp(inst)
    rep, start = canonical_replicas(*greedy_schedule(inst, tab))
    values = mip_start(prob, z, inst, tab, rep, start)
    for var, value in values.items():
        var.varValue = value
    assert prob.valid(eps=1e-9)
    assert pulp.value(prob.objective) * inst.num_replicas - tab.total == pytest.approx(
        evaluate_schedule(inst, rep, start)["imbalance"])


def test_short_horizon_is_reported_as_infeasible() -> None:
    # Two requests of 3 steps on one replica with one slot need 6 steps; horizon 5 passes the
    # per-request check but no schedule exists.
    inst = ClairvoyantInstance(num_replicas=1, slots=1, prompt_len=[1, 1], output_len=[3, 3],
                               horizon=6)
    assert get_solver("clairvoyant-cpsat").solve(inst).status == "optimal"
    with pytest.raises(ValueError, match="infeasible"):
        ClairvoyantInstance(num_replicas=1, slots=1, prompt_len=[1, 1], output_len=[3, 3],
                            horizon=5)
    tight = ClairvoyantInstance(num_replicas=2, slots=1, prompt_len=[1, 1, 1],
                                output_len=[3, 3, 3], release=[0, 0, 2], horizon=5)
    for name in EXACT:
        with pytest.raises(ValueError, match="infeasible"):
            get_solver(name).solve(tight, time_limit_s=10)


def test_time_limit_returns_incumbent_with_bound() -> None:
    # A deterministic work limit (CP-SAT's deterministic time, one worker) instead of a
    # wall-clock one: the same search on any machine. The list-schedule hint guarantees an
    # incumbent, and 0.2 deterministic seconds are far too few to prove this 14-request optimum.
    rng = np.random.default_rng(2)
    inst = dataclasses.replace(
        tiny_clairvoyant_instance(rng, num_requests=14, num_replicas=3, slots=2, max_output=8,
                                  max_release=0, max_prompt=500), step=1)
    sol = get_solver("clairvoyant-cpsat").solve(
        inst, time_limit_s=600, params={"max_deterministic_time": "0.2"})
    assert sol.status == "feasible" and np.isfinite(sol.objective)
    assert sol.message.startswith("deterministic budget 0.2 s reached") and sol.bound <= sol.objective
