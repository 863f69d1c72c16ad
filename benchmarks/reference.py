"""Straightforward pure-Python references: the yardsticks of the benchmarks and the tests.

``reference_tick`` is DESIGN §2 written literally with lists and a heap, no numpy. It must make
the same decisions as :func:`balanceroute.core.two_stage.two_stage_assign` (a test checks it).
"""

from __future__ import annotations

import heapq
from itertools import combinations


def _score(delta: float, margin: list[float], d: list[float], alpha: float, beta: float) -> float:
    total = 0.0
    for dh, mh in zip(d, margin):
        total += dh * max(delta - mh, 0.0)
    return alpha * sum(d) * delta - beta * total


def reference_tick(
    proj_loads: list[list[float]],
    free_slots: list[int],
    prompt_len: list[int],
    wait: list[float],
    *,
    d: list[float],
    alpha: float,
    beta: float,
    s_greedy: int,
    r_max: int,
    deadline_s: float,
    growth: list[list[float]] | None = None,
) -> list[tuple[int, int]]:
    """One tick; returns ``[(pool_index, replica), ...]`` in decision order."""
    loads = [list(row) for row in proj_loads]
    free = list(free_slots)
    horizon = len(d)
    alive = [True] * len(prompt_len)
    out: list[tuple[int, int]] = []
    remaining = min(sum(free), len(prompt_len))

    def env() -> list[float]:
        return [max(row[h] for row in loads) for h in range(horizon)]

    def margin(g: int) -> list[float]:
        e = env()
        return [e[h] - loads[g][h] for h in range(horizon)]

    def place(i: int, g: int) -> None:
        for h in range(horizon):
            loads[g][h] += prompt_len[i] + (growth[i][h] if growth is not None else 0.0)
        free[g] -= 1
        alive[i] = False
        out.append((i, g))

    late = sorted((i for i in range(len(wait)) if wait[i] >= deadline_s), key=lambda i: -wait[i])
    for i in late:
        if len(out) == remaining:
            break
        best = max(
            (g for g in range(len(free)) if free[g] > 0),
            key=lambda g: (_score(prompt_len[i], margin(g), d, alpha, beta), free[g], margin(g)[0], -g),
        )
        place(i, best)

    while len(out) < remaining and sum(free) > s_greedy:
        g = min((g for g in range(len(free)) if free[g] > 0), key=lambda g: (-free[g], loads[g][0], g))
        m = margin(g)
        i = max((i for i in range(len(alive)) if alive[i]),
                key=lambda i: (_score(prompt_len[i], m, d, alpha, beta), -i))
        place(i, g)

    while len(out) < remaining:
        e0 = env()[0]
        heap = [(-free[g], -(e0 - loads[g][0]), g) for g in range(len(free)) if free[g] > 0]
        heapq.heapify(heap)
        _, _, g = heapq.heappop(heap)
        m = margin(g)
        ranked = sorted((i for i in range(len(alive)) if alive[i]),
                        key=lambda i: (-_score(prompt_len[i], m, d, alpha, beta), i))
        cand = ranked[:r_max]
        cap = min(free[g], len(cand))
        best_q: tuple[int, ...] = ()
        best_f = float("-inf")
        for size in range(1, cap + 1):
            for q in combinations(range(len(cand)), size):
                f = _score(sum(prompt_len[cand[j]] for j in q), m, d, alpha, beta)
                if f > best_f:
                    best_q, best_f = q, f
        chosen = [cand[j] for j in best_q] if best_f > 0 else [cand[0]]
        for i in chosen:
            place(i, g)
    return out
