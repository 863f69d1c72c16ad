"""Deterministic budgets: the same gap command gives the same numbers on a busy or a quiet
machine (solver work limits, not the wall clock), and CBC runs through PuLP's non-deprecated
``COIN_CMD``."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest

from balanceroute.solvers import ClairvoyantInstance, TickInstance, get_solver
from balanceroute.solvers.factories import random_clairvoyant_instance, random_tick_instance
from balanceroute.solvers.gap import (
    CPSAT_DETERMINISTIC_PER_SECOND,
    WALL_CAP_FACTOR,
    clairvoyant_gap_rows,
    deterministic_budget,
    tick_gap_rows,
)
from tests.solvers.extras import needs

pytestmark = needs("ortools", "pulp")


def test_budget_knobs_per_backend() -> None:
    params, cap = deterministic_budget("clairvoyant-cpsat", 2.0, 1)
    assert params == {"max_deterministic_time": f"{2 * CPSAT_DETERMINISTIC_PER_SECOND:g}"}
    assert cap == WALL_CAP_FACTOR * 2.0
    assert deterministic_budget("tick-cpsat", 1.0, 2)[0]["interleave_search"] == "true"
    assert deterministic_budget("clairvoyant-highs", 1.5, 1)[0] == {"mip_max_nodes": "300"}
    assert deterministic_budget("tick-cbc", 1.0, 1)[0] == {"maxNodes": "200"}
    assert deterministic_budget("tick-brute", 1.0, 1)[0] == {}
    # The user's own parameters win.
    mine = deterministic_budget("tick-cpsat", 1.0, 1, {"max_deterministic_time": "7"})[0]
    assert mine == {"max_deterministic_time": "7"}
    with pytest.raises(ValueError, match="budget_s"):
        deterministic_budget("tick-cpsat", 0.0, 1)


def _busy_loop() -> subprocess.Popen:
    """A CPU-bound child process (stopped by its handle)."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _numbers(rows: list[dict]) -> list[tuple]:
    keys = ("optimum", "bound", "bound_method", "heuristic", "solver_objective")
    return [tuple(r[k] for k in keys if k in r) for r in rows]


@pytest.fixture
def generous_cap(monkeypatch):
    """A wall-clock cap that never binds on a loaded CI box (the test is about the budget)."""
    import balanceroute.solvers.gap as gap

    monkeypatch.setattr(gap, "WALL_CAP_FACTOR", 1000.0)


def test_clairvoyant_gap_is_the_same_under_load(generous_cap) -> None:
    # 10 requests, G = 2, B = 2: CP-SAT does not prove the optimum within its 0.4 s budget (0.2
    # deterministic seconds), so the schedule search (CP-SAT incumbent + local search) is what
    # the budget cuts.
    rng = np.random.default_rng(3)
    inst = random_clairvoyant_instance(rng, num_requests=10, num_replicas=2, slots=2,
                                       max_prompt=60, max_output=8, max_release=0)

    def run(budget_s: float) -> list[dict]:
        return clairvoyant_gap_rows([inst], policies=["br0", "round_robin"],
                                    time_limit_s=budget_s, relaxation="none", polish_iters=40)

    quiet = run(0.6)
    # The premise: the budget, not a proof, stopped the solver, and the numbers depend on how
    # much work it did (half the budget finds a worse schedule), so a wall-clock budget would
    # give other numbers on a slower (loaded) machine.
    assert all(r["status"] == "feasible" for r in quiet)
    assert _numbers(run(0.3)) != _numbers(quiet)
    hog = _busy_loop()
    try:
        busy = run(0.6)
    finally:
        hog.kill()
        hog.wait()
    assert not any(r["wall_capped"] for r in quiet + busy)
    assert _numbers(quiet) == _numbers(busy)


def _tick_numbers(rows: list[dict]) -> list[tuple]:
    return [(r["status"], r["optimum"], r["bound"], r["heuristic"]) for r in rows]


def test_tick_gap_is_the_same_under_load(generous_cap) -> None:
    # G = 8, a pool of 32, the imbalance objective: CP-SAT proves none of these three ticks
    # within its 0.1 s budget (0.05 deterministic seconds), so every tick's numbers are what the
    # budget cut (small ticks solve to optimal in milliseconds, whatever the clock).
    rng = np.random.default_rng(5)
    ticks = [random_tick_instance(rng, num_replicas=8, pool_size=32, max_free=4,
                                  objective="imbalance") for _ in range(3)]

    def run(budget_s: float) -> list[dict]:
        return tick_gap_rows(ticks, time_limit_s=budget_s, lp_bound=False)

    quiet = run(0.1)
    # The premise, per tick: the budget stopped the search with the gap still open (not a
    # proof, and not inexact scaling, which leaves no bound), and the tick's numbers depend on
    # how much work was done (half the budget gives others), so a wall-clock budget would
    # give other numbers on a slower (loaded) machine.
    assert all(r["status"] == "feasible" and r["bound"] < r["optimum"] for r in quiet)
    # … and the row says so: the deterministic budget, not the wall-clock cap, stopped it
    assert all(r["message"].startswith("deterministic budget 0.05 s reached (wall-clock cap")
               for r in quiet), quiet[0]["message"]
    half = run(0.05)
    assert all(a != b for a, b in zip(_tick_numbers(half), _tick_numbers(quiet), strict=True))
    hog = _busy_loop()
    try:
        busy = run(0.1)
    finally:
        hog.kill()
        hog.wait()
    assert not any(r["wall_capped"] for r in quiet + busy)
    assert _tick_numbers(quiet) == _tick_numbers(busy)


def test_cbc_runs_without_the_pulp_4_deprecation() -> None:
    tick = TickInstance.br0([1, 2], [1, 1], [1, 1], objective="imbalance")
    clair = ClairvoyantInstance(num_replicas=2, slots=1, prompt_len=[5, 1], output_len=[2, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert get_solver("tick-cbc").solve(tick, time_limit_s=30).objective == 1.0
        sol = get_solver("clairvoyant-cbc").solve(clair, time_limit_s=30,
                                                   params={"maxNodes": "50"})
    assert sol.status == "optimal" and sol.objective == 8.0


def test_stop_message_names_what_stopped_the_solver() -> None:
    from types import SimpleNamespace

    from balanceroute.solvers.cpsat_backend import stop_message

    def solver(budget: float, spent: float) -> SimpleNamespace:
        return SimpleNamespace(parameters=SimpleNamespace(max_deterministic_time=budget),
                               response_proto=SimpleNamespace(deterministic_time=spent))

    assert stop_message(solver(float("inf"), 3.0), 5.0, found=True) == "time limit 5 s reached"
    assert (stop_message(solver(2.0, 2.0), 40.0, found=False)
            == "deterministic budget 2 s reached (wall-clock cap 40 s) without a solution")
    # the budget was set but not spent: the wall-clock cap stopped it
    assert stop_message(solver(2.0, 0.5), 40.0, found=True) == "time limit 40 s reached"
