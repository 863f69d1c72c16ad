"""Per-tick assignment in OR-Tools CP-SAT (``tick-cpsat``): the MILP of ``tick_pulp`` in integers.

CP-SAT needs integer data: margins are scaled by the smallest K making K·m integral and the
objective weights α(1ᵀd), β·d_h by the smallest S making them integral (exact for integer loads
and short decimal weights). Otherwise K, S = 10⁶ and the data are rounded: ``info["exact_scaling"]``
is False, the status is at best ``feasible`` (optimal only for the rounded model), the bound is
``nan`` and the message says so — e.g. γ = 0.9 with H ≥ 7, whose γ^7 needs seven decimals. The
reported objective is always re-evaluated exactly from the assignment.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from .base import FEASIBLE, NO_SOLUTION, OPTIMAL, BackendSolver, Solution, check_solve_args
from .cpsat_backend import export_cpsat, run_cpsat, stop_message
from .instances import TickInstance
from .scaling import inexact_scaling_message, integer_scale
from .tick_eval import check_tick_assignment, tick_objective

__all__ = ["TickCpSatSolver"]


class TickCpSatSolver(BackendSolver):
    """Per-tick assignment solved exactly by CP-SAT on integer-scaled data."""

    name: ClassVar[str] = "tick-cpsat"
    problem: ClassVar[str] = "tick"
    requires: ClassVar[tuple[str, ...]] = ("ortools",)

    def solve(self, instance: TickInstance, *, time_limit_s: float = 10.0, gap_rel: float = 0.0,
              threads: int = 1, seed: int = 0, params: Mapping[str, str] | None = None,
              log_path: str | None = None, export: str | None = None) -> Solution:
        """Build the CP-SAT model, solve under the time limit, return objective and bound
        (``params``, ``log_path``, ``export``: see :class:`~balanceroute.solvers.base.Solver`)."""
        from ortools.sat.python import cp_model

        if not isinstance(instance, TickInstance):
            raise ValueError(f"{self.name} solves TickInstance, got {type(instance).__name__}")
        check_solve_args(time_limit_s, gap_rel, threads)
        t0 = time.perf_counter()

        # Data (integer-scaled: K tokens, S objective units)
        g_count, p_count = instance.num_replicas, instance.pool_size
        s = instance.prompt_len.astype(np.int64)
        tok, exact_k = integer_scale(instance.proj_loads)
        m = np.rint(instance.margins * tok).astype(np.int64)
        loads = np.rint(instance.loads * tok).astype(np.int64)
        weights = np.concatenate([[instance.alpha * instance.d.sum()], instance.beta * instance.d])
        obj, exact_s = integer_scale(weights)
        gain, pen = int(round(weights[0] * obj)), np.rint(weights[1:] * obj).astype(np.int64)
        open_g = [g for g in range(g_count) if instance.free_slots[g] > 0]
        lo, hi = instance.required
        big = int(tok * s.sum())
        model = cp_model.CpModel()

        # Variables
        x = {(i, g): model.new_bool_var(f"x_{i}_{g}") for i in range(p_count) for g in open_g}
        delta = {g: sum(int(tok * s[i]) * x[i, g] for i in range(p_count)) for g in open_g}

        # Each pooled request joins at most one replica.
        for i in range(p_count):
            model.add_at_most_one(x[i, g] for g in open_g)
        # A replica takes no more requests than it has free slots.
        for g in open_g:
            model.add(sum(x[i, g] for i in range(p_count)) <= int(instance.free_slots[g]))
        # Work conservation: place the required number of requests.
        model.add_linear_constraint(sum(x.values()), lo, hi)

        if instance.objective == "f_score":
            # Hinges: u_gh is at least the overflow of Δ_g past the margin m_g(h).
            u = {(g, h): model.new_int_var(0, big, f"u_{g}_{h}")
                 for g in open_g for h in range(m.shape[1])}
            for (g, h), var in u.items():
                model.add(var >= delta[g] - int(m[g, h]))
            model.maximize(sum(gain * delta[g] for g in open_g)
                           - sum(int(pen[h]) * var for (g, h), var in u.items()))
        else:
            # Envelope: M is at least every replica's post-tick load.
            envelope = model.new_int_var(int(loads.max()), int(loads.max()) + big, "M")
            for g in open_g:
                model.add(envelope >= delta[g] + int(loads[g]))
            model.minimize(g_count * envelope - sum(delta.values()))

        if export is not None:  # objective in the instance's units, loads' constant included
            if instance.objective == "f_score":
                export_cpsat(model, export, scale=1.0 / (tok * obj))
            else:
                export_cpsat(model, export, scale=1.0 / tok, constant=-float(instance.loads.sum()))
        solver, code = run_cpsat(model, time_limit_s=time_limit_s, gap_rel=gap_rel,
                                 threads=threads, seed=seed, params=params, log_path=log_path)

        replica = np.full(p_count, -1, dtype=np.int64)
        value, message = float("nan"), ""
        if code == cp_model.INFEASIBLE:
            raise ValueError("the tick instance is infeasible")
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            for (i, g), var in x.items():
                if solver.boolean_value(var):
                    replica[i] = g
            value = tick_objective(instance, check_tick_assignment(instance, replica))
            status = OPTIMAL if code == cp_model.OPTIMAL else FEASIBLE
        else:
            status = NO_SOLUTION
        if status != OPTIMAL:
            message = stop_message(solver, time_limit_s, found=status == FEASIBLE)
        if instance.objective == "f_score":
            bound = solver.best_objective_bound / (tok * obj)
        else:
            bound = solver.best_objective_bound / tok - float(instance.loads.sum())
        if not (exact_k and exact_s):
            # The model solved has rounded data: its optimum and bound are not the instance's.
            status = FEASIBLE if status == OPTIMAL else status
            bound = float("nan")
            message = (message + "; " if message else "") + inexact_scaling_message(tok, obj)
        elif status == OPTIMAL and gap_rel == 0.0:
            bound = value
        return Solution(solver=self.name, status=status, sense=instance.sense, objective=value,
                        bound=bound, wall_s=time.perf_counter() - t0, replica=replica,
                        message=message,
                        info={"token_scale": tok, "objective_scale": obj,
                              "exact_scaling": exact_k and exact_s})
