"""The suite's Hypothesis profile (tests/conftest.py): ``make test`` draws the same examples on
every run, so CI cannot turn red by chance; ``--hypothesis-profile explore`` draws fresh ones."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def _draws() -> list[tuple[int, ...]]:
    seen: list[tuple[int, ...]] = []

    @settings(max_examples=30)  # a test's own settings keep the profile's derandomize
    @given(st.lists(st.integers(0, 10**9), min_size=1, max_size=5))
    def prop(xs: list[int]) -> None:
        seen.append(tuple(xs))

    prop()
    return seen


def test_property_tests_draw_the_same_examples_on_every_run(request: pytest.FixtureRequest) -> None:
    if request.config.getoption("hypothesis_profile") == "explore":
        pytest.skip("the explore profile draws fresh examples by design")
    assert settings().derandomize
    assert settings().database is None  # no example database: nothing carried between runs
    first, second = _draws(), _draws()
    assert len(first) >= 20
    assert first == second


def test_no_property_test_depends_on_wall_clock_speed() -> None:
    """Hypothesis's default 200 ms per-example deadline fails a correct test on a busy machine
    (or on the first call, which compiles): both profiles turn it off."""
    assert settings().deadline is None
    for name in ("fixed", "explore"):
        assert settings.get_profile(name).deadline is None
