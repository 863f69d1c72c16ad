"""The barrier model: the worked example of DESIGN §1 and the score identities."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from balanceroute.core.model import (
    discounts,
    envelope,
    f_score,
    horizon_f_score,
    imbalance,
    margins,
)


def test_worked_example_of_design():
    # loads 10, 7, 6, 5: M = 10, I = 4*10 - 28 = 12
    loads = np.array([10, 7, 6, 5])
    assert envelope(loads) == 10
    assert imbalance(loads) == 12
    assert margins(loads).tolist() == [0, 3, 4, 5]
    # +4 on the replica at 6 fills its margin exactly: 4*10 - 32 = 8
    assert imbalance(loads + [0, 0, 4, 0]) == 8
    # +5 makes it the envelope: 4*11 - 33 = 11
    assert imbalance(loads + [0, 0, 5, 0]) == 11
    # F is minus the change of I: +4 → F = 4, +5 → F = 5 - 4*(5 - 4) = 1
    assert f_score(4, 4, 4) == 12 - 8
    assert f_score(5, 4, 4) == 12 - 11


@given(
    st.lists(st.integers(0, 10_000), min_size=1, max_size=12),
    st.integers(0, 5_000),
    st.data(),
)
def test_f_score_is_minus_delta_imbalance(loads, delta, data):
    loads = np.array(loads)
    g = data.draw(st.integers(0, len(loads) - 1))
    after = loads.copy()
    after[g] += delta
    assert imbalance(loads) >= 0
    assert f_score(delta, margins(loads)[g], len(loads)) == imbalance(loads) - imbalance(after)


@given(
    st.lists(st.integers(0, 10_000), min_size=1, max_size=8),
    st.lists(st.integers(0, 20_000), min_size=1, max_size=6),
)
def test_horizon_score_with_h0_equals_br0(loads, deltas):
    loads = np.array(loads, dtype=float)
    m = margins(loads)
    g_count = len(loads)
    deltas = np.array(deltas, dtype=float)
    for g in range(g_count):
        h0 = horizon_f_score(deltas, m[g : g + 1], discounts(0, 0.9), 1.0, g_count)
        np.testing.assert_array_equal(h0, f_score(deltas, m[g], g_count))


def test_horizon_score_by_hand():
    # d = (1, 0.5, 0.25), α = 2, β = 3, margins (4, 2, 0), Δ = 3:
    # α·Σd·Δ = 2 * 1.75 * 3 = 10.5; overflow (0, 1, 3)·d = 0.5 + 0.75 = 1.25; F = 10.5 - 3.75
    d = discounts(2, 0.5)
    assert d.tolist() == [1.0, 0.5, 0.25]
    assert horizon_f_score(3.0, np.array([4.0, 2.0, 0.0]), d, 2.0, 3.0) == pytest.approx(6.75)


def test_discounts_reject_bad_input():
    with pytest.raises(ValueError, match="gamma"):
        discounts(3, 0.0)
    with pytest.raises(ValueError, match="horizon"):
        discounts(-1, 0.5)
