"""CBC = HiGHS = CP-SAT = brute force on random tiny ticks; the heuristic never beats them;
bounds sit on the right side; work conservation is respected."""

from __future__ import annotations

import numpy as np
import pytest

from balanceroute.solvers import get_solver
from balanceroute.solvers.bounds import tick_lp_bound, tick_trivial_bound
from balanceroute.solvers.factories import tiny_tick_instance
from balanceroute.solvers.tick_eval import policy_tick, tick_objective
from tests.solvers.extras import needs

pytestmark = needs("ortools", "pulp", "highspy", "cvxpy")


EXACT = ("tick-cbc", "tick-highs", "tick-cpsat")
N_INSTANCES = 60


def _instances(objective: str):
    rng = np.random.default_rng(7 if objective == "f_score" else 8)
    return [tiny_tick_instance(rng, objective=objective) for _ in range(N_INSTANCES)]


@pytest.mark.parametrize("objective", ["f_score", "imbalance"])
def test_all_exact_solvers_agree_with_brute_force(objective: str) -> None:
    brute = get_solver("tick-brute")
    others = [get_solver(n) for n in EXACT]
    for inst in _instances(objective):
        ref = brute.solve(inst)
        lo, hi = inst.required
        for solver in others:
            sol = solver.solve(inst, time_limit_s=20)
            assert sol.status == "optimal", (solver.name, inst.to_json())
            assert sol.objective == pytest.approx(ref.objective, abs=1e-6), (solver.name, inst.to_json())
            placed = int((sol.replica >= 0).sum())
            assert lo <= placed <= hi
            assert placed == min(int(inst.free_slots.sum()), inst.pool_size)  # work-conserving


@pytest.mark.parametrize("objective", ["f_score", "imbalance"])
def test_heuristic_never_beats_optimum(objective: str) -> None:
    brute = get_solver("tick-brute")
    for inst in _instances(objective):
        best = brute.solve(inst).objective
        for name in ("br0", "least_load", "round_robin"):
            value = tick_objective(inst, policy_tick(inst, name))
            if inst.sense == "max":
                assert value <= best + 1e-9
            else:
                assert value >= best - 1e-9


@pytest.mark.parametrize("objective", ["f_score", "imbalance"])
def test_lp_and_trivial_bounds_are_valid(objective: str) -> None:
    brute = get_solver("tick-brute")
    for inst in _instances(objective)[:25]:
        best = brute.solve(inst).objective
        lp, triv = tick_lp_bound(inst), tick_trivial_bound(inst)
        if inst.sense == "max":
            assert lp >= best - 1e-6 and triv >= best - 1e-6
        else:
            assert lp <= best + 1e-6 and triv <= best + 1e-6


def test_f_sum_lower_bounds_true_imbalance_decrease() -> None:
    # Σ_g F_g uses Σ_g overflows where the true ΔI uses their max: Σ F ≤ I(L) − I(L + Δ) (BR-0).
    rng = np.random.default_rng(3)
    for _ in range(200):
        inst = tiny_tick_instance(rng)
        if inst.proj_loads.shape[1] != 1:
            continue
        rep = rng.integers(-1, inst.num_replicas, inst.pool_size)
        per = np.bincount(rep[rep >= 0], minlength=inst.num_replicas)
        if np.any(per > inst.free_slots):
            continue
        loads = inst.loads
        before = inst.num_replicas * loads.max() - loads.sum()
        after = tick_objective(inst, rep, "imbalance")
        assert tick_objective(inst, rep, "f_score") <= before - after + 1e-9


def test_cpsat_scales_fractional_discounts_exactly() -> None:
    rng = np.random.default_rng(11)
    seen = 0
    for _ in range(40):
        inst = tiny_tick_instance(rng)
        if inst.proj_loads.shape[1] == 1:
            continue
        sol = get_solver("tick-cpsat").solve(inst)
        assert sol.info["exact_scaling"]
        assert sol.objective == pytest.approx(get_solver("tick-brute").solve(inst).objective)
        seen += 1
    assert seen > 3
