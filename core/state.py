"""What a policy sees and what it returns: the contract shared by the simulator and the proxy.

The simulator and the serving proxy both build a :class:`ClusterState` and a :class:`PoolView`
each scheduling tick, call ``policy.assign(state, pool)``, and apply the returned
:class:`Assignment` themselves (decide, then apply).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

__all__ = ["Assignment", "ClusterState", "PoolView", "check_decisions", "planned_overflow",
           "validate_assignment"]

_EMPTY_I = np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class ClusterState:
    """Decode-cluster state at the start of a tick.

    ``loads[g]`` is L_g (KV tokens), ``num_active[g]`` is n_g (running requests) and
    ``free_slots[g]`` is B_g − n_g. The ``active_*`` arrays list
    the requests running now (one entry per request, flat): replica, prompt length, age a_i and
    the caller's request id, for policies that project loads ahead (BR-H).

    Optional, ``None`` meaning today's model exactly: ``kv_budget[g]`` is replica g's KV token
    budget B^KV_g (a replica admits request i only while L_g + s_i, plus its projected growth,
    stays within it); ``step_a``, ``step_b``, ``step_c`` are per-replica step-time coefficients,
    τ_g = b_g + a_g·L_g + c_g·n_g, the barrier step being max_g τ_g. ``output_cap``: the most
    output tokens any request may generate (its ``max_tokens``); with budgets, the budget-aware
    policies then admit a request only while the replica's load stays within its budget until every
    request there has ended, whatever their outputs up to the cap (``core/policies/br0.py``,
    :func:`~balanceroute.core.policies.br0.kv_until_end`).
    """

    loads: NDArray[np.int64]
    free_slots: NDArray[np.int64]
    num_active: NDArray[np.int64]
    step: int = 0
    now: float = 0.0
    active_replica: NDArray[np.int64] = field(default_factory=lambda: _EMPTY_I)
    active_prompt: NDArray[np.int64] = field(default_factory=lambda: _EMPTY_I)
    active_age: NDArray[np.int64] = field(default_factory=lambda: _EMPTY_I)
    active_ids: NDArray[np.int64] = field(default_factory=lambda: _EMPTY_I)
    kv_budget: NDArray[np.int64] | None = None
    step_a: NDArray[np.float64] | None = None
    step_b: NDArray[np.float64] | None = None
    step_c: NDArray[np.float64] | None = None
    output_cap: int | None = None

    @property
    def num_replicas(self) -> int:
        """G."""
        return int(self.loads.shape[0])


@dataclass(slots=True)
class PoolView:
    """Prefilled requests waiting for a decode slot, in arrival (FIFO) order.

    ``wait[j]`` is how long pooled request j has waited, in seconds; ``request_ids[j]`` is the
    caller's id (a workload row in the simulator, a proxy-internal id in serving).
    """

    prompt_len: NDArray[np.int64]
    wait: NDArray[np.float64]
    request_ids: NDArray[np.int64]

    def __len__(self) -> int:
        return int(self.prompt_len.shape[0])


@dataclass(slots=True)
class Assignment:
    """Pool positions and the replica each goes to, in the order the policy decided them."""

    pool_index: NDArray[np.int64] = field(default_factory=lambda: _EMPTY_I)
    replica: NDArray[np.int64] = field(default_factory=lambda: _EMPTY_I)

    def __len__(self) -> int:
        return int(self.pool_index.shape[0])


def validate_assignment(state: ClusterState, pool: PoolView, out: Assignment, *,
                        budget: bool = False) -> None:
    """Raise ``ValueError`` unless ``out`` assigns each pooled request at most once, only to
    existing replicas, never more requests to a replica than it has free slots and, with
    ``budget`` and KV budgets in the state, never a request larger than its replica's whole budget
    (an engine could never admit it; the simulator checks this, the proxy leaves it to the
    engines). Placing more than a replica's budget has room for now is allowed — the request
    waits at the replica, as an engine makes a baseline's request wait; :func:`planned_overflow`
    says by how much, and the budget-aware policies keep it at 0."""
    n = len(pool)
    g = state.num_replicas
    if out.pool_index.shape != out.replica.shape:
        raise ValueError("assignment arrays differ in length")
    if len(out) == 0:
        return
    if (len(out) <= _SMALL and out.pool_index.ndim == 1 and out.pool_index.dtype.kind in "iu"
            and out.replica.dtype.kind in "iu"):
        _validate_small(state, n, g, out.pool_index.tolist(), out.replica.tolist())
    else:
        _validate_arrays(state, n, g, out)
    if budget and state.kv_budget is not None and np.any(
            pool.prompt_len[out.pool_index] > state.kv_budget[out.replica]):
        raise ValueError("assignment places a request larger than its replica's KV budget")


# Up to this many placements a tick's decision is checked on Python ints: the same checks in the
# same order (tests/core/test_state.py compares the two), without the numpy calls that cost a
# proxy tick tens of µs once the relay has pushed them out of the CPU's caches.
_SMALL = 16


def _validate_small(state: ClusterState, n: int, g: int, index: list[int], replica: list[int]) -> None:
    check_decisions(index, replica, n, state.free_slots.tolist())


def check_decisions(index: list[int], replica: list[int], n_pool: int, free: list[int]) -> None:
    """:func:`validate_assignment`'s checks on Python ints (pool positions ``index`` and their
    ``replica``, of ``n_pool`` pooled requests and replicas with ``free`` slots): each position
    once and in range, each replica in range and given at most its free slots; ``ValueError``
    otherwise. The proxy checks its compiled tick's decisions with it
    (:mod:`balanceroute.serving.compiled_tick`)."""
    if not index and not replica:
        return
    if len(index) != len(replica):
        raise ValueError("assignment arrays differ in length")
    if min(index) < 0 or max(index) >= n_pool:
        raise ValueError("assignment names a pool position that does not exist")
    if len(set(index)) != len(index):
        raise ValueError("assignment names a pooled request twice")
    if min(replica) < 0 or max(replica) >= len(free):
        raise ValueError("assignment names a replica that does not exist")
    placed = dict.fromkeys(replica, 0)
    for r in replica:
        placed[r] += 1
    if min(free) < 0 or any(count > free[r] for r, count in placed.items()):  # (numpy's: every g)
        raise ValueError("assignment exceeds a replica's free slots")


def _validate_arrays(state: ClusterState, n: int, g: int, out: Assignment) -> None:
    if out.pool_index.min() < 0 or out.pool_index.max() >= n:
        raise ValueError("assignment names a pool position that does not exist")
    if np.unique(out.pool_index).shape[0] != len(out):
        raise ValueError("assignment names a pooled request twice")
    if out.replica.min() < 0 or out.replica.max() >= g:
        raise ValueError("assignment names a replica that does not exist")
    if np.any(np.bincount(out.replica, minlength=g) > state.free_slots):
        raise ValueError("assignment exceeds a replica's free slots")


def planned_overflow(state: ClusterState, pool: PoolView, out: Assignment) -> NDArray[np.int64]:
    """Per replica, by how many KV tokens ``out`` would take its load past its budget right now:
    (L_g + Σ_{i→g} s_i − B^KV_g)_+, minus what was already over (0 without budgets)."""
    g = state.num_replicas
    if state.kv_budget is None:
        return np.zeros(g, dtype=np.int64)
    after = state.loads + np.bincount(out.replica, weights=pool.prompt_len[out.pool_index],
                                      minlength=g).astype(np.int64)
    before = np.maximum(state.loads - state.kv_budget, 0)
    return np.maximum(np.maximum(after - state.kv_budget, 0) - before, 0).astype(np.int64)
