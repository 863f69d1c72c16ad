"""Optimality gaps: online policies next to the exact optimum (or its bound) on the same instances.

Rows are plain dicts (one per instance × policy), so they go straight to CSV; :func:`summarize`
aggregates them per policy. Relative gap of a heuristic value h against the reference r (the
optimum, or the best bound when the solver stopped early — then the gap is an upper bound):
``(r − h)/max(|r|, 1)`` for the F objective (maximised), ``(h − r)/max(|r|, 1)`` otherwise.
Tick rows also carry ``capacity_gap`` = |r − h| / (G·M): the gap as a share of the barrier's
token capacity at the start of the tick, which stays meaningful when the optimum I* is ≈ 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from . import get_solver
from .base import OPTIMAL
from .instances import ClairvoyantInstance, TickInstance

__all__ = ["clairvoyant_gap_rows", "heuristic_gap", "summarize", "tick_gap_rows"]

Progress = Callable[[], None] | None


def heuristic_gap(value: float, reference: float, sense: str) -> float:
    """Relative gap of heuristic ``value`` to ``reference`` (≥ 0 when the reference is right)."""
    if not (math.isfinite(value) and math.isfinite(reference)):
        return math.nan
    diff = reference - value if sense == "max" else value - reference
    return diff / max(abs(reference), 1.0)


def tick_gap_rows(
    instances: Sequence[TickInstance], *, policies: Iterable[str] = ("br0",),
    solver: str = "tick-cpsat", time_limit_s: float = 10.0, gap_rel: float = 0.0,
    threads: int = 1, seed: int = 0, lp_bound: bool = True, progress: Progress = None,
) -> list[dict[str, Any]]:
    """Solve every tick exactly and score each policy's decision under the same objective."""
    from .bounds import tick_lp_bound, tick_trivial_bound
    from .tick_eval import policy_tick, tick_objective

    oracle = get_solver(solver)
    names = list(policies)
    rows: list[dict[str, Any]] = []
    for k, inst in enumerate(instances):
        sol = oracle.solve(inst, time_limit_s=time_limit_s, gap_rel=gap_rel, threads=threads,
                           seed=seed)
        proven = sol.status == OPTIMAL
        reference = sol.objective if proven else sol.bound
        lp = tick_lp_bound(inst) if lp_bound else math.nan
        base = {
            "instance": inst.name or f"tick{k}", "mode": "tick", "objective": inst.objective,
            "replicas": inst.num_replicas, "pool": inst.pool_size,
            "free_slots": int(inst.free_slots.sum()), "placed": inst.required[1],
            "solver": solver, "status": sol.status, "optimum": sol.objective, "bound": sol.bound,
            "solver_gap": sol.gap, "solve_s": sol.wall_s, "lp_bound": lp,
            "trivial_bound": tick_trivial_bound(inst),
            "reference": "optimum" if proven else "bound",
            "pre_imbalance": float(inst.num_replicas * inst.loads.max() - inst.loads.sum()),
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
) -> list[dict[str, Any]]:
    """Simulate each policy on each episode, solve the clairvoyant model (hinted with the best
    policy's schedule) and compare Σ_k I(k) (or Σ τ) at decode-step resolution."""
    from .bounds import clairvoyant_lp_bound, clairvoyant_trivial_bound
    from .bridge import simulate_schedule

    oracle = get_solver(solver)
    names = list(policies)
    rows: list[dict[str, Any]] = []
    for k, inst in enumerate(instances):
        runs = {name: simulate_schedule(inst, name, seed=seed) for name in names}
        best = min(runs.values(), key=lambda r: r.metrics["objective"]) if runs else None
        kwargs: dict[str, Any] = {}
        if best is not None and solver == "clairvoyant-cpsat":
            kwargs["hint"] = (best.replica, best.start)
        sol = oracle.solve(inst, time_limit_s=time_limit_s, gap_rel=gap_rel, threads=threads,
                           seed=seed, **kwargs)
        proven = sol.status == OPTIMAL and inst.step == 1
        lp = clairvoyant_lp_bound(inst) if lp_bound and inst.step == 1 else math.nan
        lower = np.nanmax([sol.bound, lp, clairvoyant_trivial_bound(inst)])
        base = {
            "instance": inst.name or f"episode{k}", "mode": "clairvoyant",
            "objective": inst.objective, "replicas": inst.num_replicas, "slots": inst.slots,
            "requests": inst.num_requests, "step": inst.step, "model_steps": inst.model_horizon,
            "solver": solver, "status": sol.status, "optimum": sol.objective,
            "bound": float(lower), "solver_gap": sol.gap, "solve_s": sol.wall_s,
            "model_objective": sol.info.get("model_objective", math.nan),
            "model_bound": sol.info.get("model_bound", math.nan), "lp_bound": lp,
            "reference": "optimum" if proven else "best schedule found",
        }
        for name, run in runs.items():
            value = run.metrics["objective"]
            gap = heuristic_gap(value, sol.objective, "min")
            rows.append({**base, "policy": name, "heuristic": value,
                         "makespan": run.metrics["makespan"],
                         "abs_gap": value - sol.objective, "rel_gap": gap,
                         "gap_to_bound": heuristic_gap(value, float(lower), "min"),
                         "beats_optimum": bool(proven and gap < -1e-9)})
        if progress is not None:
            progress()
    return rows


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per policy: instances, mean / median / worst relative gap, share of instances where the
    policy is optimal (gap ≤ 1e-9), absolute and capacity gaps, solve times, how many
    references were proven and how many times the policy beat a proven optimum (must be 0)."""
    out = []
    for name in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == name]
        gaps = np.array([r["rel_gap"] for r in mine], dtype=float)
        ok = gaps[np.isfinite(gaps)]
        cap = np.array([r.get("capacity_gap", math.nan) for r in mine], dtype=float)
        out.append({
            "policy": name, "instances": len(mine),
            "proven": sum(r["reference"] == "optimum" for r in mine),
            "mean_rel_gap": float(ok.mean()) if ok.size else math.nan,
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
