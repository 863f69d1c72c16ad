"""The migration relaxation solved exactly by dynamic programming, for small episodes.

Let active requests be re-partitioned among the replicas at every step (start times and work
conservation stay decisions): a step's envelope is then the optimal partition of its active
loads into G parts of at most B requests, P*(A), and the relaxation's value is
min over start times of Σ_k [G·P*(A_k) − Σ_{i∈A_k} ℓ_i(k)] (or Σ_busy b + a·P*(A_k)). Every
bound-for-life schedule is one such choice, so the value is a lower bound on the clairvoyant
optimum (it equals the Lagrangian dual of the bound-for-life constraints).

The state at decode step k is (k, the running requests with their start steps, the requests not
yet started): the future cost depends on nothing else, so memoised recursion over the starting
sets chosen at each step (all ``min(free, released)``-subsets when work-conserving, any subset
otherwise) is exact. Exponential: :func:`migration_bound_dp` gives up (``None``) past
``max_states`` states or ``max_nodes`` branch-and-bound nodes of the per-step partitions (the
work, counted, so where it gives up does not depend on the machine); the CP-SAT model
(``aggregate_bound(relaxation="migration")``) is the fallback.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable
from functools import cache
from typing import Any

import numpy as np

from .instances import ClairvoyantInstance

__all__ = ["MAX_NODES", "MAX_STEPS", "METHOD", "PARTIAL_METHOD", "dp_fits", "migration_bound_dp",
           "partial_binding_at_schedule", "partial_binding_dp", "partition_envelope"]

#: How ``gap`` names this bound.
METHOD = "migration relaxation (exact DP)"
#: How ``gap`` names the partial-binding bound ({k}: how many requests are bound).
PARTIAL_METHOD = "partial binding, {k} largest bound for life (exact DP)"
#: Default work budget of one DP: branch-and-bound nodes of its per-step partitions (a node
#: places one load; about 2 µs here, so ≈ 10 s). A 16-request trace episode at G·B = 12, 281 steps,
#: needs more than 20,000 states (reached after 94 s), so the 200,000-state limit alone let one
#: DP call run for about a quarter of an hour.
MAX_NODES = 5_000_000
#: Longest horizon (decode steps) the DP takes on: it recurses once per decode step, and a
#: 605-step episode ran past Python's default recursion limit (1,000 frames).
MAX_STEPS = 400


class _TooLarge(Exception):
    pass


def partition_envelope(loads: tuple[int, ...], parts: int, cap: int,
                       base: tuple[tuple[int, int], ...] = (), budget: list[int] | None = None) -> int:
    """P*(loads): the smallest possible maximum part load when ``loads`` are split into
    ``parts`` parts of at most ``cap`` items (branch and bound, largest first). ``base``: per
    part, a load and a count already placed there (requests bound to that replica).
    ``budget``: a one-item list of nodes left, decremented per node; at 0 the search stops
    with :class:`_TooLarge` (the DP's work budget)."""
    items = sorted(loads, reverse=True)
    sums = [b[0] for b in base] + [0] * (parts - len(base))
    counts = [b[1] for b in base] + [0] * (parts - len(base))
    if not items:
        return max(sums, default=0)
    floor = max(items[0], max(sums), -(-(sum(items) + sum(sums)) // parts))
    best = [sum(items) + max(sums) + 1]  # above any complete placement

    def place(j: int, worst: int) -> bool:
        if budget is not None:
            budget[0] -= 1
            if budget[0] < 0:
                raise _TooLarge
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

    place(0, max(sums))
    return best[0]


def _step_cost(inst: ClairvoyantInstance, active: list[tuple[int, int]],
               env_cache: dict[tuple, int], budget: list[int] | None = None) -> float:
    """One decode step's cost when the ``active`` (load, replica) pairs with replica ≥ 0 stay
    where they are and those with replica −1 are re-partitioned as well as possible:
    G·P* − Σ loads (imbalance) or b + a·P* (step time; 0 when idle), with P* the
    :func:`partition_envelope` of the free loads given the bound ones. ``env_cache`` memoises P*;
    ``budget``: the partition's node budget (:func:`partition_envelope`)."""
    if not active:
        return 0.0
    g_count = inst.num_replicas
    loads = tuple(sorted(load for load, g in active if g < 0))
    placed = [[0, 0] for _ in range(g_count)]
    for load, g in active:
        if g >= 0:
            placed[g][0] += load
            placed[g][1] += 1
    base = tuple(sorted((a, c) for a, c in placed))  # replica labels do not matter
    key = (loads, base)
    env = env_cache.get(key)
    if env is None:
        env = env_cache[key] = partition_envelope(loads, g_count, inst.slots, base, budget)
    if inst.objective == "imbalance":
        return float(g_count * env - sum(load for load, _ in active))
    return inst.step_b + inst.step_a * env


def dp_fits(instance: ClairvoyantInstance, max_states: int = 200_000) -> bool:
    """A cheap test that the first step's choices alone stay within ``max_states``."""
    n, cap = instance.num_requests, instance.num_replicas * instance.slots
    return math.comb(n, min(n, cap)) <= max_states


def migration_bound_dp(instance: ClairvoyantInstance, *, bound: Iterable[int] = (),
                       max_states: int = 200_000, max_nodes: int = MAX_NODES) -> float | None:
    """The migration relaxation's exact value (decode-step resolution), or ``None`` when the
    search would visit more than ``max_states`` states or its per-step partitions more than
    ``max_nodes`` branch-and-bound nodes (:data:`MAX_NODES`), or the horizon is longer than
    :data:`MAX_STEPS` decode steps (or the recursion still runs too deep). ``bound``: requests
    kept bound to one replica for life (the partial-binding relaxation,
    :func:`partial_binding_dp`); every other active request is re-partitioned at every step."""
    inst = instance
    n, g_count, slots = inst.num_requests, inst.num_replicas, inst.slots
    cap = g_count * slots
    s, o, r = (tuple(int(v) for v in a) for a in (inst.prompt_len, inst.output_len, inst.release))
    tied = frozenset(int(i) for i in bound)
    horizon = dataclasses.replace(inst, step=1).model_horizon  # decode steps, as the models
    if horizon > MAX_STEPS:
        return None
    env_cache: dict[tuple, int] = {}
    budget = [max_nodes]

    def step_cost(active: tuple[tuple[int, int, int], ...], k: int) -> float:
        return _step_cost(inst, [(s[i] + k - t, g) for i, t, g in active], env_cache, budget)

    def canonical(running: Iterable[tuple[int, int, int]]) -> frozenset:
        """The state with replicas relabelled in order of their bound contents (replicas are
        identical: relabelling changes no future cost)."""
        running = tuple(running)
        content = {g: tuple(sorted((i, t) for i, t, h in running if h == g)) for g in range(g_count)}
        order = sorted(range(g_count), key=lambda g: content[g])
        label = {g: new for new, g in enumerate(order)}
        return frozenset((i, t, label[g] if g >= 0 else -1) for i, t, g in running)

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
        held = [0] * g_count  # bound requests running on each replica
        for _, _, g in running:
            if g >= 0:
                held[g] += 1
        best = float("inf")
        for size in sizes:
            for chosen in itertools.combinations(released, size):
                new_tied = [i for i in chosen if i in tied]
                for places in itertools.product(range(g_count), repeat=len(new_tied)):
                    # A replica holds at most B bound requests (the free ones move around).
                    use = held.copy()
                    for g in places:
                        use[g] += 1
                    if max(use, default=0) > slots:
                        continue
                    where = dict(zip(new_tied, places, strict=True))
                    active = tuple(sorted(running)) + tuple(
                        (i, k, where.get(i, -1)) for i in chosen)
                    nxt = canonical(a for a in active if a[1] + o[a[0]] > k + 1)
                    cost = step_cost(active, k) + future(k + 1, nxt, waiting - frozenset(chosen))
                    best = min(best, cost)
        return best

    try:
        return future(0, frozenset(), frozenset(range(n)))
    except (_TooLarge, RecursionError):
        return None
    finally:
        future.cache_clear()


def partial_binding_dp(instance: ClairvoyantInstance, k: int, *,
                       max_states: int = 200_000, max_nodes: int = MAX_NODES) -> float | None:
    """The partial-binding relaxation's exact value: the ``k`` largest prompts bound to one
    replica for life, the others re-partitioned at every step (``k = 0``: the migration
    relaxation; ``k = n``: the clairvoyant optimum itself). ``None`` past ``max_states`` or
    ``max_nodes`` (:func:`migration_bound_dp`)."""
    from .binding_bound import bound_requests

    return migration_bound_dp(instance, bound=bound_requests(instance, min(k, instance.num_requests)),
                              max_states=max_states, max_nodes=max_nodes)


def partial_binding_at_schedule(instance: ClairvoyantInstance, replica: Any, start: Any,
                                k: int) -> float:
    """The partial-binding relaxation's value at one schedule (decode steps): its starts and
    its ``k`` largest prompts' replicas kept, every other active request re-partitioned as well
    as possible at every step. A feasible (and, when the instance asks, work-conserving)
    schedule is a schedule of that relaxation, so the value is at least the relaxation's
    optimum — the most :func:`partial_binding_dp` could prove — and at most the schedule's own
    objective (``k = 0``: the migration relaxation's value at these starts; ``k = n``: the
    schedule's objective). ``ValueError`` for an infeasible or, where required,
    non-work-conserving schedule (``clairvoyant_eval.fine_loads``, ``pooled_steps``)."""
    from .binding_bound import bound_requests
    from .clairvoyant_eval import fine_loads, pooled_steps

    rep, st = np.asarray(replica, dtype=np.int64), np.asarray(start, dtype=np.int64)
    fine_loads(instance, rep, st)  # releases, replicas and slots
    tied = set(bound_requests(instance, min(k, instance.num_requests)))
    env_cache: dict[tuple, int] = {}
    total = 0.0
    for _, live, loads in pooled_steps(instance, st):  # and work conservation
        total += _step_cost(instance, [(load, int(rep[i]) if i in tied else -1)
                                       for i, load in zip(live, loads, strict=True)], env_cache)
    return total
