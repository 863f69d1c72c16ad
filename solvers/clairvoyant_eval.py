"""The clairvoyant problem's data tables and exact evaluation of a schedule.

A schedule is ``replica`` (n,) and ``start`` (n,) in decode steps. :func:`evaluate_schedule`
replays it with the simulator's dynamics (request i on g contributes s_i + (k − t_i) to L_g(k)
for k = t_i … t_i + o_i − 1 and holds a slot meanwhile) and returns Σ_k I(k) and Σ_k τ(k).
:class:`ModelTables` are the coarsened quantities the CP-SAT and MILP models share.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from .instances import ClairvoyantInstance

__all__ = ["COARSE_MESSAGE", "ModelTables", "canonical_replicas", "coarse_objective",
           "evaluate_schedule", "fine_loads", "greedy_schedule", "is_work_conserving",
           "model_incumbent", "model_tables", "pooled_steps", "schedule_objective"]

#: What a coarsened (q > 1) solve's numbers mean; ``{q}`` is the step.
COARSE_MESSAGE = ("coarsened (q={q}): the model's schedule, made work-conserving per decode step "
                  "and evaluated exactly; no proven bound from this model")


def _check_releases(instance: ClairvoyantInstance, st: NDArray) -> None:
    """``ValueError`` naming the first request whose start comes before its release."""
    early = np.flatnonzero(st < instance.release)
    if early.size:
        i = int(early[0])
        raise ValueError(f"request {i} starts at step {int(st[i])} before its release {int(instance.release[i])}")


def fine_loads(instance: ClairvoyantInstance, replica: NDArray, start: NDArray) -> tuple[NDArray, NDArray]:
    """``(loads, active)``, both (G, K) over decode steps 0 … K−1 (K = the makespan), after
    checking releases, replicas and slots (``ValueError`` on a violation)."""
    rep = np.asarray(replica, dtype=np.int64)
    st = np.asarray(start, dtype=np.int64)
    n, g_count = instance.num_requests, instance.num_replicas
    if rep.shape != (n,) or st.shape != (n,):
        raise ValueError(f"a schedule needs replica and start of shape ({n},)")
    if rep.min() < 0 or rep.max() >= g_count:
        raise ValueError(f"a schedule must place every request on a replica in 0..{g_count - 1}")
    _check_releases(instance, st)
    end = st + instance.output_len
    loads = np.zeros((g_count, int(end.max())), dtype=np.int64)
    active = np.zeros_like(loads)
    for i in range(n):
        o = int(instance.output_len[i])
        loads[rep[i], st[i]:end[i]] += instance.prompt_len[i] + np.arange(o)
        active[rep[i], st[i]:end[i]] += 1
    if active.max() > instance.slots:
        g, k = np.unravel_index(int(np.argmax(active)), active.shape)
        raise ValueError(f"replica {g} runs {int(active[g, k])} requests at step {k} (slots {instance.slots})")
    return loads, active


def evaluate_schedule(instance: ClairvoyantInstance, replica: NDArray, start: NDArray) -> dict[str, float]:
    """Exact metrics of a schedule at decode-step resolution: ``imbalance`` Σ_k I(k),
    ``step_time`` Σ_{busy k} (b + a·M(k)), ``envelope`` Σ_k M(k), ``makespan`` (steps) and
    ``objective`` (the instance's objective)."""
    loads, active = fine_loads(instance, replica, start)
    env = loads.max(axis=0)
    busy = active.sum(axis=0) > 0
    imb = float((instance.num_replicas * env - loads.sum(axis=0)).sum())
    tau = float((instance.step_b + instance.step_a * env)[busy].sum())
    out = {"imbalance": imb, "step_time": tau, "envelope": float(env.sum()),
           "makespan": float(loads.shape[1])}
    out["objective"] = out[instance.objective]
    return out


def is_work_conserving(instance: ClairvoyantInstance, replica: NDArray, start: NDArray) -> bool:
    """True when no released request waits at a decode step where some replica has a free slot
    (what every online policy guarantees)."""
    _, active = fine_loads(instance, replica, start)
    full = active.sum(axis=0) >= instance.num_replicas * instance.slots
    st = np.asarray(start, dtype=np.int64)
    for i in range(instance.num_requests):
        if st[i] > instance.release[i] and not full[int(instance.release[i]):int(st[i])].all():
            return False
    return True


def pooled_steps(instance: ClairvoyantInstance, start: NDArray) -> Iterator[tuple[int, NDArray, list[int]]]:
    """A schedule's decode steps with the replicas pooled: for k = 0 … makespan − 1, ``(k,
    running, loads)`` with ``running`` the requests i with t_i ≤ k < t_i + o_i and ``loads``
    their s_i + k − t_i. Checks, as it goes, what the replica-free relaxations ask of a
    schedule (``ValueError`` otherwise): no start before its release, at most G·B requests
    running, and (when the instance asks for it) work conservation over the pooled G·B slots —
    no released request waits at a step with a slot free."""
    st = np.asarray(start, dtype=np.int64)
    if st.shape != (instance.num_requests,):
        raise ValueError(f"start must have shape ({instance.num_requests},)")
    _check_releases(instance, st)
    s, o, r = instance.prompt_len, instance.output_len, instance.release
    cap = instance.num_replicas * instance.slots
    for k in range(int((st + o).max())):
        running = np.flatnonzero((st <= k) & (k < st + o))
        if running.size > cap:
            raise ValueError(f"{running.size} requests run at step {k} (G·B = {cap})")
        if instance.work_conserving and running.size < cap and ((r <= k) & (st > k)).any():
            raise ValueError(f"not work-conserving: a request waits at step {k} with a slot free")
        yield k, running, [int(s[i] + k - st[i]) for i in running]


def schedule_objective(instance: ClairvoyantInstance, replica: NDArray, start: NDArray) -> float:
    """The instance's objective of a schedule, at decode-step resolution."""
    return evaluate_schedule(instance, replica, start)["objective"]


@dataclass(frozen=True, slots=True)
class ModelTables:
    """Coarsened data (q decode steps per model step; q = 1 is exact).

    ``dur[i]`` = o'_i = ⌈o_i/q⌉ model steps; ``first[i]`` = r'_i = ⌈r_i/q⌉ and ``last[i]`` =
    T' − o'_i: the allowed model start steps; ``contrib[i][e]`` = Σ_{j<q, eq+j<o_i}(s_i + eq + j):
    request i's tokens summed over the q decode steps of its e-th model step of life.
    ``total`` = Σ_i Σ_e contrib[i][e] = ``ClairvoyantInstance.total_load``: every token-step once.
    """

    q: int
    horizon: int
    dur: NDArray[np.int64]
    first: NDArray[np.int64]
    last: NDArray[np.int64]
    contrib: tuple[NDArray[np.int64], ...]
    total: int

    def starts(self, i: int) -> range:
        """Allowed model start steps of request i."""
        return range(int(self.first[i]), int(self.last[i]) + 1)


def model_tables(instance: ClairvoyantInstance) -> ModelTables:
    """The :class:`ModelTables` of ``instance``; ``ValueError`` if a request cannot fit."""
    q, t_model = instance.step, instance.model_horizon
    s, o = instance.prompt_len, instance.output_len
    dur = -(-o // q)
    first = -(-instance.release // q)
    last = t_model - dur
    bad = np.flatnonzero(last < first)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"request {i} cannot finish within the horizon ({t_model} model steps)")
    contrib = []
    for i in range(instance.num_requests):
        age = np.arange(int(dur[i]) * q)
        tokens = np.where(age < o[i], s[i] + age, 0)
        contrib.append(tokens.reshape(-1, q).sum(axis=1))
    return ModelTables(q=q, horizon=t_model, dur=dur, first=first, last=last,
                       contrib=tuple(contrib), total=instance.total_load)


def coarse_objective(instance: ClairvoyantInstance, tables: ModelTables, replica: NDArray,
                     start_model: NDArray) -> float:
    """The model's own objective of a schedule given in model steps (equal to the exact one
    when q = 1): imbalance G·Σ_κ M'(κ) − total, or Σ_κ (b·q·busy(κ) + a·M'(κ))."""
    loads = np.zeros((instance.num_replicas, tables.horizon), dtype=np.int64)
    for i in range(instance.num_requests):
        t = int(start_model[i])
        loads[int(replica[i]), t:t + int(tables.dur[i])] += tables.contrib[i]
    env = loads.max(axis=0)
    if instance.objective == "imbalance":
        return float(instance.num_replicas * env.sum() - tables.total)
    busy = loads.sum(axis=0) > 0
    return float(instance.step_b * tables.q * busy.sum() + instance.step_a * env.sum())


def canonical_replicas(replica: NDArray, start: NDArray) -> tuple[NDArray, NDArray]:
    """Relabel identical replicas in order of their lowest-indexed request, so request i is on a
    replica ≤ i (the symmetry-breaking rule of the models); ``start`` is returned unchanged."""
    rep = np.asarray(replica, dtype=np.int64)
    order: list[int] = []
    for g in rep.tolist():
        if g not in order:
            order.append(g)
    mapping = {g: j for j, g in enumerate(order)}
    return np.array([mapping[g] for g in rep.tolist()], dtype=np.int64), np.asarray(start)


def greedy_schedule(instance: ClairvoyantInstance, tables: ModelTables) -> tuple[NDArray, NDArray] | None:
    """A feasible, work-conserving schedule of the (coarsened) model, in model steps: list
    scheduling that, at each model step, takes released requests largest-first and puts each on
    the replica with a free slot where it raises that replica's future peak load least. Used as
    the solvers' starting incumbent; it fits the default horizon by the list-scheduling bound
    (``None`` if it does not fit a user-given horizon)."""
    n, g_count, horizon = instance.num_requests, instance.num_replicas, tables.horizon
    loads = np.zeros((g_count, horizon + int(tables.dur.max())), dtype=np.int64)
    busy = np.zeros_like(loads)
    replica = np.full(n, -1, dtype=np.int64)
    start = np.full(n, -1, dtype=np.int64)
    size = np.array([c.sum() for c in tables.contrib])
    for k in range(horizon):
        pending = [i for i in np.argsort(-size, kind="stable") if start[i] < 0 and tables.first[i] <= k]
        for i in pending:
            open_g = np.flatnonzero(busy[:, k] < instance.slots)
            if open_g.size == 0:
                break
            span = slice(k, k + int(tables.dur[i]))
            peak = [(loads[g, span] + tables.contrib[i]).max() for g in open_g]
            g = int(open_g[int(np.argmin(peak))])
            loads[g, span] += tables.contrib[i]
            busy[g, span] += 1
            replica[i], start[i] = g, k
    if np.any(start < 0) or np.any(start > tables.last):
        return None
    return replica, start


def model_incumbent(instance: ClairvoyantInstance, tables: ModelTables,
                    hint: tuple[NDArray, NDArray] | None) -> tuple[NDArray, NDArray] | None:
    """A starting schedule for the exact models, in model steps with canonical replicas: the
    model's list schedule, or ``hint`` (a decode-step schedule, e.g. a policy's) when it fits the
    model (q = 1) and is better under the model's objective."""
    incumbent = greedy_schedule(instance, tables)
    if hint is not None and tables.q == 1:
        rep, start = canonical_replicas(*(np.asarray(a, dtype=np.int64) for a in hint))
        fits = bool(np.all(start >= tables.first) and np.all(start <= tables.last))
        if fits:
            try:
                fine_loads(instance, rep, start)
            except ValueError:
                fits = False
        if fits and (incumbent is None or coarse_objective(instance, tables, rep, start)
                     < coarse_objective(instance, tables, *incumbent)):
            incumbent = rep, start
    return None if incumbent is None else canonical_replicas(*incumbent)
