"""The closed-form predictions on known values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from balanceroute.analysis import theory


@pytest.mark.parametrize(
    ("n", "expected"),
    [(1, 0.0), (2, 1 / math.sqrt(math.pi)), (3, 3 / (2 * math.sqrt(math.pi))),
     (4, 1.0293753730), (5, 1.1629644736), (10, 1.5387527308), (100, 2.5075936364)],
)
def test_expected_max_normal_known_values(n, expected):
    assert theory.expected_max_normal(n) == pytest.approx(expected, abs=1e-7)


def test_expected_max_normal_matches_monte_carlo():
    rng = np.random.default_rng(0)
    sample = rng.standard_normal((200_000, 16)).max(axis=1).mean()
    assert theory.expected_max_normal(16) == pytest.approx(sample, abs=0.01)


def test_gumbel_and_first_order_forms():
    n = np.array([1_000, 10**6])
    exact = np.array([theory.expected_max_normal(int(k)) for k in n])
    assert np.allclose(theory.expected_max_normal_gumbel(n), exact, rtol=0.02)
    assert np.allclose(theory.expected_max_normal_asymptotic(n), np.sqrt(2 * np.log(n)))
    # √(2 ln n) overestimates, with a relative error that shrinks slowly
    err = theory.expected_max_normal_asymptotic(n) / exact - 1
    assert np.all(err > 0) and err[1] < err[0]


def test_independent_imbalance_is_g_sigma_e_g():
    assert theory.independent_imbalance(8, 100.0) == pytest.approx(800 * theory.expected_max_normal(8))
    rng = np.random.default_rng(1)
    loads = rng.normal(5_000, 300, size=(100_000, 8))
    measured = (8 * loads.max(axis=1) - loads.sum(axis=1)).mean()
    assert theory.independent_imbalance(8, 300.0) == pytest.approx(measured, rel=0.01)


def test_balls_into_bins_leading_terms():
    n = math.exp(math.e)  # ln ln n = 1
    assert theory.one_choice_max_load(n) == pytest.approx(math.e)
    assert theory.two_choice_max_load(n) == pytest.approx(1 / math.log(2))
    assert theory.two_choice_max_load(n, d=4) == pytest.approx(0.5 / math.log(2))
    assert theory.one_choice_gap_heavy(4 * 16, 16) == pytest.approx(math.sqrt(8 * math.log(16)))
    with pytest.raises(ValueError):
        theory.two_choice_max_load(10, d=1)


def test_balls_into_bins_monte_carlo():
    rng = np.random.default_rng(2)
    assert theory.balls_into_bins_max_load(0, 5, 1, rng) == 0
    assert theory.balls_into_bins_max_load(7, 1, 2, rng) == 7  # one bin takes every ball
    one = np.mean([theory.balls_into_bins_max_load(1024, 1024, 1, rng) for _ in range(5)])
    two = np.mean([theory.balls_into_bins_max_load(1024, 1024, 2, rng) for _ in range(5)])
    assert two < one
    assert 2 <= two <= 4  # ln ln 1024 / ln 2 = 2.8


def test_online_bound_and_step_gain():
    assert theory.online_temporary_tasks_bound(1) == pytest.approx(1.0)
    assert theory.online_temporary_tasks_bound(2) == pytest.approx(1.5)
    assert np.allclose(theory.online_temporary_tasks_bound(np.array([4, 8])), [1.75, 1.875])
    # the gain depends on a/b only, vanishes without a load term, is M ratio − 1 without b
    g = theory.step_time_gain(120.0, 100.0, a=2.0, b=50.0)
    assert g == pytest.approx(theory.step_time_gain(120.0, 100.0, a=20.0, b=500.0))
    assert theory.step_time_gain(120.0, 100.0, a=0.0, b=1.0) == pytest.approx(0.0)
    assert theory.step_time_gain(120.0, 100.0, a=1.0, b=0.0) == pytest.approx(0.2)
    assert theory.step_time_gain(120.0, 100.0, a=0.0, b=1.0, tokens_ratio=1.1) == pytest.approx(0.1)
