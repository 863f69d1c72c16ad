"""The policy's compiled tick, run by the proxy on the ledger's own arrays.

A policy that declares a compiled tick (:class:`~balanceroute.core.tick_contract.CompiledTick`,
``policy.compiled_tick(slots)``: BR-0's two-stage tick) decides exactly as its ``assign`` does,
because ``assign`` runs that same kernel with those same parameters. The simulator's fused loop
(:mod:`~balanceroute.core.fused`) uses the declaration to skip the per-tick Python of
``assign``; this module does the same for the proxy's dispatcher. Per tick it skips what the
generic path builds and the kernel never reads — the running requests' columns of
``ClusterState``, the state and pool objects, ``two_stage_assign``'s argument checks and array
copies — and keeps its arrays from tick to tick, with few numpy calls (between two relayed
requests each costs microseconds from cold caches). On the proxy's request path that cut the CPU
a request costs by about an eighth (0.87× per round against the code before;
``benchmarks/README.md``, "Per request: BR-0's compiled tick in the proxy").

It runs only where the generic path would hand the kernel nothing more: numba present, the
policy declares the two-stage tick (BR-H and the FIFO baselines keep their ``assign``), and the
tick's state is the ledger's own (:meth:`~balanceroute.serving.ledger.Ledger.own_state`: no
engine-reported load, KV budget or replica speed). Every decision is checked on Python ints
before the ledger applies it; the tests check it is the decision ``policy.assign`` makes on
the state :meth:`~balanceroute.serving.ledger.Ledger.build_tick` builds.
"""

from __future__ import annotations

import numpy as np

from balanceroute.core._jit import HAVE_NUMBA
from balanceroute.core._tick_kernels import tick_workspace, two_stage_tick
from balanceroute.core.fused import compiled_tick
from balanceroute.core.state import check_decisions
from balanceroute.core.tick_contract import TWO_STAGE, CompiledTick

from .ledger import Ledger

__all__ = ["CompiledTickRunner"]

_NO_GROWTH = np.zeros((0, 1), dtype=np.float64)  # BR-0 projects nothing: H = 0, no growth
_D = np.ones(1, dtype=np.float64)  # the discount of the one projected step


class CompiledTickRunner:
    """Runs ``policy``'s declared two-stage tick on a :class:`Ledger` of ``num_replicas``
    replicas (the arrays it hands the kernel are kept, grown with the pool)."""

    def __init__(self, policy: object, num_replicas: int) -> None:
        self.policy = policy
        self.num_replicas = num_replicas
        self._declared: dict[int, CompiledTick | None] = {}
        g = num_replicas
        self._loads = np.zeros((g, 1), dtype=np.float64)
        self._free = np.zeros(g, dtype=np.int64)
        self._weights = np.ones(g, dtype=np.float64)  # equal replicas: w_g = 1 (lim's w and 1/w)
        self._no_room = np.zeros((g, 0), dtype=np.float64)  # no KV budget: K = 0
        self._no_cost: dict[int, np.ndarray] = {}
        self._cap = 0
        self._r_max = -1
        self._out = np.zeros((2, 0), dtype=np.int64)  # the kernel's out_i and out_g, as rows
        self._out_i, self._out_g = self._out
        self._work: tuple = ()

    @staticmethod
    def available() -> bool:
        """Whether the kernels are compiled in this install (without numba the policy's numpy
        path decides, through ``assign``)."""
        return HAVE_NUMBA

    def declared(self, slots: int) -> CompiledTick | None:
        """The policy's two-stage tick for replicas of at most ``slots`` slots, or ``None``."""
        if slots not in self._declared:  # (the simulator's question, asked the same way)
            tick = compiled_tick(self.policy, slots)
            self._declared[slots] = tick if tick is not None and tick.kind == TWO_STAGE else None
        return self._declared[slots]

    def decide(self, ledger: Ledger, now: float) -> tuple[list[int], list[int]] | None:
        """(pool positions, replicas) of this tick, or ``None`` when the generic path must decide
        (no declared tick for this cluster, or no free slot: then ``build_tick`` says there is
        nothing to decide). The ledger must have a pooled request and be its own state."""
        ledger.settle()
        running = ledger.num_active.tolist()
        free_now = ledger.free_list(running)
        if not any(free_now):
            return None
        slots = max(f + n for f, n in zip(free_now, running, strict=True))
        tick = self.declared(slots)  # the generic path's growth_steps: max_g (free_g + n_g)
        if tick is None:
            return None
        pool = ledger.pool
        n = len(pool)
        if n > self._cap or tick.r_max != self._r_max:
            self._grow(n, tick.r_max)
        cost = self._no_cost.get(n)
        if cost is None:
            cost = self._no_cost[n] = np.zeros((n, 0), dtype=np.float64)
        # few numpy calls: between two requests the relay's work clears the caches, and each
        # call then costs microseconds (the pool's two columns are one array, both decisions one)
        self._loads[:, 0] = ledger.loads
        self._free[:] = free_now
        columns = np.array([[t.prompt_len for t in pool], [now - t.joined for t in pool]], dtype=np.float64)
        count = two_stage_tick(
            self._loads, self._free, columns[0], columns[1], _D, 1.0,
            float(tick.beta_per_replica * self.num_replicas), int(tick.s_greedy), int(tick.r_max),
            float(tick.deadline_s), float(tick.deadline_factor), _NO_GROWTH, False, True,
            bool(tick.fit_stage1), float(tick.growth_steps), float(tick.ttft_slo_s), True,
            bool(tick.lpt_batches), self._out_i, self._out_g,
            (self._weights, self._weights, self._no_room, cost), self._work,
        )
        index, replica = (row[:count] for row in self._out.tolist())
        check_decisions(index, replica, n, free_now)
        return index, replica

    def _grow(self, n_pool: int, r_max: int) -> None:
        self._cap = max(16, 1 << max(n_pool - 1, 0).bit_length())
        self._r_max = r_max
        self._out = np.zeros((2, self._cap), dtype=np.int64)
        self._out_i, self._out_g = self._out
        self._work = tick_workspace(self.num_replicas, 1, self._cap, r_max)
