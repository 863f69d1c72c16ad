"""The tick's decision check (``validate_assignment``): worked examples, and its two paths — Python
ints for small decisions, numpy for large ones — against each other on generated decisions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.core import state as state_mod
from balanceroute.core.state import Assignment, ClusterState, PoolView, validate_assignment


def _state(free: list[int]) -> ClusterState:
    g = len(free)
    return ClusterState(loads=np.zeros(g, dtype=np.int64), free_slots=np.array(free, dtype=np.int64),
                        num_active=np.zeros(g, dtype=np.int64))


def _pool(n: int) -> PoolView:
    return PoolView(prompt_len=np.ones(n, dtype=np.int64), wait=np.zeros(n), request_ids=np.arange(n))


def _out(index: list[int], replica: list[int]) -> Assignment:
    return Assignment(pool_index=np.array(index, dtype=np.int64), replica=np.array(replica, dtype=np.int64))


@pytest.mark.parametrize("size", [1, 40])  # the small path, and the numpy path past _SMALL
def test_worked_examples(size: int) -> None:
    state, pool = _state([size, size, 0]), _pool(2 * size + 1)
    validate_assignment(state, pool, _out(list(range(2 * size)), [0] * size + [1] * size))
    for index, replica, message in [
        ([2 * size + 1] + list(range(1, size)), [0] * size, "pool position that does not exist"),
        ([0, 0] + list(range(2, size + 1)), [0] * (size + 1), "twice"),
        (list(range(size)), [3] + [0] * (size - 1), "replica that does not exist"),
        (list(range(size)), [2] + [0] * (size - 1), "free slots"),
        (list(range(size + 1)), [0] * (size + 1), "free slots"),
    ]:
        with pytest.raises(ValueError, match=message):
            validate_assignment(state, pool, _out(index, replica))


def _verdict(check, *args) -> str:
    try:
        check(*args)
    except ValueError as exc:
        return str(exc)
    return "ok"


@settings(max_examples=2000, deadline=None)
@given(free=st.lists(st.integers(-1, 3), min_size=1, max_size=6), n=st.integers(0, 8),
       pairs=st.lists(st.tuples(st.integers(-2, 10), st.integers(-2, 7)), min_size=1,
                      max_size=state_mod._SMALL))
def test_small_path_agrees_with_numpy(free: list[int], n: int, pairs: list[tuple[int, int]]) -> None:
    state, out = _state(free), _out([i for i, _ in pairs], [g for _, g in pairs])
    g = len(free)
    assert (_verdict(state_mod._validate_small, state, n, g, out.pool_index.tolist(), out.replica.tolist())
            == _verdict(state_mod._validate_arrays, state, n, g, out))
