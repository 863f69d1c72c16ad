"""Tiny tick instances whose optimum is computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from balanceroute.core.model import imbalance
from balanceroute.solvers import SOLVERS, TickInstance, get_solver, solver_names
from balanceroute.solvers.tick_eval import f_score_sum, policy_tick, post_tick_imbalance

TICK_SOLVERS = [
    pytest.param(n, marks=pytest.mark.skipif(not SOLVERS[n].is_available(),
                                              reason=f"{n}: the solvers extra is not installed"))
    for n in solver_names("tick")
]


def test_design_worked_example_loads_10_7_6_5() -> None:
    # DESIGN §1: loads 10,7,6,5 → I = 4·10 − 28 = 12. Adding 4 to the replica at 6 → loads
    # 10,7,10,5: I = 40 − 32 = 8. Adding 5 instead → 10,7,11,5: I = 44 − 33 = 11.
    assert imbalance([10, 7, 6, 5]) == 12
    inst = TickInstance.br0([10, 7, 6, 5], [0, 0, 1, 0], [4], objective="imbalance")
    assert post_tick_imbalance(inst, np.array([2])) == 8
    inst5 = TickInstance.br0([10, 7, 6, 5], [0, 0, 1, 0], [5], objective="imbalance")
    assert post_tick_imbalance(inst5, np.array([2])) == 11
    # F = Δ − G·(Δ − m)_+ with m = 4: F(4) = 4 = 12 − 8; F(5) = 5 − 4·1 = 1 = 12 − 11.
    assert f_score_sum(inst, np.array([2])) == 4
    assert f_score_sum(inst5, np.array([2])) == 1


@pytest.mark.parametrize("name", TICK_SOLVERS)
def test_f_score_hand_optimum(name: str) -> None:
    # loads 10,7,6,5 → margins 0,3,4,5; one free slot each; pool s = 4,5,3,2,6; place 4.
    # Filling every margin exactly gives F = Σ m = 3+4+5 = 12 but needs Δ = 3,4,5 on replicas
    # 1..3 and a request on replica 0 (margin 0), which costs −(G−1)·s = −3·s ≤ −6 (s = 2).
    # Best: replica 0 takes s = 2 (F = 2 − 4·2 = −6), replicas 1,2,3 take 3,4,5 (F = 3+4+5):
    # total 12 − 6 = 6. Any other choice loses at least as much (checked by brute force too).
    inst = TickInstance.br0([10, 7, 6, 5], [1, 1, 1, 1], [4, 5, 3, 2, 6])
    sol = get_solver(name).solve(inst, time_limit_s=10)
    assert sol.status == "optimal"
    assert sol.objective == pytest.approx(6.0)
    assert (sol.replica >= 0).sum() == 4
    assert sol.replica[3] == 0  # the 2-token request goes to the envelope replica


@pytest.mark.parametrize("name", TICK_SOLVERS)
def test_imbalance_hand_optimum(name: str) -> None:
    # Same tick, objective post-tick I. Place 4 of {4,5,3,2,6}: totals after placing are
    # 28 + (20 − left-out). Envelope ≥ 10 + smallest on replica 0 = 12 (s = 2) gives G·M = 48;
    # leaving out 3 (Δ = 17) the sum is 45 → I = 3, e.g. loads 12, 7+5, 6+6, 5+4 = 12,12,12,9.
    # M = 11 is impossible (replica 0 must grow by ≥ 2), and with M = 12 the best total is 45
    # (48 would need Δ = 20 with all five placed), so I* = 3.
    inst = TickInstance.br0([10, 7, 6, 5], [1, 1, 1, 1], [4, 5, 3, 2, 6], objective="imbalance")
    sol = get_solver(name).solve(inst, time_limit_s=10)
    assert sol.status == "optimal"
    assert sol.objective == pytest.approx(3.0)


@pytest.mark.parametrize("name", TICK_SOLVERS)
def test_not_work_conserving_can_place_nothing(name: str) -> None:
    # Equal loads 5,5: every placement overflows (margin 0) so F = Δ − 2Δ = −Δ < 0. With work
    # conservation off the optimum places nothing (F = 0); with it on, both requests must go,
    # one per replica: F = −1 − 3 = −4.
    loose = TickInstance.br0([5, 5], [1, 1], [1, 3], work_conserving=False)
    tight = TickInstance.br0([5, 5], [1, 1], [1, 3])
    assert get_solver(name).solve(loose).objective == pytest.approx(0.0)
    assert get_solver(name).solve(tight).objective == pytest.approx(-4.0)  # both must go: −1 −3


def test_heuristic_matches_known_optimum() -> None:
    inst = TickInstance.br0([10, 7, 6, 5], [1, 1, 1, 1], [4, 5, 3, 2, 6])
    assert f_score_sum(inst, policy_tick(inst)) == pytest.approx(6.0)


def test_an_incumbent_meeting_its_bound_counts_as_optimal() -> None:
    pytest.importorskip("pulp", reason="the solvers extra (PuLP) is not installed")
    from balanceroute.solvers.pulp_backend import _gap_closed

    assert _gap_closed(3.0, 3.0, 0.0)
    assert _gap_closed(100.0, 100.5, 0.01)
    assert not _gap_closed(3.0, 2.0, 1e-4)
