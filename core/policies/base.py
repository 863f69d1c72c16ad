"""The policy contract and the FIFO helper the baselines share."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from ..state import Assignment, ClusterState, PoolView

__all__ = ["FifoPolicy", "Policy"]


@runtime_checkable
class Policy(Protocol):
    """Routes pooled requests to decode replicas, one scheduling tick at a time.

    Invariant of ``assign``: each pooled request is named at most once, no replica receives more
    requests than its free slots, and the state and pool passed in are not modified. The caller
    (simulator or proxy) applies the returned assignment; requests it does not name stay pooled.
    """

    name: str

    def assign(self, state: ClusterState, pool: PoolView) -> Assignment:
        """Decide which pooled requests go to which replica this tick."""
        ...


class FifoPolicy:
    """Baseline skeleton: take the pool head in order, one request at a time, and give each to
    ``choose(free, loads, active)`` — a replica with a free slot — until slots or pool run out.

    ``loads`` and ``active`` are updated as requests are placed, so the rule sees its own
    decisions within a tick.
    """

    name = "fifo"

    def choose(self, free: NDArray[np.int64], loads: NDArray[np.int64], active: NDArray[np.int64]) -> int:
        """Index of the replica (with ``free > 0``) that takes the next request."""
        raise NotImplementedError

    def assign(self, state: ClusterState, pool: PoolView) -> Assignment:
        """Assign the first ``min(Σ free, |pool|)`` pooled requests in FIFO order."""
        free = state.free_slots.astype(np.int64, copy=True)
        loads = state.loads.astype(np.int64, copy=True)
        active = state.num_active.astype(np.int64, copy=True)
        count = int(min(free.sum(), len(pool)))
        replica = np.empty(count, dtype=np.int64)
        for j in range(count):
            g = self.choose(free, loads, active)
            replica[j] = g
            free[g] -= 1
            active[g] += 1
            loads[g] += pool.prompt_len[j]
        return Assignment(pool_index=np.arange(count, dtype=np.int64), replica=replica)
