"""Exact models run as online policies, to separate per-tick error from myopia (small runs only).

- ``exact-tick`` (:class:`ExactTickPolicy`): every tick solves the per-tick model exactly
  (CP-SAT, objective ``imbalance``: the true post-tick I(L + Δ), or ``f_score``: the paper's
  Σ_g F_g) and places what it says. Same information as BR-0; no per-tick heuristic error.
- ``mpc`` (:class:`MPCPolicy`): a rolling-horizon controller that knows output lengths (bound
  to the workload, like ``brh-oracle``). Each tick it chooses which pooled requests go where
  (work-conserving) to minimise Σ_{h<W} I(h) of the loads projected W steps ahead with the
  exact dynamics — running requests grow and leave at their true ends, placed ones hold
  s_i + h while h < o_i — and applies the first tick only. Requests left in the pool are not
  planned within the window (a one-tick MPC), so it is clairvoyant over W steps but not over
  the future pool.

Both implement the ``Policy`` contract (``core/state.py``) and are rows of the policy catalogue
(``balanceroute/catalogue.py``), non-default ``compare`` rows that need the ``solvers`` extra.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from ..core.state import Assignment, ClusterState, PoolView
from ..core.workloads.base import Workload
from .cpsat_backend import run_cpsat
from .instances import TickInstance

__all__ = ["ExactTickPolicy", "MPCPolicy"]


def _to_assignment(replica: np.ndarray) -> Assignment:
    placed = np.flatnonzero(replica >= 0)
    return Assignment(pool_index=placed.astype(np.int64), replica=replica[placed].astype(np.int64))


@dataclass(slots=True, kw_only=True)
class ExactTickPolicy:
    """Each tick: the exact per-tick optimum of ``objective`` by ``solver`` within
    ``time_limit_s`` (its best incumbent if the limit binds)."""

    objective: Literal["imbalance", "f_score"] = "imbalance"
    solver: str = "tick-cpsat"
    time_limit_s: float = 5.0
    name: str = "exact-tick"

    def __post_init__(self) -> None:
        if self.objective not in ("imbalance", "f_score"):
            raise ValueError(f"objective={self.objective!r} must be 'imbalance' or 'f_score'")
        if not self.time_limit_s > 0:
            raise ValueError(f"time_limit_s={self.time_limit_s!r} must be > 0")

    def assign(self, state: ClusterState, pool: PoolView) -> Assignment:
        """Solve this tick's :class:`TickInstance` and place what the optimum places."""
        from . import get_solver

        if len(pool) == 0 or not state.free_slots.any():
            return Assignment()
        inst = TickInstance.br0(state.loads, state.free_slots, pool.prompt_len,
                                objective=self.objective)
        sol = get_solver(self.solver).solve(inst, time_limit_s=self.time_limit_s)
        if not sol.has_solution:  # no incumbent in time: FIFO on the least loaded replicas
            return _fifo_least_load(state, pool)
        return _to_assignment(sol.replica)


def _fifo_least_load(state: ClusterState, pool: PoolView) -> Assignment:
    free = state.free_slots.astype(np.int64).copy()
    loads = state.loads.astype(np.int64).copy()
    idx, reps = [], []
    for j in range(min(int(free.sum()), len(pool))):
        g = int(np.argmin(np.where(free > 0, loads, np.iinfo(np.int64).max)))
        idx.append(j)
        reps.append(g)
        free[g] -= 1
        loads[g] += int(pool.prompt_len[j])
    return Assignment(pool_index=np.array(idx, dtype=np.int64), replica=np.array(reps, dtype=np.int64))


@dataclass(slots=True, kw_only=True)
class MPCPolicy:
    """One-tick model-predictive control over a ``window``-step projection with true output
    lengths (``bind`` it to the simulated workload first); ``stride``: project every
    ``stride``-th step of the window; CP-SAT within ``time_limit_s`` per tick."""

    window: int = 64
    stride: int = 4
    time_limit_s: float = 5.0
    output_len: Any = field(default=None, repr=False)  # (rows,) int array after bind()
    name: str = "mpc"

    def __post_init__(self) -> None:
        if self.window < 1 or self.stride < 1:
            raise ValueError(f"window={self.window} and stride={self.stride} must be >= 1")
        if not self.time_limit_s > 0:
            raise ValueError(f"time_limit_s={self.time_limit_s!r} must be > 0")

    def bind(self, workload: Workload) -> MPCPolicy:
        """A copy that knows ``workload``'s output lengths (request ids are its rows)."""
        return replace(self, output_len=np.asarray(workload.output_len, dtype=np.int64))

    def assign(self, state: ClusterState, pool: PoolView) -> Assignment:
        """Solve the window model for this tick's placement (rules in the module docstring)."""
        from ortools.sat.python import cp_model

        if self.output_len is None:
            raise ValueError("mpc needs the workload's output lengths: use MPCPolicy().bind(workload)")
        if len(pool) == 0 or not state.free_slots.any():
            return Assignment()
        g_count = state.num_replicas
        hs = np.arange(0, self.window, self.stride)
        # Data: base loads of the running requests at h (they leave at their true ends), and
        # each pooled request's load s_i + h while h < o_i.
        remaining = self.output_len[state.active_ids] - state.active_age
        base = np.zeros((g_count, hs.size), dtype=np.int64)
        for g, s, a, r in zip(state.active_replica, state.active_prompt, state.active_age,
                              remaining, strict=True):
            base[g] += np.where(hs < r, s + a + hs, 0)
        o_pool = self.output_len[pool.request_ids]
        contrib = np.where(hs[None] < o_pool[:, None], pool.prompt_len[:, None] + hs[None], 0)
        open_g = [g for g in range(g_count) if state.free_slots[g] > 0]
        count = min(int(state.free_slots.sum()), len(pool))
        model = cp_model.CpModel()
        # Variables: x[i, g] = pooled request i joins replica g now.
        x = {(i, g): model.new_bool_var(f"x_{i}_{g}") for i in range(len(pool)) for g in open_g}
        for i in range(len(pool)):
            model.add_at_most_one(x[i, g] for g in open_g)
        for g in open_g:
            model.add(sum(x[i, g] for i in range(len(pool))) <= int(state.free_slots[g]))
        # Work conservation: place as many as slots and pool allow.
        model.add(sum(x.values()) == count)
        peak = int(base.max() + contrib.sum(axis=0).max()) + 1
        env = [model.new_int_var(0, peak, f"M_{h}") for h in range(hs.size)]
        for h in range(hs.size):
            for g in range(g_count):
                added = sum(int(contrib[i, h]) * x[i, g] for i in range(len(pool)) if g in open_g)
                # The envelope is at least every replica's projected load.
                model.add(env[h] >= int(base[g, h]) + added)
        # Σ_h I(h) = G·Σ_h M(h) − Σ_h Σ_g L_g(h); the placed requests' tokens are subtracted.
        model.minimize(g_count * sum(env) - sum(int(contrib[i, :].sum()) * x[i, g]
                                                for (i, g) in x))
        solver, code = run_cpsat(model, time_limit_s=self.time_limit_s, gap_rel=0.0,
                                 threads=1, seed=0)
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return _fifo_least_load(state, pool)
        replica = np.full(len(pool), -1, dtype=np.int64)
        for (i, g), var in x.items():
            if solver.boolean_value(var):
                replica[i] = g
        return _to_assignment(replica)

