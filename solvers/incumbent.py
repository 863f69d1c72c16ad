"""Work-conserving clairvoyant schedules at decode-step resolution: a repair pass and a local search.

A *plan* is ``(replica, priority)``: where each request should run and in which order requests
start. :func:`work_conserving_repair` turns a plan into a schedule that is feasible and
work-conserving at every decode step (no released request waits while a slot is free), by list
scheduling that follows the plan as closely as that allows:

1. at each decode step, requests whose planned start has come start on their planned replica,
   in priority order, while it has a free slot;
2. then, while a slot is free anywhere and a released request waits, the free slot of replica g
   takes the earliest-planned waiting request planned on g, else the earliest-planned waiting
   request of all (it moves to g).

A work-conserving schedule is its own repair (nothing is late, step 2 never fires), so repairing a
policy's schedule returns it unchanged. The coarsened (q > 1) models' schedules start on block
boundaries and so may idle a slot: they are repaired before being reported.
:func:`improve_schedule` is a first-improvement local search over plans (move a request to
another replica, swap two requests' replicas, swap two requests' priorities), each neighbour
repaired and evaluated exactly; it stops after ``max_iters`` neighbours or ``time_limit_s``.
"""

from __future__ import annotations

import time

import numpy as np
from numpy.typing import NDArray

from .clairvoyant_eval import schedule_objective
from .instances import ClairvoyantInstance

__all__ = ["decode_step_schedule", "improve_schedule", "work_conserving_repair"]


def work_conserving_repair(instance: ClairvoyantInstance, replica: NDArray,
                           priority: NDArray) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The work-conserving decode-step schedule ``(replica, start)`` closest to the plan
    (rules in the module docstring); ``priority`` is typically the planned start step."""
    n, g_count, slots = instance.num_requests, instance.num_replicas, instance.slots
    plan_rep = np.asarray(replica, dtype=np.int64)
    plan = np.asarray(priority, dtype=np.int64)
    rank = np.lexsort((np.arange(n), plan))  # priority order, ties by index
    release, out_len = instance.release, instance.output_len
    rep = np.full(n, -1, dtype=np.int64)
    start = np.full(n, -1, dtype=np.int64)
    ends: list[list[int]] = [[] for _ in range(g_count)]  # end steps of running requests
    waiting = [int(i) for i in rank]  # not yet started, in priority order
    k = 0
    while waiting:
        free = np.array([slots - sum(e > k for e in ends[g]) for g in range(g_count)])
        released = [i for i in waiting if release[i] <= k]
        chosen: list[tuple[int, int]] = []
        for i in released:  # rule 1: due requests on their own replica
            g = int(plan_rep[i])
            if plan[i] <= k and free[g] > 0:
                chosen.append((i, g))
                free[g] -= 1
        taken = {i for i, _ in chosen}
        rest = [i for i in released if i not in taken]
        for g in range(g_count):  # rule 2: no slot stays free while someone waits
            while free[g] > 0 and rest:
                mine = [i for i in rest if plan_rep[i] == g]
                i = mine[0] if mine else rest[0]
                rest.remove(i)
                chosen.append((i, g))
                free[g] -= 1
        for i, g in chosen:
            rep[i], start[i] = g, k
            ends[g].append(k + int(out_len[i]))
            waiting.remove(i)
        k += 1
    return rep, start


def decode_step_schedule(instance: ClairvoyantInstance, replica: NDArray,
                         start: NDArray) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """A model's schedule (decode steps) as reported: repaired to be work-conserving when the
    instance asks for it and the model was coarsened (q > 1); unchanged otherwise."""
    if instance.work_conserving and instance.step > 1:
        return work_conserving_repair(instance, replica, start)
    return np.asarray(replica, dtype=np.int64), np.asarray(start, dtype=np.int64)


def improve_schedule(
    instance: ClairvoyantInstance, replica: NDArray, start: NDArray, *, max_iters: int = 2000,
    time_limit_s: float = 10.0, seed: int = 0,
) -> tuple[NDArray[np.int64], NDArray[np.int64], float]:
    """Local search from the schedule ``(replica, start)``; returns the best work-conserving
    schedule found and its exact objective. Deterministic for a given ``seed`` and
    ``max_iters`` when the time limit does not bind."""
    rng = np.random.default_rng(seed)
    n, g_count = instance.num_requests, instance.num_replicas
    best_rep, best_start = work_conserving_repair(instance, replica, start)
    best = schedule_objective(instance, best_rep, best_start)
    plan_rep, plan = best_rep.copy(), best_start.copy()
    deadline = time.perf_counter() + time_limit_s
    for _ in range(max_iters):
        if time.perf_counter() > deadline or n < 2:
            break
        cand_rep, cand = plan_rep.copy(), plan.copy()
        move = rng.integers(3)
        i, j = (int(x) for x in rng.choice(n, 2, replace=False))
        if move == 0 and g_count > 1:
            cand_rep[i] = (cand_rep[i] + rng.integers(1, g_count)) % g_count
        elif move == 1:
            cand_rep[i], cand_rep[j] = cand_rep[j], cand_rep[i]
        else:
            cand[i], cand[j] = cand[j], cand[i]
        rep, st = work_conserving_repair(instance, cand_rep, cand)
        value = schedule_objective(instance, rep, st)
        if value < best:
            best, best_rep, best_start = value, rep, st
            plan_rep, plan = rep.copy(), st.copy()
    return best_rep, best_start, float(best)
