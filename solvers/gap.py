"""Optimality gaps: online policies next to the exact optimum (or its bound) on the same instances.

Rows are plain dicts (one per instance × policy), so they go straight to CSV; :func:`summarize`
aggregates them per policy. Relative gap of a heuristic value h against the reference r (the
optimum, or the best bound when the solver stopped early — then the gap is an upper bound):
``(r − h)/max(|r|, 1)`` for the F objective (maximised), ``(h − r)/max(|r|, 1)`` otherwise.
Tick rows also carry ``capacity_gap`` = |r − h| / (G·M): the gap as a share of the barrier's
token capacity at the start of the tick, which stays meaningful when the optimum I* is ≈ 0.

Budgets are deterministic (:func:`deterministic_budget`): a time limit of t seconds is a solver
work limit (CP-SAT deterministic seconds, HiGHS / CBC branch-and-bound nodes, local-search
neighbours), with the wall clock only as a safety cap, so the same command gives the same
numbers on a busy or a quiet machine (a row says ``wall_capped`` when the cap bound instead).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import get_solver
from .base import OPTIMAL
from .instances import ClairvoyantInstance, TickInstance

__all__ = ["clairvoyant_gap_rows", "deterministic_budget", "heuristic_gap", "summarize",
           "tick_gap_rows"]

Progress = Callable[[], None] | None

#: The wall-clock safety cap of a deterministic budget of t seconds: ``WALL_CAP_FACTOR`` · t.
WALL_CAP_FACTOR = 20.0
#: CP-SAT deterministic seconds per budget second (about a quiet core's wall second; on the
#: shared 2-core box under load a deterministic second took 5-9 wall seconds).
CPSAT_DETERMINISTIC_PER_SECOND = 0.5
#: HiGHS / CBC branch-and-bound nodes per budget second (their deterministic work limit).
NODES_PER_SECOND = 200
#: Local-search neighbours per budget second (one neighbour: a repair and an exact evaluation).
POLISH_ITERS_PER_SECOND = 100


def deterministic_budget(solver: str, budget_s: float, threads: int,
                         params: dict[str, str] | None = None) -> tuple[dict[str, str], float]:
    """Backend parameters that stop ``solver`` after a fixed amount of work worth ``budget_s``
    seconds, and the wall-clock safety cap (``WALL_CAP_FACTOR`` · ``budget_s``) to pass as its
    ``time_limit_s``. CP-SAT: ``max_deterministic_time`` = ``CPSAT_DETERMINISTIC_PER_SECOND`` ·
    ``budget_s`` (its deterministic seconds; with ``threads > 1`` also ``interleave_search``,
    CP-SAT's deterministic parallel mode);
    HiGHS ``mip_max_nodes`` / CBC ``maxNodes`` = ``NODES_PER_SECOND`` · ``budget_s`` (one thread
    and a fixed seed make both deterministic); other PuLP solvers and the brute force: none
    (wall clock only). ``params`` (the user's) override these."""
    if not (math.isfinite(budget_s) and budget_s > 0):
        raise ValueError(f"{budget_s=} must be a finite number > 0")
    backend = solver.rsplit("-", 1)[-1]
    nodes = str(max(1, round(NODES_PER_SECOND * budget_s)))
    knobs: dict[str, str] = {}
    if backend == "cpsat":
        knobs["max_deterministic_time"] = f"{CPSAT_DETERMINISTIC_PER_SECOND * budget_s:g}"
        if threads > 1:
            knobs["interleave_search"] = "true"
    elif backend == "highs":
        knobs["mip_max_nodes"] = nodes
    elif backend == "cbc":
        knobs["maxNodes"] = nodes
    return {**knobs, **(params or {})}, WALL_CAP_FACTOR * budget_s


def heuristic_gap(value: float, reference: float, sense: str) -> float:
    """Relative gap of heuristic ``value`` to ``reference`` (≥ 0 when the reference is right)."""
    if not (math.isfinite(value) and math.isfinite(reference)):
        return math.nan
    diff = reference - value if sense == "max" else value - reference
    return diff / max(abs(reference), 1.0)


def _solver_options(options: dict[str, Any] | None, name: str, log_dir: str | None,
                    export_dir: str | None) -> dict[str, Any]:
    """Per-instance keyword arguments for ``solve``: user parameters, a log file and an export
    stem named after the instance."""
    out = dict(options or {})
    if log_dir:
        out["log_path"] = str(Path(log_dir) / f"{name}.log")
    if export_dir:
        out["export"] = str(Path(export_dir) / name)
    return out


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def tick_gap_rows(
    instances: Sequence[TickInstance], *, policies: Iterable[str] = ("br0",),
    solver: str = "tick-cpsat", time_limit_s: float = 10.0, gap_rel: float = 0.0,
    threads: int = 1, seed: int = 0, lp_bound: bool = True, progress: Progress = None,
    params: dict[str, str] | None = None, log_dir: str | None = None,
    export_dir: str | None = None,
) -> list[dict[str, Any]]:
    """Solve every tick exactly and score each policy's decision under the same objective."""
    from .bounds import tick_lp_bound, tick_trivial_bound
    from .tick_eval import policy_tick, tick_objective

    oracle = get_solver(solver)
    names = list(policies)
    budget, cap = deterministic_budget(solver, time_limit_s, threads, params)
    rows: list[dict[str, Any]] = []
    for k, inst in enumerate(instances):
        label = inst.name or f"tick{k}"
        opts = _solver_options({"params": budget} if budget else None, _safe(f"{k:03d}-{label}"),
                               log_dir, export_dir)
        sol = oracle.solve(inst, time_limit_s=cap, gap_rel=gap_rel, threads=threads,
                           seed=seed, **opts)
        proven = sol.status == OPTIMAL
        reference = sol.objective if proven else sol.bound
        lp = tick_lp_bound(inst) if lp_bound else math.nan
        base = {
            "instance": label, "mode": "tick", "objective": inst.objective,
            "replicas": inst.num_replicas, "pool": inst.pool_size,
            "free_slots": int(inst.free_slots.sum()), "placed": inst.required[1],
            "solver": solver, "status": sol.status, "optimum": sol.objective, "bound": sol.bound,
            "solver_gap": sol.gap, "solve_s": sol.wall_s, "wall_capped": _capped(sol.wall_s, cap),
            "lp_bound": lp,
            "trivial_bound": tick_trivial_bound(inst),
            "reference": "optimum" if proven else "bound",
            "reference_value": reference, "sense": inst.sense,
            "pre_imbalance": float(inst.num_replicas * inst.loads.max() - inst.loads.sum()),
            "message": sol.message,
        }
        capacity = max(inst.num_replicas * float(inst.loads.max()), 1.0)
        for name in names:
            replica = policy_tick(inst, name, seed=seed) if name != "br0" else policy_tick(inst)
            value = tick_objective(inst, replica)
            gap = heuristic_gap(value, reference, inst.sense)
            abs_gap = gap * max(abs(reference), 1.0) if math.isfinite(gap) else math.nan
            rows.append({**base, "policy": name, "heuristic": value, "abs_gap": abs_gap,
                         "rel_gap": gap, "capacity_gap": abs_gap / capacity,
                         "beats_optimum": bool(proven and gap < -1e-9)})
        if progress is not None:
            progress()
    return rows


def clairvoyant_gap_rows(
    instances: Sequence[ClairvoyantInstance], *, policies: Iterable[str] = ("br0",),
    solver: str = "clairvoyant-cpsat", time_limit_s: float = 60.0, gap_rel: float = 0.0,
    threads: int = 1, seed: int = 0, lp_bound: bool = False, progress: Progress = None,
    params: dict[str, str] | None = None, log_dir: str | None = None,
    export_dir: str | None = None, relaxation: str = "auto",
    bound_time_limit_s: float | None = None, polish_iters: int | None = None,
    bound_requests: int | None = None,
) -> list[dict[str, Any]]:
    """Simulate each policy on each episode, then find the best work-conserving schedule within
    a budget of ``time_limit_s`` (deterministic: :func:`deterministic_budget`): two thirds for
    the exact model (hinted / MIP-started with the best policy's schedule; coarsened schedules
    repaired to be work-conserving per decode step), one third for a local search from the
    better of the two (``polish_iters`` neighbours, default ``POLISH_ITERS_PER_SECOND`` per
    second of that third; 0: none). The
    proven lower bound is the best of the solver's (q = 1), the LP relaxation (``lp_bound``),
    the closed form and the relaxations named by ``relaxation`` (``aggregate``, ``partition``,
    ``migration``, ``both``, ``all``, ``none``; ``auto``: see :func:`_relaxations`), CP-SAT
    ones within ``bound_time_limit_s`` each (default ``time_limit_s``); ``binding`` keeps the
    ``bound_requests`` largest requests bound for life (default ``BOUND_REQUESTS``);
    ``bound_method`` names the winner.
    Policies' gaps are against the best schedule (``rel_gap``) and the bound (``gap_to_bound``)."""
    from .aggregate_bound import aggregate_bound
    from .binding_bound import BOUND_REQUESTS, binding_bound
    from .bounds import clairvoyant_lp_bound, clairvoyant_trivial_bound
    from .bridge import simulate_schedule
    from .incumbent import improve_schedule
    from .migration import METHOD as MIGRATION_DP
    from .migration import PARTIAL_METHOD, dp_fits, migration_bound_dp, partial_binding_dp

    tied = BOUND_REQUESTS if bound_requests is None else bound_requests

    oracle = get_solver(solver)
    names = list(policies)
    rows: list[dict[str, Any]] = []
    for k, inst in enumerate(instances):
        label = inst.name or f"episode{k}"
        stem = _safe(f"{k:03d}-{label}")
        runs = {name: simulate_schedule(inst, name, seed=seed) for name in names}
        best = min(runs.values(), key=lambda r: r.metrics["objective"]) if runs else None
        budget, cap = deterministic_budget(solver, time_limit_s * 2 / 3, threads, params)
        opts = _solver_options({"params": budget} if budget else None, stem, log_dir, export_dir)
        if best is not None:
            opts["hint"] = (best.replica, best.start)
        sol = oracle.solve(inst, time_limit_s=cap, gap_rel=gap_rel,
                           threads=threads, seed=seed, **opts)
        capped = _capped(sol.wall_s, cap)
        proven = sol.status == OPTIMAL and inst.step == 1
        candidates = [(sol.objective, sol.replica, sol.start)] if sol.has_solution else []
        if best is not None:
            candidates.append((best.metrics["objective"], best.replica, best.start))
        if not candidates:
            raise ValueError(f"{label}: no schedule found (no policy and no solver incumbent)")
        value, replica, start = min(candidates, key=lambda c: c[0])
        polished = value
        iters = (round(POLISH_ITERS_PER_SECOND * time_limit_s / 3) if polish_iters is None
                 else polish_iters)
        if not proven and iters > 0:
            polish_cap = WALL_CAP_FACTOR * time_limit_s / 3
            t0 = time.perf_counter()
            replica, start, polished = improve_schedule(
                inst, replica, start, max_iters=iters, time_limit_s=polish_cap, seed=seed)
            capped = capped or _capped(time.perf_counter() - t0, polish_cap)
        reference = min(value, polished)
        bounds = {"solver": sol.bound if inst.step == 1 else math.nan,
                  "lp": clairvoyant_lp_bound(inst) if lp_bound and inst.step == 1 else math.nan,
                  "closed form": clairvoyant_trivial_bound(inst)}
        relaxed = [] if proven else _relaxations(relaxation, inst)
        agg = None
        for which in relaxed:
            if which == "binding":
                k_bound = min(tied, inst.num_requests)
                exact = partial_binding_dp(inst, k_bound) if dp_fits(inst) else None
                if exact is not None:
                    bounds[PARTIAL_METHOD.format(k=k_bound)] = exact
                elif relaxation == "auto":  # the DP gave up: the migration DP, or CP-SAT
                    relaxed += ["migration"]
                elif inst.objective == "imbalance":
                    budget_b, cap_b = deterministic_budget(
                        "cpsat", bound_time_limit_s or time_limit_s, threads)
                    res = binding_bound(inst, k=k_bound, time_limit_s=cap_b, threads=threads,
                                        seed=seed, hint=(replica, start), params=budget_b,
                                        **_solver_options(None, f"{stem}-binding", log_dir,
                                                          export_dir))
                    capped = capped or _capped(res.wall_s, cap_b)
                    bounds[res.method] = res.bound
                continue
            if which == "migration" and dp_fits(inst):
                exact = migration_bound_dp(inst)
                if exact is not None:
                    bounds[MIGRATION_DP] = exact
                    continue
                if relaxation == "auto":  # the DP gave up: the cheaper CP-SAT relaxations
                    relaxed += ["aggregate", "partition"]
                    continue
            bound_budget, bound_cap = deterministic_budget(
                "cpsat", bound_time_limit_s or time_limit_s, threads)
            agg = aggregate_bound(inst, time_limit_s=bound_cap, threads=threads, seed=seed,
                                  hint=start, relaxation=which, params=bound_budget,
                                  **_solver_options(None, f"{stem}-{which}", log_dir, export_dir))
            capped = capped or _capped(agg.wall_s, bound_cap)
            bounds[agg.method] = agg.bound
        ceilings = _ceilings(inst, replica, start, min(tied, inst.num_requests))
        finite = {m: b for m, b in bounds.items() if math.isfinite(b)}
        method = max(finite, key=lambda m: finite[m]) if finite else "none"
        lower = finite.get(method, math.nan)
        if not lower > 0:
            method = f"none above 0 (tried: {', '.join(finite) or 'nothing'})"
        if proven:
            lower, method = reference, "solver (proven optimal)"
        base = {
            "instance": label, "mode": "clairvoyant",
            "objective": inst.objective, "replicas": inst.num_replicas, "slots": inst.slots,
            "requests": inst.num_requests, "step": inst.step, "model_steps": inst.model_horizon,
            "solver": solver, "status": sol.status, "optimum": reference,
            "solver_objective": sol.objective, "bound": float(lower), "bound_method": method,
            "bound_share": float(lower / reference) if reference > 0 else math.nan,
            "solver_gap": sol.gap, "solve_s": sol.wall_s, "wall_capped": capped,
            "aggregate_status": agg.status if agg else "",
            "aggregate_s": agg.wall_s if agg else 0.0,
            "model_objective": sol.info.get("model_objective", math.nan),
            "model_bound": sol.info.get("model_bound", math.nan), "lp_bound": bounds["lp"],
            **{f"ceiling_{name}": value for name, value in ceilings.items()},
            "reference": "optimum" if proven else "best schedule found",
            "reference_value": reference, "sense": "min", "message": sol.message,
        }
        for name, run in runs.items():
            h = run.metrics["objective"]
            gap = heuristic_gap(h, reference, "min")
            rows.append({**base, "policy": name, "heuristic": h,
                         "makespan": run.metrics["makespan"],
                         "abs_gap": h - reference, "rel_gap": gap,
                         "gap_to_bound": heuristic_gap(h, float(lower), "min"),
                         "beats_optimum": bool(proven and gap < -1e-9)})
        if progress is not None:
            progress()
    return rows


def _capped(wall_s: float, cap_s: float) -> bool:
    """True when a run took (nearly) its whole wall-clock cap: the cap, not the deterministic
    budget, stopped it, so its result may depend on machine load."""
    return wall_s >= 0.98 * cap_s


#: Largest G·B for which the migration relaxation's value at a schedule is computed (its
#: per-step exact partition is a branch and bound over the active requests).
CEILING_MAX_SLOTS = 24


def _ceilings(inst: ClairvoyantInstance, replica: Any, start: Any, k: int) -> dict[str, float]:
    """Each relaxation's value at the best schedule found: the most it could ever prove here
    (``aggregate_bound.relaxation_at_schedule``; ``binding_exact``: the partial-binding
    relaxation's, ``migration.partial_binding_at_schedule``; ``binding``: its fluid CP-SAT
    model's, ``binding_bound.binding_at_schedule``, imbalance only); ``nan`` for the migration
    and the exact partial-binding ones past ``CEILING_MAX_SLOTS`` slots."""
    from .aggregate_bound import RELAXATIONS, relaxation_at_schedule
    from .binding_bound import binding_at_schedule
    from .migration import partial_binding_at_schedule

    big = inst.num_replicas * inst.slots > CEILING_MAX_SLOTS
    out = {name: math.nan if name == "migration" and big
           else relaxation_at_schedule(inst, start, name) for name in RELAXATIONS}
    out["binding_exact"] = math.nan if big else partial_binding_at_schedule(inst, replica, start, k)
    out["binding"] = (binding_at_schedule(inst, replica, start, k)
                      if inst.objective == "imbalance" else math.nan)
    return out


#: ``--relaxation`` choices besides ``auto`` and the relaxations they run.
RELAXATION_CHOICES = {"none": [], "aggregate": ["aggregate"], "partition": ["partition"],
                      "migration": ["migration"], "binding": ["binding"],
                      "both": ["aggregate", "migration"],
                      "all": ["aggregate", "partition", "migration", "binding"]}


def _relaxations(relaxation: str, inst: ClairvoyantInstance) -> list[str]:
    """Which relaxations bound this episode. ``migration`` is solved by the exact DP when it
    fits (``migration.dp_fits``), else by CP-SAT; ``binding`` (the K largest requests bound
    for life) by the partial-binding DP when it fits, else by its fluid CP-SAT model
    (``binding_bound``); ``auto`` is the partial-binding DP alone when it fits (it dominates
    the migration DP, which it falls back to when it gives up, and the other two), else the
    aggregated and the pigeonhole-cut ones (a stronger model can still end with a weaker
    proven bound when its time runs out)."""
    from .migration import dp_fits

    if relaxation == "auto":
        return ["binding"] if dp_fits(inst) else ["aggregate", "partition"]
    if relaxation not in RELAXATION_CHOICES:
        raise ValueError(f"relaxation={relaxation!r} must be one of auto, "
                         f"{', '.join(RELAXATION_CHOICES)}")
    return list(RELAXATION_CHOICES[relaxation])


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per policy: instances, mean / median / worst relative gap (the mean of ratios) and
    ``sum_rel_gap`` = (Σ heuristic − Σ reference)/Σ|reference| (the ratio of sums, sign flipped
    for maximisation; robust to instances whose reference is ≈ 0), share of instances where the
    policy is optimal (gap ≤ 1e-9), absolute and capacity gaps, solve times, how many
    references were proven and how many times the policy beat a proven optimum (must be 0)."""
    out = []
    for name in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == name]
        gaps = np.array([r["rel_gap"] for r in mine], dtype=float)
        ok = gaps[np.isfinite(gaps)]
        cap = np.array([r.get("capacity_gap", math.nan) for r in mine], dtype=float)
        pairs = np.array([(r["heuristic"], r["reference_value"]) for r in mine], dtype=float)
        pairs = pairs[np.isfinite(pairs).all(axis=1)]
        sign = -1.0 if mine[0].get("sense") == "max" else 1.0
        denom = float(np.abs(pairs[:, 1]).sum()) if pairs.size else 0.0
        out.append({
            "policy": name, "instances": len(mine),
            "proven": sum(r["reference"] == "optimum" for r in mine),
            "mean_rel_gap": float(ok.mean()) if ok.size else math.nan,
            "sum_rel_gap": (sign * float((pairs[:, 0] - pairs[:, 1]).sum()) / denom
                            if denom > 0 else math.nan),
            "median_rel_gap": float(np.median(ok)) if ok.size else math.nan,
            "worst_rel_gap": float(ok.max()) if ok.size else math.nan,
            "share_optimal": float((ok <= 1e-9).mean()) if ok.size else math.nan,
            "mean_abs_gap": float(np.nanmean([r["abs_gap"] for r in mine])),
            "worst_abs_gap": float(np.nanmax([r["abs_gap"] for r in mine])),
            "mean_solve_s": float(np.mean([r["solve_s"] for r in mine])),
            "max_solve_s": float(np.max([r["solve_s"] for r in mine])),
            "violations": sum(bool(r["beats_optimum"]) for r in mine),
            "mean_capacity_gap": float(np.nanmean(cap)) if np.isfinite(cap).any() else math.nan,
            "worst_capacity_gap": float(np.nanmax(cap)) if np.isfinite(cap).any() else math.nan,
        })
    return out
