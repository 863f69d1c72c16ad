"""Per-tick assignment as a MILP in PuLP, solved by CBC (``tick-cbc``) or HiGHS (``tick-highs``).

    x_ig ∈ {0,1}                    request i joins replica g this tick
    Δ_g = Σ_i s_i x_ig              tokens replica g receives
    f_score:    max Σ_g α(1ᵀd)Δ_g − β Σ_h d_h u_gh,   u_gh ≥ Δ_g − m_g(h),  u_gh ≥ 0
    imbalance:  min G·M − Σ_g (L_g + Δ_g),            M ≥ L_g + Δ_g
F is concave piecewise linear in Δ_g and β d_h ≥ 0, so at an optimum u_gh = (Δ_g − m_g(h))_+:
the hinge needs no binaries. Likewise M = max_g(L_g + Δ_g). See ``papers/formulations.md``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from .base import BackendSolver, Solution, check_solve_args
from .instances import TickInstance
from .pulp_backend import PULP_BACKENDS, AnyPulpBackend, export_pulp, solve_pulp
from .tick_eval import check_tick_assignment, tick_objective

__all__ = ["TickCbcSolver", "TickHighsSolver", "TickPulpSolver", "build_tick_milp"]


def build_tick_milp(instance: TickInstance):
    """The PuLP model of ``instance`` and its ``x[(i, g)]`` variables.

    The objective has no constant term; :func:`objective_constant` gives the one to add.
    """
    import pulp

    # Data
    g_count, p_count = instance.num_replicas, instance.pool_size
    s = instance.prompt_len.astype(float).tolist()
    m = instance.margins
    d = instance.d
    open_g = [g for g in range(g_count) if instance.free_slots[g] > 0]
    lo, hi = instance.required
    maximise = instance.objective == "f_score"
    prob = pulp.LpProblem("tick", pulp.LpMaximize if maximise else pulp.LpMinimize)

    # Variables
    x = {(i, g): prob.add_variable(f"x_{i}_{g}", cat=pulp.LpBinary)
         for i in range(p_count) for g in open_g}
    delta = {g: pulp.lpSum(s[i] * x[i, g] for i in range(p_count)) for g in open_g}

    # Each pooled request joins at most one replica.
    for i in range(p_count):
        prob += pulp.lpSum(x[i, g] for g in open_g) <= 1, f"once_{i}"
    # A replica takes no more requests than it has free slots.
    for g in open_g:
        prob += pulp.lpSum(x[i, g] for i in range(p_count)) <= int(instance.free_slots[g]), f"slots_{g}"
    # Work conservation: place the required number of requests (exactly, or at most).
    placed = pulp.lpSum(x.values())
    if lo == hi:
        prob += placed == hi, "count"
    else:
        prob += placed <= hi, "count"

    if maximise:
        # Hinges: u_gh is at least the overflow of Δ_g past the margin m_g(h).
        u = {(g, h): prob.add_variable(f"u_{g}_{h}", lowBound=0)
             for g in open_g for h in range(d.shape[0])}
        for (g, h), var in u.items():
            prob += var >= delta[g] - float(m[g, h]), f"hinge_{g}_{h}"
        gain = instance.alpha * float(d.sum())
        prob += (pulp.lpSum(gain * delta[g] for g in open_g)
                 - pulp.lpSum(float(instance.beta) * float(d[h]) * u[g, h] for g, h in u))
    else:
        # Envelope: M is at least every replica's post-tick load.
        envelope = prob.add_variable("M", lowBound=float(instance.loads.max()))
        for g in open_g:
            prob += envelope >= delta[g] + float(instance.loads[g]), f"envelope_{g}"
        prob += g_count * envelope - pulp.lpSum(delta.values())
    return prob, x


def objective_constant(instance: TickInstance) -> float:
    """The constant left out of :func:`build_tick_milp`'s objective (−Σ_g L_g for imbalance)."""
    return 0.0 if instance.objective == "f_score" else -float(instance.loads.sum())


class _PulpTickSolver(BackendSolver):
    """Shared body of the PuLP tick solvers; ``backend`` is ``cbc``, ``highs`` or any PuLP
    solver name (:class:`TickPulpSolver`)."""

    name: ClassVar[str]
    backend: str
    problem: ClassVar[str] = "tick"
    requires: ClassVar[tuple[str, ...]]

    def solve(self, instance: TickInstance, *, time_limit_s: float = 10.0, gap_rel: float = 0.0,
              threads: int = 1, seed: int = 0, params: Mapping[str, str] | None = None,
              log_path: str | None = None, export: str | None = None) -> Solution:
        """Build the MILP, solve it under the time limit, return the exact objective and bound
        (``params``, ``log_path``, ``export``: see :class:`~balanceroute.solvers.base.Solver`)."""
        if not isinstance(instance, TickInstance):
            raise ValueError(f"{self.name} solves TickInstance, got {type(instance).__name__}")
        check_solve_args(time_limit_s, gap_rel, threads)
        t0 = time.perf_counter()
        replica = np.full(instance.pool_size, -1, dtype=np.int64)
        if instance.required[1] == 0:  # nothing can be placed: the empty assignment
            value = tick_objective(instance, replica)
            return Solution(solver=self.name, status="optimal", sense=instance.sense,
                            objective=value, bound=value, wall_s=time.perf_counter() - t0,
                            replica=replica)
        prob, x = build_tick_milp(instance)
        if export is not None:
            export_pulp(prob, export, constant=objective_constant(instance))
        status, bound, message = solve_pulp(prob, self.backend, time_limit_s=time_limit_s,
                                            gap_rel=gap_rel, threads=threads, seed=seed,
                                            params=params, log_path=log_path)
        value = float("nan")
        if status in ("optimal", "feasible"):
            for (i, g), var in x.items():
                if (var.value() or 0.0) > 0.5:
                    replica[i] = g
            value = tick_objective(instance, check_tick_assignment(instance, replica))
        bound += objective_constant(instance)
        if status == "optimal" and gap_rel == 0.0:
            bound = value  # proven: the backend's bound equals the optimum up to its tolerance
        return Solution(solver=self.name, status=status, sense=instance.sense, objective=value,
                        bound=bound, wall_s=time.perf_counter() - t0, replica=replica,
                        message=message)


class TickCbcSolver(_PulpTickSolver):
    """Per-tick MILP solved by COIN-OR CBC through PuLP (``COIN_CMD``)."""

    name = "tick-cbc"
    backend = "cbc"
    requires = PULP_BACKENDS["cbc"]


class TickHighsSolver(_PulpTickSolver):
    """Per-tick MILP solved by HiGHS through PuLP's in-process ``HiGHS`` (needs ``highspy``)."""

    name = "tick-highs"
    backend = "highs"
    requires = PULP_BACKENDS["highs"]


class TickPulpSolver(AnyPulpBackend, _PulpTickSolver):
    """Per-tick MILP on any solver PuLP knows (``get_solver("tick-pulp:SCIP_PY")``)."""

    name = "tick-pulp"
