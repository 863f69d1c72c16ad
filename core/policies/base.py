"""The policy contract and the FIFO helper the baselines share."""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from .._tick_kernels import ACTIVE, LOAD, TURN, fifo_choose
from ..state import Assignment, ClusterState, PoolView
from ..tick_contract import FIFO, CompiledTick

__all__ = ["ACTIVE", "LOAD", "TURN", "FifoPolicy", "Policy"]


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
    decisions within a tick. A deterministic baseline only declares its ``key``: the replica
    features it ranks, most significant first (:data:`LOAD` L_g, :data:`ACTIVE` n_g,
    :data:`TURN` (g − ``cursor``) mod G), and ``choose`` takes the lexicographically smallest
    (ties: the lower index) through the one compiled chooser
    (:func:`~balanceroute.core._tick_kernels.fifo_choose`) that the simulator's fused loop also
    runs.
    ``cursor`` is the replica after the last one chosen; it persists across ticks. With KV
    budgets in the state the load a rule sees is L_g − B^KV_g (tokens against capacity, as
    SGLang's DP minimum-tokens rule counts them): with equal budgets the same order as L_g.
    """

    name = "fifo"
    key: ClassVar[tuple[int, ...] | None] = None
    cursor: int = 0

    def choose(self, free: NDArray[np.int64], loads: NDArray[np.int64], active: NDArray[np.int64]) -> int:
        """Index of the replica (with ``free > 0``) that takes the next request: the smallest
        ``key``; the cursor moves past it."""
        if self.key is None:
            raise NotImplementedError(f"{type(self).__name__} declares no key and no choose")
        g = int(fifo_choose(np.asarray(self.key, dtype=np.int64), free, loads, active,
                            self.cursor))
        self.cursor = (g + 1) % free.shape[0]
        return g

    def assign(self, state: ClusterState, pool: PoolView) -> Assignment:
        """Assign the first ``min(Σ free, |pool|)`` pooled requests in FIFO order."""
        free = state.free_slots.astype(np.int64, copy=True)
        loads = state.loads.astype(np.int64, copy=True)
        if state.kv_budget is not None:  # tokens against capacity (SGLang's DP minimum tokens)
            loads -= np.asarray(state.kv_budget, dtype=np.int64)
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

    def compiled_tick(self, slots: int) -> CompiledTick | None:
        """The FIFO tick with this policy's ``key`` and cursor, or ``None`` when there is no key
        or a subclass replaced ``choose`` or ``assign`` (its rule is then not the key's)."""
        cls = type(self)
        if self.key is None or cls.choose is not FifoPolicy.choose or cls.assign is not FifoPolicy.assign:
            return None
        return CompiledTick(kind=FIFO, key=np.asarray(self.key, dtype=np.int64),
                            state=np.array([self.cursor], dtype=np.int64))

    def restore_tick_state(self, state: NDArray[np.int64]) -> None:
        """Take back the cursor a compiled run left (``state[0]``)."""
        self.cursor = int(state[0])
