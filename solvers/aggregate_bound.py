"""A lower bound on the clairvoyant optimum that survives replica symmetry: the aggregated
replica-free model, solved by CP-SAT at decode-step resolution.

Why the time-indexed model's bound is 0 (``papers/optimality.md``): spreading each request's
start evenly over the G identical replicas is LP-feasible with every replica at the mean load.
The *migration relaxation* drops the replica binding instead (active requests may be
re-partitioned among the replicas at every step; start times and work conservation stay
decisions), and this model relaxes it once more by letting the partition be fractional except
for whole requests — the envelope of a step is then McNaughton's preemptive makespan,
max(largest active load, mean load):

    x_{i,t} ∈ {0,1}                        request i starts at decode step t ∈ [r_i, T − o_i]
    a_i(k), ℓ_i(k)                         i active at k, its load s_i + (k − t_i) (0 if not)
    M(k) ≥ ℓ_i(k)  ∀i                      a replica holds every active request whole
    G·M(k) ≥ Σ_i ℓ_i(k)                    the envelope is at least the mean load
    Σ_i a_i(k) ≤ G·B                       slots
    Σ_i a_i(k) ≥ G·B·w_k,  1 − S_i(k) ≤ w_k   work conservation (S_i(k): i started by k)
    min G·Σ_k M(k) − C   (or Σ_k b·y_k + a·M(k) for step_time)

Every bound-for-life, work-conserving schedule is feasible here with M(k) its own envelope
(integer, ≥ every active load, ≥ the mean), so the optimum — and CP-SAT's proven bound on it,
whenever it stops — is a lower bound on the true clairvoyant optimum. a and ℓ are kept linear
by recurrences over k (a_i(k) = a_i(k−1) + x_{i,k} − x_{i,k−o_i}, and the same for ℓ), so the
model has O(n·T) small constraints and no replica index.
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

from .clairvoyant_eval import pooled_steps
from .cpsat_backend import export_cpsat, life_recurrence, run_cpsat
from .instances import ClairvoyantInstance
from .scaling import step_time_weights

__all__ = ["METHODS", "RELAXATIONS", "AggregateBound", "aggregate_bound", "relaxation_at_schedule"]

#: How ``gap`` names each relaxation's bound.
METHODS = {"aggregate": "aggregated replica-free relaxation (CP-SAT)",
           "partition": "aggregated relaxation with pigeonhole cuts (CP-SAT)",
           "migration": "migration relaxation (CP-SAT)"}

#: The relaxations :func:`aggregate_bound` solves, weakest first.
RELAXATIONS = tuple(METHODS)


@dataclass(slots=True, kw_only=True)
class AggregateBound:
    """``bound``: a proven lower bound on the clairvoyant optimum (``nan`` if CP-SAT proved
    nothing); ``relaxation``: the best value CP-SAT found for the relaxed model (≥ ``bound``);
    ``status``: CP-SAT's status name; ``wall_s`` seconds."""

    bound: float
    relaxation: float
    status: str
    wall_s: float
    method: str = METHODS["aggregate"]


def _pigeonhole(model: Any, k: int, active: list, loads: list, tops: list, env: Any,
                prompts: list[int], g_count: int, slots: int) -> None:
    """Partition cuts without replica variables at step k (valid for every split of the active
    requests into G parts of at most B, so for the migration relaxation too):

    (P1) threshold: the N_θ active requests with prompt ≥ θ have loads ≥ θ, and some part holds
         ⌈N_θ/G⌉ of them: M(k) ≥ θ·⌈N_θ/G⌉ (for every θ shared by more than G prompts);
    (P2) fullest part: some part holds ⌈n_k/G⌉ requests, each ≥ μ(k), the least active load:
         M(k) ≥ μ(k)·⌈n_k/G⌉;
    (P3) capacity: the other G − 1 parts hold at most (G − 1)·B requests, so the part of any
         active i also holds at least e(k) = n_k − (G − 1)·B − 1 others, each ≥ μ(k):
         M(k) ≥ ℓ_i(k) + μ(k)·max(0, e(k)).
    """
    count = len(active)
    if count == 0:
        return
    top = max(tops)
    n_k = model.new_int_var(0, count, f"n_{k}")
    model.add(n_k == sum(active))
    for theta in sorted(set(prompts)):
        members = [a for a, p in zip(active, prompts, strict=True) if p >= theta]
        if len(members) <= g_count:
            continue  # ⌈N/G⌉ ≤ 1: already M ≥ every load
        z = model.new_int_var(0, slots, f"z_{k}_{theta}")
        model.add(g_count * z >= sum(members))
        model.add(env >= theta * z)
    # μ(k): the least load among the active requests (an inactive one counts as ``top``).
    shifted = []
    for i, (a_k, l_k) in enumerate(zip(active, loads, strict=True)):
        v = model.new_int_var(0, top, f"v_{i}_{k}")
        model.add(v == l_k).only_enforce_if(a_k)
        model.add(v == top).only_enforce_if(a_k.Not())
        shifted.append(v)
    least = model.new_int_var(0, top, f"mu_{k}")
    model.add_min_equality(least, shifted)
    fullest = model.new_int_var(0, slots, f"c_{k}")
    model.add(g_count * fullest >= n_k)  # ⌈n_k/G⌉ ≤ fullest
    prod = model.new_int_var(0, slots * top, f"cm_{k}")
    model.add_multiplication_equality(prod, [fullest, least])
    model.add(env >= prod)
    if count > (g_count - 1) * slots + 1:
        extra = model.new_int_var(0, slots - 1, f"e_{k}")
        model.add(extra >= n_k - (g_count - 1) * slots - 1)
        rest = model.new_int_var(0, (slots - 1) * top, f"em_{k}")
        model.add_multiplication_equality(rest, [extra, least])
        for l_k in loads:
            model.add(env >= l_k + rest)


def _partition(model: Any, k: int, active: list, loads: list, tops: list, env: Any,
               g_count: int, slots: int) -> None:
    """The migration relaxation's step k: the active requests are partitioned among the G
    replicas afresh (y_{igk}), at most B each, and M(k) is at least every part's load. Replica
    labels are free at every step, so the parts are ordered by load (symmetry breaking)."""
    part_loads = []
    for g in range(g_count):
        terms = []
        for i, (a_k, l_k) in enumerate(zip(active, loads, strict=True)):
            y = model.new_bool_var(f"y_{i}_{g}_{k}")
            p = model.new_int_var(0, tops[i], f"p_{i}_{g}_{k}")
            model.add_implication(y, a_k)
            model.add(p == l_k).only_enforce_if(y)
            model.add(p == 0).only_enforce_if(y.Not())
            terms.append((y, p))
        load = model.new_int_var(0, sum(tops), f"L_{g}_{k}")
        model.add(load == sum(p for _, p in terms))
        # A replica holds at most B requests; the envelope is at least its load.
        model.add(sum(y for y, _ in terms) <= slots)
        model.add(env >= load)
        part_loads.append((load, [y for y, _ in terms]))
    for i, a_k in enumerate(active):
        # Every active request is in exactly one part.
        model.add(sum(ys[i] for _, ys in part_loads) == a_k)
    for (upper, _), (lower, _) in zip(part_loads, part_loads[1:]):
        model.add(upper >= lower)


def aggregate_bound(
    instance: ClairvoyantInstance, *, time_limit_s: float = 60.0, threads: int = 1, seed: int = 0,
    hint: NDArray | None = None, relaxation: str = "aggregate",
    params: Mapping[str, str] | None = None, log_path: str | None = None,
    export: str | None = None,
) -> AggregateBound:
    """Solve the relaxed model of ``instance`` (at decode-step resolution whatever its
    ``step``); ``hint``: start steps of a known work-conserving schedule (e.g. a policy's).
    ``relaxation``: ``"aggregate"`` (envelope ≥ max(largest active load, mean): small, any
    size), ``"partition"`` (the same plus the pigeonhole cuts of :func:`_pigeonhole`: O(n·T)
    more variables, no replica index) or ``"migration"`` (an exact partition of the active
    requests among the replicas at every step: stronger, n·G·T more variables, for small
    episodes). Each is at least as strong as the one before."""
    if relaxation not in RELAXATIONS:
        raise ValueError(f"relaxation={relaxation!r} must be one of {', '.join(RELAXATIONS)}")
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    inst = dataclasses.replace(instance, step=1)
    n, g_count, cap = inst.num_requests, inst.num_replicas, inst.num_replicas * inst.slots
    horizon = inst.model_horizon
    s, o, r = (a.astype(np.int64) for a in (inst.prompt_len, inst.output_len, inst.release))
    last = horizon - o
    model = cp_model.CpModel()

    # Variables: start indicators, and per active step the activity, load and "started" flags.
    x = [{t: model.new_bool_var(f"x_{i}_{t}") for t in range(int(r[i]), int(last[i]) + 1)}
         for i in range(n)]
    active: list[list[Any]] = [[] for _ in range(horizon)]
    loads: list[list[Any]] = [[] for _ in range(horizon)]
    tops: list[list[int]] = [[] for _ in range(horizon)]  # each load's upper bound s_i + o_i − 1
    prompts: list[list[int]] = [[] for _ in range(horizon)]  # each load's lower bound s_i
    peak = int(inst.slots * (s + o).max())  # B requests on one replica
    env = [model.new_int_var(0, peak, f"M_{k}") for k in range(horizon)]
    waiting = ([model.new_bool_var(f"w_{k}") for k in range(horizon)]
               if inst.work_conserving else None)
    for i in range(n):
        # Every request starts exactly once.
        model.add_exactly_one(x[i].values())
        started: Any = 0
        # Activity and load recurrences: start adds s_i, each running step adds 1, the end
        # removes the last load s_i + o_i − 1.
        for k, a_k, l_k, begin in life_recurrence(model, x[i], range(int(r[i]), horizon),
                                                  int(s[i]), int(o[i]), f"{i}"):
            # The envelope holds every active request whole.
            model.add(env[k] >= l_k)
            active[k].append(a_k)
            loads[k].append(l_k)
            tops[k].append(int(s[i] + o[i] - 1))
            prompts[k].append(int(s[i]))
            if waiting is not None and k < last[i]:
                s_k = model.new_bool_var(f"S_{i}_{k}")
                model.add(s_k == started + begin)
                # Work conservation: if i has not started by k, every slot is busy at k.
                model.add_implication(s_k.Not(), waiting[k])
                started = s_k
    for k in range(horizon):
        # The envelope is at least the mean load; slots.
        model.add(g_count * env[k] >= sum(loads[k]))
        model.add(sum(active[k]) <= cap)
        if waiting is not None:
            model.add(sum(active[k]) >= cap * waiting[k])
        if relaxation == "partition":
            _pigeonhole(model, k, active[k], loads[k], tops[k], env[k], prompts[k], g_count,
                        inst.slots)
        if relaxation == "migration":
            _partition(model, k, active[k], loads[k], tops[k], env[k], g_count, inst.slots)

    if inst.objective == "imbalance":
        model.minimize(sum(env))
        scale, constant = float(g_count), float(-inst.total_load)
    else:
        w_busy, w_env, unit, exact = step_time_weights(inst.step_b, inst.step_a)
        busy = [model.new_bool_var(f"y_{k}") for k in range(horizon)]
        for k in range(horizon):
            for a_k in active[k]:
                model.add_implication(a_k, busy[k])
        model.minimize(sum(w_busy * busy[k] + w_env * env[k] for k in range(horizon)))
        scale, constant = unit, 0.0
    if hint is not None:
        for i, t0_i in enumerate(np.asarray(hint, dtype=np.int64)):
            for t, var in x[i].items():
                model.add_hint(var, int(t == t0_i))
    if export is not None:
        export_cpsat(model, export, scale=scale, constant=constant)

    solver, code = run_cpsat(model, time_limit_s=time_limit_s, gap_rel=0.0, threads=threads,
                             seed=seed, params=params, log_path=log_path)
    status = solver.status_name(code)
    if code == cp_model.INFEASIBLE:
        raise ValueError("the aggregated relaxation is infeasible: so is the instance")
    bound = math.nan
    value = math.nan
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        value = scale * solver.objective_value + constant
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
        bound = scale * solver.best_objective_bound + constant
    if inst.objective == "step_time" and not exact:
        bound = math.nan  # rounded weights: the bound is the rounded model's
    bound = max(bound, 0.0) if math.isfinite(bound) else bound
    return AggregateBound(bound=float(bound), relaxation=float(value), status=status,
                          wall_s=time.perf_counter() - t0, method=METHODS[relaxation])


def _least_envelope(loads: list[int], prompts: list[int], g_count: int, slots: int,
                    relaxation: str) -> int:
    """The least M(k) the relaxed model allows at a step with these active loads (and their
    prompts): what the model's constraints on M(k) say, evaluated."""
    from .migration import partition_envelope

    if not loads:
        return 0
    if relaxation == "migration":
        return partition_envelope(tuple(loads), g_count, slots)
    env = max(max(loads), -(-sum(loads) // g_count))
    if relaxation == "partition":
        n_k, least = len(loads), min(loads)
        for theta in set(prompts):
            count = sum(p >= theta for p in prompts)
            if count > g_count:
                env = max(env, theta * -(-count // g_count))  # (P1)
        env = max(env, least * -(-n_k // g_count))  # (P2)
        env = max(env, max(loads) + least * max(0, n_k - (g_count - 1) * slots - 1))  # (P3)
    return env


def relaxation_at_schedule(instance: ClairvoyantInstance, start: NDArray,
                           relaxation: str = "aggregate") -> float:
    """The relaxed model's objective at one schedule's start steps (decode steps; replicas play
    no part), with every M(k) as small as the model allows. Start steps with at most G·B
    requests running and (when the instance asks for it) work conservation over the pooled
    G·B slots are feasible for the relaxed model (``ValueError`` otherwise,
    ``clairvoyant_eval.pooled_steps``), so this is an upper bound on the relaxation's optimum —
    the most that relaxation could ever prove — and, for a replica schedule's starts, at most
    that schedule's own objective."""
    if relaxation not in RELAXATIONS:
        raise ValueError(f"relaxation={relaxation!r} must be one of {', '.join(RELAXATIONS)}")
    inst = instance
    s = inst.prompt_len
    total = 0.0
    for _, live, loads in pooled_steps(inst, start):
        env = _least_envelope(loads, [int(s[i]) for i in live], inst.num_replicas, inst.slots,
                              relaxation)
        if inst.objective == "imbalance":
            total += inst.num_replicas * env - sum(loads)
        elif loads:
            total += inst.step_b + inst.step_a * env
    return float(total)
