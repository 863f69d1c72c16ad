"""A lower bound that keeps part of the binding: the K largest requests are bound to one replica
for life, the others relaxed to a fluid fill (the *partial-binding relaxation*, solved by CP-SAT).

Relaxations that let every request migrate (``aggregate_bound``, ``migration``) cannot certify
more than 45 % of the best schedule on the README's 32-request slice: binding the big prompts
for life is what costs the rest (``papers/optimality.md``). This model keeps that binding for
the set 𝒦 of the K largest prompts and relaxes the other requests (the set ℱ) to a fluid:

    x_{i,g,t} ∈ {0,1}, i ∈ 𝒦        i starts at decode step t on replica g (request of rank r
                                     uses replicas g ≤ r: identical, empty replicas)
    β_g(k), n_g(k)                   the bound load and bound count of replica g at step k
    n_g(k) ≤ B                       slots
    M_b(k) ≥ β_g(k)  ∀g              the bound envelope
    0 ≤ f_g(k) ≤ u(n_g(k))           fluid fill of replica g: at most B − n_g(k) requests of ℱ,
                                     so at most the B − n_g(k) largest final loads s_j + o_j − 1
    Σ_{g,k} f_g(k) ≤ C_ℱ             the fill is at most ℱ's total load Σ_{j∈ℱ} Σ_a (s_j + a)
    e_g(k) ≥ M_b(k) − β_g(k) − f_g(k), e_g(k) ≥ 0
    min Σ_{g,k} e_g(k)

*Validity.* In any bound-for-life work-conserving schedule (or any schedule of the partial-
binding relaxation, where ℱ may be re-partitioned at every step), step k's imbalance is
I(k) = Σ_g (M(k) − β_g(k) − φ_g(k)) with φ_g(k) ℱ's load on g; every term is ≥ 0 and
M(k) ≥ M_b(k), so I(k) ≥ Σ_g (M_b(k) − β_g(k) − φ_g(k))_+. Setting f_g(k) = φ_g(k) is feasible
(φ_g(k) sums at most B − n_g(k) loads of ℱ, each ≤ its final load; Σ φ = C_ℱ), so the model's
optimum, and CP-SAT's proven bound on it, is ≤ Σ_k I(k) of every schedule. Start windows:
r_i ≤ t_i ≤ min(T − o_i, r_i + ⌊Σ_{j≠i} o_j / (G·B)⌋) (work conservation: while i waits, all G·B
slots are busy with other requests). u(n) is concave in n, so f ≤ u(n) is linear (its chords).

It needs no model of ℱ's starts, so it is small (K·G·T variables), but it does not dominate
the migration relaxation (ℱ is fluid); the imbalance objective only.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .cpsat_backend import export_cpsat, life_recurrence, run_cpsat
from .instances import ClairvoyantInstance

__all__ = ["BOUND_REQUESTS", "METHOD", "BindingBound", "binding_at_schedule", "binding_bound",
           "bound_requests", "fill_caps"]

#: How ``gap`` names this bound ({k}: how many requests are bound).
METHOD = "partial binding ({k} largest bound for life, fluid rest; CP-SAT)"

#: Default K: how many of the largest prompts stay bound for life.
BOUND_REQUESTS = 8


@dataclass(slots=True, kw_only=True)
class BindingBound:
    """``bound``: a proven lower bound on the clairvoyant optimum (``nan`` if CP-SAT proved
    nothing); ``relaxation``: the best value CP-SAT found for the model (≥ ``bound``);
    ``status``: CP-SAT's status name; ``bound_requests``: the bound set 𝒦; ``wall_s`` seconds."""

    bound: float
    relaxation: float
    status: str
    wall_s: float
    bound_requests: tuple[int, ...]

    @property
    def method(self) -> str:
        """:data:`METHOD` with K = the number of bound requests."""
        return METHOD.format(k=len(self.bound_requests))


def bound_requests(instance: ClairvoyantInstance, k: int) -> list[int]:
    """𝒦: the ``k`` requests with the largest prompts (ties: lower index), largest first."""
    if k < 0:
        raise ValueError(f"{k=} must be >= 0")
    order = sorted(range(instance.num_requests), key=lambda i: (-int(instance.prompt_len[i]), i))
    return order[:k]


def fill_caps(instance: ClairvoyantInstance, bound: list[int]) -> list[int]:
    """u(n), n = 0..B: the most fluid a replica holding n bound requests can take — the sum of
    the B − n largest final loads s_j + o_j − 1 of the requests not in ``bound``."""
    chosen = set(bound)
    finals = sorted((int(instance.prompt_len[j] + instance.output_len[j] - 1)
                     for j in range(instance.num_requests) if j not in chosen), reverse=True)
    return [sum(finals[:instance.slots - n]) for n in range(instance.slots + 1)]


def _start_windows(inst: ClairvoyantInstance, horizon: int) -> list[tuple[int, int]]:
    """[first, last] start step of every request (see the module docstring)."""
    o, r = inst.output_len.astype(np.int64), inst.release.astype(np.int64)
    cap = inst.num_replicas * inst.slots
    total = int(o.sum())
    out = []
    for i in range(inst.num_requests):
        last = horizon - int(o[i])
        if inst.work_conserving:
            last = min(last, int(r[i]) + (total - int(o[i])) // cap)
        out.append((int(r[i]), last))
    return out


def _fluid_total(inst: ClairvoyantInstance, bound: list[int]) -> int:
    """C_ℱ = Σ_{j∉𝒦} C_j: the free requests' total load (``ClairvoyantInstance.life_loads``)."""
    free = np.ones(inst.num_requests, dtype=bool)
    free[list(bound)] = False
    return int(inst.life_loads[free].sum())


def binding_bound(
    instance: ClairvoyantInstance, *, k: int = BOUND_REQUESTS, time_limit_s: float = 60.0,
    threads: int = 1, seed: int = 0, hint: tuple[NDArray, NDArray] | None = None,
    params: Mapping[str, str] | None = None, log_path: str | None = None,
    export: str | None = None,
) -> BindingBound:
    """Solve the partial-binding model of ``instance`` (decode-step resolution whatever its
    ``step``) with the ``k`` largest prompts bound; ``hint``: a schedule ``(replica, start)``
    in decode steps (e.g. the best found). Imbalance objective only (``ValueError`` otherwise)."""
    from ortools.sat.python import cp_model

    if instance.objective != "imbalance":
        raise ValueError("the partial-binding bound is for the imbalance objective only")
    t0 = time.perf_counter()
    inst = dataclasses.replace(instance, step=1)
    g_count, slots = inst.num_replicas, inst.slots
    horizon = inst.model_horizon
    kset = bound_requests(inst, min(k, inst.num_requests))
    caps = fill_caps(inst, kset)
    windows = _start_windows(inst, horizon)
    s, o = inst.prompt_len.astype(np.int64), inst.output_len.astype(np.int64)
    model = cp_model.CpModel()

    # Variables: x[(rank, g)][t] for bound requests (rank r may use replicas 0..min(r, G−1)).
    x: dict[tuple[int, int], dict[int, Any]] = {}
    for rank, i in enumerate(kset):
        first, last = windows[i]
        for g in range(min(rank + 1, g_count)):
            x[rank, g] = {t: model.new_bool_var(f"x_{i}_{g}_{t}") for t in range(first, last + 1)}
    counts: list[list[list[Any]]] = [[[] for _ in range(horizon)] for _ in range(g_count)]
    loads: list[list[list[Any]]] = [[[] for _ in range(horizon)] for _ in range(g_count)]
    for rank, i in enumerate(kset):
        # Every bound request starts exactly once, on one replica.
        model.add_exactly_one(v for g in range(min(rank + 1, g_count)) for v in x[rank, g].values())
        for g in range(min(rank + 1, g_count)):
            # Activity and load recurrences (start adds s_i, each step adds 1, the end
            # removes the last load s_i + o_i − 1).
            steps = range(windows[i][0], min(horizon, windows[i][1] + int(o[i])))
            for kk, a_k, l_k, _ in life_recurrence(model, x[rank, g], steps, int(s[i]),
                                                   int(o[i]), f"{i}_{g}"):
                counts[g][kk].append(a_k)
                loads[g][kk].append(l_k)
    top = int(slots * (s + o).max())
    excess = []
    fills = []
    for kk in range(horizon):
        if not any(counts[g][kk] for g in range(g_count)):
            continue  # no bound request can run at k: nothing to bound
        env = model.new_int_var(0, top, f"Mb_{kk}")
        for g in range(g_count):
            n_g = sum(counts[g][kk]) if counts[g][kk] else 0
            beta = sum(loads[g][kk]) if loads[g][kk] else 0
            # Slots; the bound envelope is at least every replica's bound load.
            if counts[g][kk]:
                model.add(n_g <= slots)
            model.add(env >= beta)
            fill = model.new_int_var(0, caps[0], f"f_{g}_{kk}")
            for n in range(slots):
                # The fill is at most u(n_g) (concave: below each chord).
                model.add(fill <= caps[n] + (caps[n + 1] - caps[n]) * (n_g - n))
            e = model.new_int_var(0, top, f"e_{g}_{kk}")
            # The replica's gap to the bound envelope that the fill does not cover.
            model.add(e >= env - beta - fill)
            excess.append(e)
            fills.append(fill)
    # The fill is at most the free requests' total load.
    model.add(sum(fills) <= _fluid_total(inst, kset))
    model.minimize(sum(excess))

    if hint is not None:
        h_rep, h_start = (np.asarray(a, dtype=np.int64) for a in hint)
        relabel: dict[int, int] = {}
        for i in kset:  # canonical labels: replicas in order of their largest bound request
            relabel.setdefault(int(h_rep[i]), len(relabel))
        for rank, i in enumerate(kset):
            for g in range(min(rank + 1, g_count)):
                for t, var in x[rank, g].items():
                    model.add_hint(var, int(relabel[int(h_rep[i])] == g and t == h_start[i]))
    if export is not None:
        export_cpsat(model, export)
    solver, code = run_cpsat(model, time_limit_s=time_limit_s, gap_rel=0.0, threads=threads,
                             seed=seed, params=params, log_path=log_path)
    if code == cp_model.INFEASIBLE:
        raise ValueError("the partial-binding relaxation is infeasible: so is the instance")
    value = float(solver.objective_value) if code in (cp_model.OPTIMAL, cp_model.FEASIBLE) else math.nan
    bound = (max(float(solver.best_objective_bound), 0.0)
             if code in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN) else math.nan)
    return BindingBound(bound=bound, relaxation=value, status=solver.status_name(code),
                        wall_s=time.perf_counter() - t0, bound_requests=tuple(kset))


def binding_at_schedule(instance: ClairvoyantInstance, replica: NDArray, start: NDArray,
                        k: int = BOUND_REQUESTS) -> float:
    """The model's least value at one schedule (its bound requests' replicas and starts, the
    best fluid fill: Σ d − min(C_ℱ, Σ min(d, u)) with d_g(k) = M_b(k) − β_g(k)): an upper bound
    on the model's optimum — the most it could prove — and at most the schedule's own Σ I."""
    inst = instance
    rep, st = np.asarray(replica, dtype=np.int64), np.asarray(start, dtype=np.int64)
    kset = bound_requests(inst, min(k, inst.num_requests))
    caps = fill_caps(inst, kset)
    s, o = inst.prompt_len.astype(np.int64), inst.output_len.astype(np.int64)
    g_count = inst.num_replicas
    gaps = 0
    fillable = 0
    for kk in range(int((st + o).max()) if len(st) else 0):
        beta = np.zeros(g_count, dtype=np.int64)
        n_g = np.zeros(g_count, dtype=np.int64)
        for i in kset:
            if st[i] <= kk < st[i] + o[i]:
                beta[rep[i]] += s[i] + kk - st[i]
                n_g[rep[i]] += 1
        if not n_g.any():
            continue
        d = beta.max() - beta
        gaps += int(d.sum())
        fillable += int(sum(min(int(d[g]), caps[min(int(n_g[g]), inst.slots)])
                            for g in range(g_count)))
    return float(gaps - min(_fluid_total(inst, kset), fillable))
