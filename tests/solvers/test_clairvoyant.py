"""The clairvoyant multi-step models: hand optimum, cross-solver agreement, an independent
enumeration, the simulator bridge, and optimum ≤ every policy."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from balanceroute.core.policies import policy_names
from balanceroute.solvers import ClairvoyantInstance, get_solver
from balanceroute.solvers.bounds import clairvoyant_lp_bound, clairvoyant_trivial_bound
from balanceroute.solvers.bridge import simulate_schedule
from balanceroute.solvers.clairvoyant_eval import evaluate_schedule, fine_loads
from balanceroute.solvers.factories import tiny_clairvoyant_instance

EXACT = ("clairvoyant-cpsat", "clairvoyant-cbc", "clairvoyant-highs")


def _enumerate(inst: ClairvoyantInstance) -> float:
    """Best objective over every (replica, start) choice, checked at decode-step resolution —
    independent of the models' formulation."""
    horizon = inst.model_horizon
    n, best = inst.num_requests, np.inf
    choices = [[(g, t) for g in range(inst.num_replicas)
                for t in range(int(inst.release[i]), horizon - int(inst.output_len[i]) + 1)]
               for i in range(n)]
    for combo in itertools.product(*choices):
        rep = np.array([c[0] for c in combo])
        start = np.array([c[1] for c in combo])
        try:
            _, active = fine_loads(inst, rep, start)
        except ValueError:
            continue
        if inst.work_conserving:
            running = active.sum(axis=0)
            full = inst.num_replicas * inst.slots
            waiting = [(inst.release <= k) & (start > k) for k in range(active.shape[1])]
            if any(w.any() and running[k] < full for k, w in enumerate(waiting)):
                continue
        best = min(best, evaluate_schedule(inst, rep, start)["objective"])
    return float(best)


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


def test_coarsened_schedule_is_feasible_and_model_objective_below_exact() -> None:
    rng = np.random.default_rng(21)
    for q in (2, 3):
        inst = tiny_clairvoyant_instance(rng, num_requests=5, max_output=6, step=q)
        sol = get_solver("clairvoyant-cpsat").solve(inst, time_limit_s=20)
        assert np.all(sol.start % q == 0) and np.all(sol.start >= inst.release)
        exact = evaluate_schedule(inst, sol.replica, sol.start)["objective"]  # raises if infeasible
        assert sol.objective == exact
        assert sol.info["model_objective"] <= exact + 1e-9  # max of block sums ≤ sum of maxes
        assert np.isnan(sol.bound) and "coarsened" in sol.message


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
    rng = np.random.default_rng(2)
    inst = dataclasses.replace(
        tiny_clairvoyant_instance(rng, num_requests=14, num_replicas=3, slots=2, max_output=8,
                                  max_release=0, max_prompt=500), step=1)
    sol = get_solver("clairvoyant-cpsat").solve(inst, time_limit_s=0.5)
    assert sol.status in ("optimal", "feasible")
    assert sol.has_solution and np.isfinite(sol.objective)
    if sol.status == "feasible":
        assert "time limit" in sol.message and sol.bound <= sol.objective
