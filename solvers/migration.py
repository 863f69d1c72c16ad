"""The migration relaxation solved exactly by dynamic programming, for small episodes.

Let active requests be re-partitioned among the replicas at every step (start times and work
conservation stay decisions): a step's envelope is then the optimal partition of its active
loads into G parts of at most B requests, P*(A), and the relaxation's value is
min over start times of Σ_k [G·P*(A_k) − Σ_{i∈A_k} ℓ_i(k)] (or Σ_busy b + a·P*(A_k)). Every
bound-for-life schedule is one such choice, so the value is a lower bound on the clairvoyant
optimum (issue 13: it equals the Lagrangian dual of the bound-for-life constraints).

The state at decode step k is (k, the running requests with their start steps, the requests not
yet started): the future cost depends on nothing else, so memoised recursion over the starting
sets chosen at each step (all ``min(free, released)``-subsets when work-conserving, any subset
otherwise) is exact. Exponential: :func:`migration_bound_dp` gives up (``None``) past
``max_states`` states; the CP-SAT model (``aggregate_bound(relaxation="migration")``) is the
fallback.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from functools import cache

from .instances import ClairvoyantInstance

__all__ = ["METHOD", "dp_fits", "migration_bound_dp", "partition_envelope"]

#: How ``gap`` names this bound.
METHOD = "migration relaxation (exact DP)"


def partition_envelope(loads: tuple[int, ...], parts: int, cap: int) -> int:
    """P*(loads): the smallest possible maximum part load when ``loads`` are split into
    ``parts`` parts of at most ``cap`` items (branch and bound, largest first)."""
    items = sorted(loads, reverse=True)
    if not items:
        return 0
    floor = max(items[0], -(-sum(items) // parts))
    best = [sum(items)]
    sums, counts = [0] * parts, [0] * parts

    def place(j: int, worst: int) -> bool:
        if worst >= best[0]:
            return False
        if j == len(items):
            best[0] = worst
            return worst == floor  # cannot do better: stop
        seen = set()
        for g in range(parts):
            key = (sums[g], counts[g])
            if counts[g] < cap and key not in seen:
                seen.add(key)
                sums[g] += items[j]
                counts[g] += 1
                done = place(j + 1, max(worst, sums[g]))
                sums[g] -= items[j]
                counts[g] -= 1
                if done:
                    return True
        return False

    place(0, 0)
    return best[0]


class _TooLarge(Exception):
    pass


def dp_fits(instance: ClairvoyantInstance, max_states: int = 200_000) -> bool:
    """A cheap test that the first step's choices alone stay within ``max_states``."""
    n, cap = instance.num_requests, instance.num_replicas * instance.slots
    return math.comb(n, min(n, cap)) <= max_states


def migration_bound_dp(instance: ClairvoyantInstance, *, max_states: int = 200_000) -> float | None:
    """The migration relaxation's exact value (decode-step resolution), or ``None`` when the
    search would visit more than ``max_states`` states."""
    inst = instance
    n, g_count, slots = inst.num_requests, inst.num_replicas, inst.slots
    cap = g_count * slots
    s, o, r = (tuple(int(v) for v in a) for a in (inst.prompt_len, inst.output_len, inst.release))
    imbalance = inst.objective == "imbalance"
    horizon = dataclasses.replace(inst, step=1).model_horizon  # decode steps, as the models
    env_cache: dict[tuple[int, ...], int] = {}

    def step_cost(active: tuple[tuple[int, int], ...], k: int) -> float:
        loads = tuple(sorted(s[i] + k - t for i, t in active))
        if not loads:
            return 0.0
        env = env_cache.get(loads)
        if env is None:
            env = env_cache[loads] = partition_envelope(loads, g_count, slots)
        if imbalance:
            return float(g_count * env - sum(loads))
        return inst.step_b + inst.step_a * env

    @cache
    def future(k: int, running: frozenset, waiting: frozenset) -> float:
        if future.cache_info().currsize >= max_states:
            raise _TooLarge
        if not running and not waiting:
            return 0.0
        if any(k + o[i] > horizon for i in waiting):  # someone can no longer finish in time
            return float("inf")
        released = sorted(i for i in waiting if r[i] <= k)
        free = cap - len(running)
        take = min(free, len(released))
        sizes = [take] if inst.work_conserving else range(take + 1)
        best = float("inf")
        for size in sizes:
            for chosen in itertools.combinations(released, size):
                active = tuple(sorted(running)) + tuple((i, k) for i in chosen)
                nxt = frozenset((i, t) for i, t in active if t + o[i] > k + 1)
                cost = step_cost(active, k) + future(k + 1, nxt, waiting - frozenset(chosen))
                best = min(best, cost)
        return best

    try:
        return future(0, frozenset(), frozenset(range(n)))
    except _TooLarge:
        return None
    finally:
        future.cache_clear()
