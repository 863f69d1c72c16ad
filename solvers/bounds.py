"""Bounds on the optimum that stay cheap when the exact models time out.

- :func:`tick_lp_bound`: the LP relaxation of the per-tick MILP (x ∈ [0,1]) in cvxpy, built once
  per shape with ``Parameter``s and re-solved for each instance.
- :func:`tick_trivial_bound`: closed-form bounds — Σ_g max_{0≤Δ≤Δ_g^max} F_g(Δ) for the F
  objective (each replica alone, Δ_g^max the sum of its f_g largest prompts), and
  G·max(M, ⌈(ΣL + Δ)/G⌉) − (ΣL + Δ) minimised over the feasible totals Δ for post-tick
  imbalance (the ceiling only when loads are integers: (G·M − ΣL − Δ)_+ otherwise).
- :func:`clairvoyant_lp_bound`: the LP relaxation of the time-indexed clairvoyant MILP (cvxpy,
  sparse matrices).
- :func:`clairvoyant_trivial_bound`: Σ_k I(k) ≥ G·max_i Σ_a (s_i + a) − Σ_i Σ_a (s_i + a): the
  replica hosting request i is the envelope's lower bound for its whole life.
Bounds are in the objective's sense: upper bounds for ``f_score`` (max), lower otherwise.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from .clairvoyant_eval import model_tables
from .instances import ClairvoyantInstance, TickInstance
from .pulp_backend import reset_highs_threads

__all__ = [
    "clairvoyant_lp_bound",
    "clairvoyant_trivial_bound",
    "tick_lp_bound",
    "tick_trivial_bound",
]


def _lp_solver() -> str | None:
    import cvxpy as cp

    if "HIGHS" in cp.installed_solvers():
        reset_highs_threads()
    return "HIGHS" if "HIGHS" in cp.installed_solvers() else None


@lru_cache(maxsize=32)
def _tick_lp(p_count: int, g_count: int, h1: int, objective: str) -> tuple[Any, dict[str, Any]]:
    """The parametrised tick LP for one shape: built once, re-solved with new values."""
    import cvxpy as cp

    # Data (parameters)
    par = {
        "s": cp.Parameter(p_count, nonneg=True),          # prompt lengths s_i
        "free": cp.Parameter(g_count, nonneg=True),       # free slots f_g
        "lo": cp.Parameter(nonneg=True),                  # fewest requests to place
        "hi": cp.Parameter(nonneg=True),                  # most requests to place
    }
    # Variables
    x = cp.Variable((p_count, g_count), nonneg=True)
    delta = par["s"] @ x
    # Each request at most once; slots; count (work conservation).
    cons = [cp.sum(x, axis=1) <= 1, cp.sum(x, axis=0) <= par["free"],
            cp.sum(x) >= par["lo"], cp.sum(x) <= par["hi"]]
    if objective == "f_score":
        par["s_gain"] = cp.Parameter(p_count, nonneg=True)  # α(1ᵀd)·s_i
        par["pen"] = cp.Parameter(h1, nonneg=True)          # β·d_h
        par["m"] = cp.Parameter((g_count, h1), nonneg=True)  # margins m_g(h)
        u = cp.Variable((g_count, h1), nonneg=True)
        # Hinges: u_gh ≥ Δ_g − m_g(h).
        cons.append(u >= cp.reshape(delta, (g_count, 1), order="C") @ np.ones((1, h1)) - par["m"])
        prob = cp.Problem(cp.Maximize(cp.sum(par["s_gain"] @ x) - cp.sum(u @ par["pen"])), cons)
    else:
        par["loads"] = cp.Parameter(g_count, nonneg=True)
        env = cp.Variable()
        # Envelope: M ≥ L_g + Δ_g.
        cons.append(env >= par["loads"] + delta)
        prob = cp.Problem(cp.Minimize(g_count * env - cp.sum(par["loads"]) - cp.sum(delta)), cons)
    return prob, par


def tick_lp_bound(instance: TickInstance) -> float:
    """The LP relaxation's optimum: ≥ the MILP optimum for ``f_score``, ≤ it for imbalance."""
    lo, hi = instance.required
    if hi == 0:
        from .tick_eval import tick_objective

        return tick_objective(instance, np.full(instance.pool_size, -1))
    prob, par = _tick_lp(instance.pool_size, instance.num_replicas, instance.d.shape[0],
                         instance.objective)
    s = instance.prompt_len.astype(np.float64)
    par["s"].value = s
    par["free"].value = instance.free_slots.astype(np.float64)
    par["lo"].value, par["hi"].value = float(lo), float(hi)
    if instance.objective == "f_score":
        par["s_gain"].value = instance.alpha * instance.d.sum() * s
        par["pen"].value = instance.beta * instance.d
        par["m"].value = instance.margins
    else:
        par["loads"].value = instance.loads
    prob.solve(solver=_lp_solver())
    if prob.status not in ("optimal", "optimal_inaccurate"):
        raise ValueError(f"tick LP relaxation ended with status {prob.status!r}")
    return float(prob.value)


def tick_trivial_bound(instance: TickInstance) -> float:
    """A closed-form bound (no solver), in the objective's sense."""
    lo, hi = instance.required
    if instance.objective == "f_score":
        # F_g is concave piecewise linear with breakpoints at the margins, so its maximum over
        # Δ ∈ [0, Δ_g^max] is at 0, at a margin inside the range, or at Δ_g^max = the sum of the
        # f_g largest prompts (F still rising past every margin when β < α). Each replica alone,
        # ignoring that requests are shared: an upper bound.
        from ..core.model import horizon_f_score

        desc = np.sort(instance.prompt_len.astype(np.float64))[::-1]
        total = 0.0
        for g in np.flatnonzero(instance.free_slots > 0):
            top = float(desc[: int(instance.free_slots[g])].sum())
            m = instance.margins[g]
            points = np.concatenate([[0.0, top], m[m <= top]])
            total += float(np.max(horizon_f_score(points, m, instance.d, instance.alpha,
                                                  float(instance.beta))))
        return total
    g_count = instance.num_replicas
    base, top = float(instance.loads.sum()), float(instance.loads.max())
    sizes = np.sort(instance.prompt_len.astype(np.float64))
    d_lo, d_hi = base + sizes[:lo].sum(), base + sizes[::-1][:hi].sum()

    if not np.array_equal(instance.loads, np.round(instance.loads)):
        # Fractional loads: the envelope is only ≥ max(M, total/G), so I ≥ (G·M − total)_+,
        # smallest at the largest total.
        return max(0.0, g_count * top - d_hi)

    def post(total: float) -> float:  # G·max(M, ⌈total/G⌉) − total: integer loads, integer M
        return g_count * max(top, math.ceil(total / g_count - 1e-9)) - total

    candidates = [d_lo, d_hi, min(max(g_count * top, d_lo), d_hi)]
    # Above G·M the bound is the distance to the next multiple of G: 0 if one is in range.
    first_mult = g_count * math.ceil(max(d_lo, g_count * top) / g_count)
    if first_mult <= d_hi:
        candidates.append(first_mult)
    return min(post(c) for c in candidates)


def clairvoyant_trivial_bound(instance: ClairvoyantInstance) -> float:
    """Σ_k I(k) ≥ max(0, G·max_i C_i − Σ_i C_i) with C_i = o_i s_i + o_i(o_i−1)/2 (imbalance);
    for ``step_time``: b·⌈max_i o_i⌉ + a·max(max_i C_i, Σ_i C_i / G)."""
    o = instance.output_len.astype(float)
    c = instance.life_loads.astype(float)
    if instance.objective == "imbalance":
        return max(0.0, instance.num_replicas * float(c.max()) - float(c.sum()))
    return instance.step_b * float(o.max()) + instance.step_a * max(float(c.max()),
                                                                    float(c.sum()) / instance.num_replicas)


def clairvoyant_lp_bound(instance: ClairvoyantInstance) -> float:
    """The LP relaxation of the time-indexed MILP (z ∈ [0,1], w, y ∈ [0,1]): a lower bound on the
    model optimum (exact lower bound on the true optimum when ``step`` = 1)."""
    import cvxpy as cp
    import scipy.sparse as sp

    # Data: the same variables z_{i,g,t} as the MILP, as sparse rows.
    tab = model_tables(instance)
    n, g_count, slots, horizon = (instance.num_requests, instance.num_replicas, instance.slots,
                                  tab.horizon)
    keys = [(i, g, t) for i in range(n) for g in range(min(i + 1, g_count)) for t in tab.starts(i)]
    nz = len(keys)
    once_r, once_c = [], []
    gk_r, gk_c, gk_v = [], [], []
    st_r, st_c, st_v = [], [], []
    for col, (i, g, t) in enumerate(keys):
        once_r.append(i)
        once_c.append(col)
        st_r.append(i)
        st_c.append(col)
        st_v.append(t)
        for e, c in enumerate(tab.contrib[i]):
            gk_r.append(g * horizon + t + e)
            gk_c.append(col)
            gk_v.append(float(c))
    once = sp.csr_matrix((np.ones(nz), (once_r, once_c)), shape=(n, nz))
    load = sp.csr_matrix((gk_v, (gk_r, gk_c)), shape=(g_count * horizon, nz))
    occupy = sp.csr_matrix((np.ones(len(gk_r)), (gk_r, gk_c)), shape=(g_count * horizon, nz))
    per_step = sp.vstack([sp.eye(horizon)] * g_count).tocsr()  # row (g, k) → k

    z = cp.Variable(nz, nonneg=True)
    env = cp.Variable(horizon, nonneg=True)
    # Each request once; slots; envelope above every replica's load.
    cons = [once @ z == 1, z <= 1, occupy @ z <= slots, load @ z <= per_step @ env]
    occ_k = per_step.T @ occupy  # (horizon, nz): requests running at step k
    if instance.work_conserving:
        # No idling (big-M form): start_i ≤ k + (last_i − k)·w_k and Σ running(k) ≥ G·B·w_k.
        w = cp.Variable(horizon, nonneg=True)
        start = sp.csr_matrix((st_v, (st_r, st_c)), shape=(n, nz))
        cons += [w <= 1, occ_k @ z >= g_count * slots * w]
        rows_i, rows_k = [], []
        for i in range(n):
            for k in range(int(tab.first[i]), int(tab.last[i])):
                rows_i.append(i)
                rows_k.append(k)
        if rows_i:
            pick_i = sp.csr_matrix((np.ones(len(rows_i)), (range(len(rows_i)), rows_i)),
                                   shape=(len(rows_i), n))
            big = np.array([int(tab.last[i]) - k for i, k in zip(rows_i, rows_k, strict=True)], dtype=float)
            pick_k = sp.csr_matrix((big, (range(len(rows_k)), rows_k)), shape=(len(rows_k), horizon))
            cons.append(pick_i @ start @ z <= np.array(rows_k, dtype=float) + pick_k @ w)
    if instance.objective == "imbalance":
        prob = cp.Problem(cp.Minimize(cp.sum(env)), cons)
        prob.solve(solver=_lp_solver())
        value = instance.num_replicas * float(prob.value) - tab.total
    else:
        busy = cp.Variable(horizon, nonneg=True)
        cons += [busy <= 1, occ_k @ z <= g_count * slots * busy]
        prob = cp.Problem(cp.Minimize(instance.step_b * tab.q * cp.sum(busy)
                                      + instance.step_a * cp.sum(env)), cons)
        prob.solve(solver=_lp_solver())
        value = float(prob.value)
    if prob.status not in ("optimal", "optimal_inaccurate"):
        raise ValueError(f"clairvoyant LP relaxation ended with status {prob.status!r}")
    return value
