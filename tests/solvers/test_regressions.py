"""Regression tests for the defects D1–D5 of issue 13, each from its counterexample."""

from __future__ import annotations

import numpy as np
import pytest

from balanceroute.solvers import ClairvoyantInstance, TickInstance, get_solver
from balanceroute.solvers.bounds import tick_lp_bound, tick_trivial_bound
from tests.solvers.extras import needs

pytestmark = needs("ortools", "pulp")



def test_d1_highs_optimum_does_not_depend_on_earlier_thread_counts() -> None:
    # HiGHS sizes one process-wide thread pool at its first solve; a later solve with another
    # `threads` used to fail at once and be reported as "time limit reached, no solution".
    pytest.importorskip("highspy", reason="HiGHS (highspy) is not installed")
    inst = TickInstance.br0([1, 2], [1, 1], [1, 1], objective="imbalance")
    solver = get_solver("tick-highs")
    for threads in (1, 2, 1, 2):
        sol = solver.solve(inst, threads=threads, time_limit_s=30)
        assert sol.status == "optimal" and sol.objective == 1.0, threads  # loads 2, 3 → I = 1
    tick_lp_bound(inst)  # a cvxpy HiGHS solve in between
    assert solver.solve(inst, threads=2, time_limit_s=30).objective == 1.0
    clair = ClairvoyantInstance(num_replicas=2, slots=1, prompt_len=[5, 1], output_len=[2, 2])
    assert get_solver("clairvoyant-highs").solve(clair, threads=2, time_limit_s=30).objective == 8.0


def test_d2_f_score_bound_holds_when_beta_below_alpha() -> None:
    # F = 0.5·Δ keeps rising past every margin: the optimum puts 29 on one replica and 1 on the
    # other (work conservation): 14.5 + 0.5 = 15. The old bound (F at the margins only) was 0.5.
    inst = TickInstance.br0([23, 24], [1, 1], [1, 29], alpha=0.5, beta=0)
    assert get_solver("tick-brute").solve(inst).objective == 15.0
    assert tick_trivial_bound(inst) >= 15.0
    assert tick_trivial_bound(inst) == 29.0  # each replica alone takes the 29


def test_d3_imbalance_bound_with_fractional_loads() -> None:
    # Loads 0.3, 0.3 + one request each → 1.3, 1.3: I* = 0. Rounding the envelope up to an
    # integer claimed I ≥ 1.4.
    inst = TickInstance.br0([0.3, 0.3], [1, 1], [1, 1], objective="imbalance")
    assert get_solver("tick-brute").solve(inst).objective == 0.0
    assert tick_trivial_bound(inst) <= 0.0
    # Integer loads keep the integral rounding: loads 1, 2 + two 1s → 2, 3: I* = 1 = the bound.
    assert tick_trivial_bound(TickInstance.br0([1, 2], [1, 1], [1, 1], objective="imbalance")) == 1.0


def test_d5_cpsat_says_when_its_integer_scaling_was_inexact() -> None:
    # γ = 0.9, H = 7: γ^7 = 0.4782969 needs seven decimals, past the 10⁶ scale.
    g, h = 2, 7
    proj = np.array([[10.0] * (h + 1), [4.0] * (h + 1)])
    inst = TickInstance(proj_loads=proj, free_slots=[1, 1], prompt_len=[3, 5],
                        d=0.9 ** np.arange(h + 1), beta=float(g))
    sol = get_solver("tick-cpsat").solve(inst, time_limit_s=30)
    assert not sol.info["exact_scaling"]
    assert sol.status == "feasible" and np.isnan(sol.bound) and "inexact" in sol.message
    assert sol.objective == pytest.approx(get_solver("tick-brute").solve(inst).objective)
    exact = TickInstance(proj_loads=proj[:, :7], free_slots=[1, 1], prompt_len=[3, 5],
                         d=0.9 ** np.arange(7), beta=float(g))
    assert get_solver("tick-cpsat").solve(exact, time_limit_s=30).status == "optimal"
    # The clairvoyant step_time weights: b/a not a short decimal.
    clair = ClairvoyantInstance(num_replicas=2, slots=1, prompt_len=[5, 1], output_len=[2, 2],
                                objective="step_time", step_b=1.0, step_a=0.1234567891)
    sol = get_solver("clairvoyant-cpsat").solve(clair, time_limit_s=30)
    assert sol.status == "feasible" and "inexact" in sol.message and not sol.info["exact_scaling"]
