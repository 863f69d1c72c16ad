"""The clairvoyant multi-step schedule in OR-Tools CP-SAT (``clairvoyant-cpsat``).

Time-indexed: z_{i,g,t} = 1 when request i starts at model step t on replica g. Loads, slot use
and envelopes are linear in z; ``papers/formulations.md`` derives every constraint. All data are
integers (tokens); the ``step_time`` weights (b·q, a) are scaled to integers exactly when their
ratio is a short decimal, else rounded (``info["exact_scaling"]``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from .base import FEASIBLE, NO_SOLUTION, OPTIMAL, BackendSolver, Solution, check_solve_args
from .clairvoyant_eval import (
    COARSE_MESSAGE,
    coarse_objective,
    evaluate_schedule,
    model_incumbent,
    model_tables,
)
from .cpsat_backend import export_cpsat, run_cpsat, stop_message
from .incumbent import decode_step_schedule
from .instances import ClairvoyantInstance
from .scaling import inexact_scaling_message, step_time_weights

__all__ = ["ClairvoyantCpSatSolver"]


class ClairvoyantCpSatSolver(BackendSolver):
    """Optimal routing and start times for a known episode, by CP-SAT."""

    name: ClassVar[str] = "clairvoyant-cpsat"
    problem: ClassVar[str] = "clairvoyant"
    requires: ClassVar[tuple[str, ...]] = ("ortools",)

    def solve(self, instance: ClairvoyantInstance, *, time_limit_s: float = 30.0,
              gap_rel: float = 0.0, threads: int = 1, seed: int = 0,
              hint: tuple[NDArray, NDArray] | None = None, params: Mapping[str, str] | None = None,
              log_path: str | None = None, export: str | None = None) -> Solution:
        """Solve under the time limit. ``hint``: a known schedule ``(replica, start)`` in decode
        steps (e.g. a policy's), given to CP-SAT as a solution hint (snapped to model steps)."""
        from ortools.sat.python import cp_model

        if not isinstance(instance, ClairvoyantInstance):
            raise ValueError(f"{self.name} solves ClairvoyantInstance, got {type(instance).__name__}")
        check_solve_args(time_limit_s, gap_rel, threads)
        t0 = time.perf_counter()

        # Data
        tab = model_tables(instance)
        n, g_count, slots, horizon = instance.num_requests, instance.num_replicas, instance.slots, tab.horizon
        w_busy, w_env, unit, exact = step_time_weights(instance.step_b * tab.q, instance.step_a)
        model = cp_model.CpModel()

        # Variables: z[i, g, t]; replicas are identical and start empty, so request i may use
        # only replicas 0..i (relabel replicas by their lowest-indexed request).
        z = {(i, g, t): model.new_bool_var(f"z_{i}_{g}_{t}")
             for i in range(n) for g in range(min(i + 1, g_count)) for t in tab.starts(i)}
        by_request: list[list] = [[] for _ in range(n)]
        load_terms: dict[tuple[int, int], tuple[list, list]] = {}
        for (i, g, t), var in z.items():
            by_request[i].append((t, var))
            for e, c in enumerate(tab.contrib[i]):
                vs, cs = load_terms.setdefault((g, t + e), ([], []))
                vs.append(var)
                cs.append(int(c))
        peak = int(sum(c.max() for c in tab.contrib))
        env = [model.new_int_var(0, peak, f"M_{k}") for k in range(horizon)]
        running: list[list] = [[] for _ in range(horizon)]
        for (_g, k), (vs, _) in load_terms.items():
            running[k].extend(vs)

        # Every request starts exactly once, on one replica, within its window.
        for i in range(n):
            model.add_exactly_one(var for _, var in by_request[i])
        for (_g, k), (vs, cs) in load_terms.items():
            # A replica runs at most B requests at a time (slot use = the terms' count).
            model.add(sum(vs) <= slots)
            # The envelope M(k) is at least every replica's load at step k.
            model.add(env[k] >= cp_model.LinearExpr.weighted_sum(vs, cs))
        if instance.work_conserving:
            # No idling: at a step where some released request has not started (w_k = 1),
            # every slot is busy; with w_k = 0 every released request has started by k.
            start = [model.new_int_var(int(tab.first[i]), int(tab.last[i]), f"t_{i}") for i in range(n)]
            for i in range(n):
                model.add(start[i] == sum(t * var for t, var in by_request[i]))
            waiting = [model.new_bool_var(f"w_{k}") for k in range(horizon)]
            for k in range(horizon):
                model.add(sum(running[k]) >= g_count * slots * waiting[k])
            for i in range(n):
                for k in range(int(tab.first[i]), int(tab.last[i])):
                    model.add(start[i] <= k).only_enforce_if(waiting[k].Not())

        # Objective: Σ_k M(k) (imbalance = G·ΣM − total tokens), or Σ_k (b·q·busy_k + a·M(k)).
        if instance.objective == "imbalance":
            model.minimize(sum(env))
        else:
            busy = [model.new_bool_var(f"y_{k}") for k in range(horizon)]
            for k in range(horizon):
                # A step with any request running is busy (costs b·q).
                for v in running[k]:
                    model.add_implication(v, busy[k])
            model.minimize(sum(int(w_busy) * busy[k] + int(w_env) * env[k] for k in range(horizon)))

        # Starting incumbent: the model's own list schedule, or the caller's schedule when it is
        # better under the model's objective (a policy's schedule fits the model when q = 1).
        incumbent = model_incumbent(instance, tab, hint)
        if incumbent is not None:
            h_rep, h_start = incumbent
            for (i, g, t), var in z.items():
                model.add_hint(var, int(g == h_rep[i] and t == h_start[i]))

        if export is not None:  # objective in the instance's units, constant included
            if instance.objective == "imbalance":
                export_cpsat(model, export, scale=g_count, constant=-tab.total)
            else:
                export_cpsat(model, export, scale=unit)
        solver, code = run_cpsat(model, time_limit_s=time_limit_s, gap_rel=gap_rel,
                                 threads=threads, seed=seed, params=params, log_path=log_path)
        if code == cp_model.INFEASIBLE:
            raise ValueError(
                "the clairvoyant instance is infeasible: no schedule finishes every request "
                f"within {horizon} model steps{' without idling' if instance.work_conserving else ''}"
            )

        replica = np.full(n, -1, dtype=np.int64)
        start_fine = np.full(n, -1, dtype=np.int64)
        value, message = float("nan"), ""
        info: dict[str, Any] = {"exact_scaling": exact, "model_steps": horizon}
        status = NO_SOLUTION
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            start_model = np.zeros(n, dtype=np.int64)
            for (i, g, t), var in z.items():
                if solver.boolean_value(var):
                    replica[i], start_model[i] = g, t
            info["model_objective"] = coarse_objective(instance, tab, replica, start_model)
            replica, start_fine = decode_step_schedule(instance, replica, start_model * tab.q)
            value = evaluate_schedule(instance, replica, start_fine)["objective"]
            status = OPTIMAL if code == cp_model.OPTIMAL else FEASIBLE
        if status != OPTIMAL:
            message = stop_message(solver, time_limit_s, found=status == FEASIBLE)
        raw = solver.best_objective_bound
        bound: float
        if instance.objective == "imbalance":
            bound = g_count * raw - tab.total
        else:
            bound = raw * unit
        info["model_bound"] = float(bound)
        if tab.q > 1:
            # The model bound is on the coarse objective, not the decode-step one.
            bound = float("nan")
            message = (message + "; " if message else "") + COARSE_MESSAGE.format(q=tab.q)
        elif not exact:
            status = FEASIBLE if status == OPTIMAL else status
            bound = float("nan")
            message = (message + "; " if message else "") + inexact_scaling_message(w_busy, w_env)
        elif status == OPTIMAL and gap_rel == 0.0:
            bound = value
        return Solution(solver=self.name, status=status, sense="min", objective=value,
                        bound=bound, wall_s=time.perf_counter() - t0, replica=replica,
                        start=start_fine, message=message, info=info)

