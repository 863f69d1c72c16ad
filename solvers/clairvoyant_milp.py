"""The clairvoyant multi-step schedule as a time-indexed MILP in PuLP, solved by CBC
(``clairvoyant-cbc``) or HiGHS (``clairvoyant-highs``). Same model as ``clairvoyant_cpsat``;
``papers/formulations.md`` derives it.

    min Σ_k M(k)        (imbalance: Σ_k I(k) = G·Σ_k M(k) − Σ_i Σ_a (s_i + a), a constant)
    M(k) ≥ Σ_{i,t} c_i(k − t) z_{i,g,t}           for every g, k
    Σ_{i, t ≤ k < t + o_i} z_{i,g,t} ≤ B           for every g, k
    Σ_{g,t} z_{i,g,t} = 1                          for every i
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from .base import BackendSolver, Solution, check_solve_args
from .clairvoyant_eval import (
    COARSE_MESSAGE,
    ModelTables,
    coarse_objective,
    evaluate_schedule,
    model_incumbent,
    model_tables,
)
from .incumbent import decode_step_schedule
from .instances import ClairvoyantInstance
from .pulp_backend import PULP_BACKENDS, AnyPulpBackend, export_pulp, solve_pulp

__all__ = ["ClairvoyantCbcSolver", "ClairvoyantHighsSolver", "ClairvoyantPulpSolver",
           "build_clairvoyant_milp", "mip_start"]


def build_clairvoyant_milp(instance: ClairvoyantInstance):
    """The PuLP model, its ``z[(i, g, t)]`` variables and the tables it was built from
    (the envelope, waiting and busy variables are ``prob.variablesDict()["M_k" / "w_k" / "y_k"]``).

    ``step_time`` is scaled by 1/a (or 1/b when a = 0) so coefficients stay near 1; the
    objective has no constant term.
    """
    import pulp

    # Data
    tab = model_tables(instance)
    n, g_count, slots, horizon = instance.num_requests, instance.num_replicas, instance.slots, tab.horizon
    prob = pulp.LpProblem("clairvoyant", pulp.LpMinimize)

    # Variables: z[i, g, t] (request i may use replicas 0..i only: identical, empty replicas).
    z = {(i, g, t): prob.add_variable(f"z_{i}_{g}_{t}", cat=pulp.LpBinary)
         for i in range(n) for g in range(min(i + 1, g_count)) for t in tab.starts(i)}
    env = [prob.add_variable(f"M_{k}", lowBound=0) for k in range(horizon)]
    by_request: list[list] = [[] for _ in range(n)]
    load_terms: dict[tuple[int, int], list] = {}
    for (i, g, t), var in z.items():
        by_request[i].append((t, var))
        for e, c in enumerate(tab.contrib[i]):
            load_terms.setdefault((g, t + e), []).append((var, float(c)))
    running: list[list] = [[] for _ in range(horizon)]
    for (_g, k), terms in load_terms.items():
        running[k].extend(var for var, _ in terms)

    # Every request starts exactly once, on one replica, within its window.
    for i in range(n):
        prob += pulp.lpSum(var for _, var in by_request[i]) == 1, f"once_{i}"
    for (g, k), terms in load_terms.items():
        # A replica runs at most B requests at a time.
        prob += pulp.lpSum(var for var, _ in terms) <= slots, f"slots_{g}_{k}"
        # The envelope M(k) is at least every replica's load at step k.
        prob += env[k] >= pulp.LpAffineExpression(terms), f"envelope_{g}_{k}"
    if instance.work_conserving:
        # No idling: w_k = 1 allows a released request to wait at k but then every slot is
        # busy; w_k = 0 forces every request released by k to have started by k (big-M form).
        waiting = [prob.add_variable(f"w_{k}", cat=pulp.LpBinary) for k in range(horizon)]
        for k in range(horizon):
            prob += pulp.lpSum(running[k]) >= g_count * slots * waiting[k], f"busy_{k}"
        for i in range(n):
            start = pulp.lpSum(t * var for t, var in by_request[i])
            for k in range(int(tab.first[i]), int(tab.last[i])):
                prob += start <= k + (int(tab.last[i]) - k) * waiting[k], f"nowait_{i}_{k}"

    # Objective: Σ_k M(k), or Σ_k (b·q·y_k + a·M(k)) / a with y_k = 1 on busy steps.
    if instance.objective == "imbalance":
        prob += pulp.lpSum(env)
    else:
        unit = instance.step_a if instance.step_a > 0 else instance.step_b * tab.q
        busy = [prob.add_variable(f"y_{k}", cat=pulp.LpBinary) for k in range(horizon)]
        for k in range(horizon):
            # A step with any request running is busy.
            prob += pulp.lpSum(running[k]) <= g_count * slots * busy[k], f"busyflag_{k}"
        prob += pulp.lpSum((instance.step_b * tab.q / unit) * busy[k]
                           + (instance.step_a / unit) * env[k] for k in range(horizon))
    return prob, z, tab


def mip_start(prob, z: dict, instance: ClairvoyantInstance, tables: ModelTables,
              replica: NDArray, start_model: NDArray) -> dict:
    """Values of every variable of :func:`build_clairvoyant_milp` for a schedule of the model
    (``start_model`` in model steps, replicas canonical): a complete MIP start."""
    loads = np.zeros((instance.num_replicas, tables.horizon), dtype=np.int64)
    running = np.zeros(tables.horizon, dtype=np.int64)
    for i in range(instance.num_requests):
        t = int(start_model[i])
        loads[int(replica[i]), t:t + int(tables.dur[i])] += tables.contrib[i]
        running[t:t + int(tables.dur[i])] += 1
    values: dict = {var: float(replica[i] == g and start_model[i] == t) for (i, g, t), var in z.items()}
    named = prob.variablesDict()
    for k in range(tables.horizon):
        waits = bool(np.any((tables.first <= k) & (start_model > k)))
        for key, value in ((f"M_{k}", loads[:, k].max()), (f"w_{k}", waits), (f"y_{k}", running[k] > 0)):
            if key in named:
                values[named[key]] = float(value)
    return values


class _PulpClairvoyantSolver(BackendSolver):
    """Shared body of the PuLP clairvoyant solvers; ``backend`` is ``cbc``, ``highs`` or any
    PuLP solver name (:class:`ClairvoyantPulpSolver`)."""

    name: ClassVar[str]
    backend: str
    problem: ClassVar[str] = "clairvoyant"
    requires: ClassVar[tuple[str, ...]]

    def solve(self, instance: ClairvoyantInstance, *, time_limit_s: float = 30.0,
              gap_rel: float = 0.0, threads: int = 1, seed: int = 0,
              hint: tuple[NDArray, NDArray] | None = None, params: Mapping[str, str] | None = None,
              log_path: str | None = None, export: str | None = None) -> Solution:
        """Build the MILP, solve under the time limit. The MIP start is the better (under the
        model's objective) of the model's list schedule and ``hint`` (a decode-step schedule,
        used when it fits the model)."""
        if not isinstance(instance, ClairvoyantInstance):
            raise ValueError(f"{self.name} solves ClairvoyantInstance, got {type(instance).__name__}")
        check_solve_args(time_limit_s, gap_rel, threads)
        t0 = time.perf_counter()
        prob, z, tab = build_clairvoyant_milp(instance)
        unit = instance.step_a if instance.step_a > 0 else instance.step_b * tab.q
        if export is not None:  # objective in the instance's units, constant included
            if instance.objective == "imbalance":
                export_pulp(prob, export, scale=instance.num_replicas, constant=-tab.total)
            else:
                export_pulp(prob, export, scale=unit)
        incumbent = model_incumbent(instance, tab, hint)
        warm = mip_start(prob, z, instance, tab, *incumbent) if incumbent is not None else None
        try:
            status, raw, message = solve_pulp(prob, self.backend, time_limit_s=time_limit_s,
                                              gap_rel=gap_rel, threads=threads, seed=seed,
                                              warm_start=warm, params=params, log_path=log_path)
        except ValueError as exc:
            if "infeasible" not in str(exc):
                raise
            raise ValueError(
                "the clairvoyant instance is infeasible: no schedule finishes every request "
                f"within {tab.horizon} model steps"
                f"{' without idling' if instance.work_conserving else ''}") from None
        n = instance.num_requests
        replica = np.full(n, -1, dtype=np.int64)
        start = np.full(n, -1, dtype=np.int64)
        value = float("nan")
        info: dict = {"model_steps": tab.horizon}
        if status in ("optimal", "feasible"):
            start_model = np.zeros(n, dtype=np.int64)
            for (i, g, t), var in z.items():
                if (var.value() or 0.0) > 0.5:
                    replica[i], start_model[i] = g, t
            info["model_objective"] = coarse_objective(instance, tab, replica, start_model)
            replica, start = decode_step_schedule(instance, replica, start_model * tab.q)
            value = evaluate_schedule(instance, replica, start)["objective"]
        if instance.objective == "imbalance":
            bound = instance.num_replicas * raw - tab.total
        else:
            bound = raw * unit
        info["model_bound"] = float(bound)
        if tab.q > 1:
            bound = float("nan")
            message = (message + "; " if message else "") + COARSE_MESSAGE.format(q=tab.q)
        elif status == "optimal" and gap_rel == 0.0:
            bound = value
        return Solution(solver=self.name, status=status, sense="min", objective=value,
                        bound=bound, wall_s=time.perf_counter() - t0, replica=replica,
                        start=start, message=message, info=info)


class ClairvoyantCbcSolver(_PulpClairvoyantSolver):
    """Clairvoyant time-indexed MILP solved by CBC through PuLP."""

    name = "clairvoyant-cbc"
    backend = "cbc"
    requires = PULP_BACKENDS["cbc"]


class ClairvoyantHighsSolver(_PulpClairvoyantSolver):
    """Clairvoyant time-indexed MILP solved by HiGHS through PuLP (needs ``highspy``)."""

    name = "clairvoyant-highs"
    backend = "highs"
    requires = PULP_BACKENDS["highs"]


class ClairvoyantPulpSolver(AnyPulpBackend, _PulpClairvoyantSolver):
    """Clairvoyant MILP on any solver PuLP knows (``get_solver("clairvoyant-pulp:SCIP_PY")``)."""

    name = "clairvoyant-pulp"
