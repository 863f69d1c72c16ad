"""Brute force from the definitions, independent of every model: the references the solvers and
the bounds are tested against."""

from __future__ import annotations

import itertools

import numpy as np

from balanceroute.solvers import ClairvoyantInstance
from balanceroute.solvers.clairvoyant_eval import evaluate_schedule, fine_loads


def enumerate_clairvoyant(inst: ClairvoyantInstance) -> float:
    """Best objective over every (replica, start) choice, checked at decode-step resolution
    (work conservation included when the instance asks for it)."""
    horizon = inst.model_horizon * inst.step
    n, best = inst.num_requests, np.inf
    choices = [[(g, t) for g in range(inst.num_replicas)
                for t in range(int(inst.release[i]), horizon - int(inst.output_len[i]) + 1)]
               for i in range(n)]
    for combo in itertools.product(*choices):
        rep = np.array([c[0] for c in combo])
        start = np.array([c[1] for c in combo])
        try:
            _, active = fine_loads(inst, rep, start)
        except ValueError:
            continue
        if inst.work_conserving:
            running = active.sum(axis=0)
            full = inst.num_replicas * inst.slots
            waiting = [(inst.release <= k) & (start > k) for k in range(active.shape[1])]
            if any(w.any() and running[k] < full for k, w in enumerate(waiting)):
                continue
        best = min(best, evaluate_schedule(inst, rep, start)["objective"])
    return float(best)
