"""Brute force for tiny tick instances (``tick-brute``): enumerate every assignment.

Each pooled request goes to one of the G replicas or stays pooled: (G+1)^P candidates, filtered
by slots and count and scored in numpy. The reference the MILP and CP-SAT models are tested
against; refuses instances with more than ``max_candidates`` candidates.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from .base import OPTIMAL, Solution, check_solve_args
from .instances import TickInstance
from .tick_eval import tick_objective

__all__ = ["TickBruteForceSolver"]


class TickBruteForceSolver:
    """Exhaustive enumeration of (G+1)^P assignments; exact, for tiny instances only."""

    name: ClassVar[str] = "tick-brute"
    problem: ClassVar[str] = "tick"
    requires: ClassVar[tuple[str, ...]] = ()
    max_candidates: ClassVar[int] = 500_000

    @classmethod
    def is_available(cls) -> bool:
        """Always (numpy only)."""
        return True

    def solve(self, instance: TickInstance, *, time_limit_s: float = 10.0, gap_rel: float = 0.0,
              threads: int = 1, seed: int = 0, params: Mapping[str, str] | None = None,
              log_path: str | None = None, export: str | None = None) -> Solution:
        """Enumerate, score and return the best assignment (ties: the first in enumeration
        order). ``time_limit_s`` and the rest are accepted for the contract; it always finishes.
        It has no parameters, writes no log and has no model to export."""
        if not isinstance(instance, TickInstance):
            raise ValueError(f"{self.name} solves TickInstance, got {type(instance).__name__}")
        if params:
            raise ValueError(f"{self.name} takes no solver parameters, got {', '.join(params)}")
        check_solve_args(time_limit_s, gap_rel, threads)
        t0 = time.perf_counter()
        g_count, p_count = instance.num_replicas, instance.pool_size
        total = (g_count + 1) ** p_count
        if total > self.max_candidates:
            raise ValueError(
                f"brute force would enumerate (G+1)^P = {total} assignments "
                f"(limit {self.max_candidates}); use tick-cpsat or tick-highs"
            )
        # codes[c, i] ∈ {0..G}: replica code − 1 of request i in candidate c (0: stays pooled)
        codes = (np.arange(total)[:, None] // (g_count + 1) ** np.arange(p_count)) % (g_count + 1)
        onehot = codes[:, :, None] == np.arange(1, g_count + 1)  # (C, P, G)
        counts = onehot.sum(axis=1)
        placed = counts.sum(axis=1)
        lo, hi = instance.required
        ok = np.all(counts <= instance.free_slots, axis=1) & (placed >= lo) & (placed <= hi)
        codes, onehot = codes[ok], onehot[ok]
        delta = np.einsum("cpg,p->cg", onehot, instance.prompt_len.astype(np.float64))
        if instance.objective == "f_score":
            m, d = instance.margins, instance.d
            over = np.maximum(delta[:, :, None] - m[None], 0.0)  # (C, G, H+1)
            score = instance.alpha * d.sum() * delta.sum(axis=1) - instance.beta * (over @ d).sum(axis=1)
            best = int(np.argmax(score))
        else:
            after = instance.loads[None] + delta
            score = g_count * after.max(axis=1) - after.sum(axis=1)
            best = int(np.argmin(score))
        replica = codes[best].astype(np.int64) - 1
        value = tick_objective(instance, replica)
        return Solution(solver=self.name, status=OPTIMAL, sense=instance.sense, objective=value,
                        bound=value, wall_s=time.perf_counter() - t0, replica=replica)
