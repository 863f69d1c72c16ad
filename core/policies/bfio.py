"""BF-IO (Chen et al., "A Universal Load Balancing Principle and Its Application to LLM
Serving", arXiv 2601.17855): the prior art's two-phase rule, as its public simulator defines it.

Per tick, with loads projected t = 0..T steps ahead (a running request keeps its s + a tokens
until its forecast remaining steps r elapse, then leaves; it does not grow) and margins
``m_g(t) = max(M̂(t) − L̂_g(t), 0)``, a set of prompts of total S on replica g scores

    ``F_g(S) = α·S·Σ_t d_t − β·Σ_t d_t·(S − m_g(t))_+``,  ``d_t = γ^t`` (α = 1, β = 43, γ = 0.86).

1. *Greedy phase*, while more than ``greedy_slots`` (7) slots are free: the replica with most
   free slots (ties: lower load) takes the visible request with the largest F(s).
2. *Fine phase*: replicas in a min-heap keyed by ``(1 − λ)·L̂_g(0) + λ·L̂_g(T)`` with
   ``λ = t_now / (t_now + τ̄·T_empty)`` (T_empty: steps until the projected envelope empties);
   the popped replica with k free slots takes, for k' = k, k − 1, …, 1, the subset of exactly k'
   visible requests whose sum is the largest reachable S ≤ ⌊min_t m(t)⌋ (or else the smallest
   reachable S above it) — an exact subset-sum search (dynamic programming over reachable sums)
   over the whole visible queue (``max_candidates``) — stopping at the first k' with a safe sum
   and keeping the best F; if that F ≤ 0, the single request with the best F. A replica with
   slots left goes back in the heap.

``deadline_s`` and ``ttft_slo_s`` (not in the paper; ``None`` by default, as its simulator):
requests that have waited ≥ ``deadline_s`` or ≥ θ (below) are placed first, oldest first,
each on the open replica with the best F(s) (ties: more free slots) — BF-IO under the KV lease
a PD deployment imposes (the same pool deadline BR-0 and BR-H keep:
:attr:`~balanceroute.core.lease.LeaseRule.deadline_s`, which leaves the transfer its margin)
and under BR-0's first-token guard: a request that has waited its scale θ
(:func:`~balanceroute.core.two_stage.urgency_scale`: ``ttft_slo_s`` or twice the pool's
median wait, whichever is shorter) is placed first, as at that wait BR-0's urgency outranks any request
that merely fits.

``bfio-h0`` is T = 0 (current loads only; then λ = 1 and the heap key is the current load).
``bfio`` looks T = ``horizon`` (72) steps ahead with a termination predictor's forecast (its
simulator's default is the true output length: the ``oracle`` predictor). This module is an
independent implementation from the paper's definitions; it shares no code with the authors'.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

import numpy as np

from ..lease import DEFAULT_LEASE
from ..predictors.base import FeatureSource, Predictor, RequestFeatures
from ..projection import departure_steps
from ..state import Assignment, ClusterState, PoolView
from ..two_stage import urgency_scale
from ..workloads.base import Workload

__all__ = ["BFIOPolicy", "best_sum_subset", "bfio_h0", "bfio_h0_lease"]


def best_sum_subset(sizes: list[int], k: int, safe: int) -> tuple[list[int], int] | None:
    """Exactly ``k`` of ``sizes`` whose sum S is the largest reachable S ≤ ``safe`` or, if no
    k-subset fits, the smallest reachable S > ``safe``; returns (positions, S) or None (k > n).

    Dynamic programming over reachable sums: ``reach[j]`` is a bitset (Python int) of the sums of
    j-subsets of the items seen so far; a snapshot per item lets the subset be rebuilt."""
    n = len(sizes)
    if not 1 <= k <= n:
        return None
    cap = sum(sorted(sizes, reverse=True)[:k])
    mask = (1 << (cap + 1)) - 1
    reach = [1] + [0] * k
    history = []
    for i, s in enumerate(sizes):
        history.append(reach[:])
        for j in range(min(i + 1, k), 0, -1):
            reach[j] = (reach[j] | (reach[j - 1] << s)) & mask
    sums = reach[k]
    low = sums & ((1 << (safe + 1)) - 1) if safe >= 0 else 0
    if low:
        total = low.bit_length() - 1
    else:
        high = sums >> (safe + 1)
        total = (safe + 1) + ((high & -high).bit_length() - 1)
    chosen: list[int] = []
    left, j = total, k
    for i in range(n - 1, -1, -1):
        if j == 0:
            break
        s = sizes[i]
        if left >= s and (history[i][j - 1] >> (left - s)) & 1:
            chosen.append(i)
            left -= s
            j -= 1
    chosen.reverse()
    return chosen, total


@dataclass(slots=True, kw_only=True)
class BFIOPolicy:
    """BF-IO (module docstring): ``horizon`` T (0 = ``bfio-h0``), discount ``gamma``, overflow
    weight ``beta``, ``greedy_slots`` (the greedy phase runs while more slots are free),
    ``max_candidates`` (the visible queue), a ``predictor`` for the remaining steps of running
    requests (``None``: no departures are forecast), ``features`` (set by :meth:`bind`) and
    ``deadline_s`` / ``ttft_slo_s`` (``None``: no pool deadline / first-token guard, as the
    paper; module docstring)."""

    horizon: int = 72
    gamma: float = 0.86
    alpha: float = 1.0
    beta: float = 43.0
    greedy_slots: int = 7
    max_candidates: int = 1024
    predictor: Predictor | None = None
    features: FeatureSource | None = None
    deadline_s: float | None = None
    ttft_slo_s: float | None = None
    name: str = "bfio"

    def __post_init__(self) -> None:
        if int(self.horizon) != self.horizon or self.horizon < 0:
            raise ValueError(f"{self.horizon=} must be an integer >= 0")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"{self.gamma=} must be in (0, 1]")
        if not (self.alpha > 0 and self.beta > 0):
            raise ValueError(f"{self.alpha=} and {self.beta=} must be > 0")
        if self.greedy_slots < 0 or self.max_candidates < 1:
            raise ValueError(f"{self.greedy_slots=} must be >= 0 and {self.max_candidates=} >= 1")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"{self.deadline_s=} must be > 0 (or None: no pool deadline)")
        if self.ttft_slo_s is not None and not self.ttft_slo_s > 0:
            raise ValueError(f"{self.ttft_slo_s=} must be > 0 (or None: no first-token guard)")

    def bind(self, workload: Workload) -> BFIOPolicy:
        """A copy whose request ids are rows of ``workload`` (the simulator's ids)."""
        return replace(self, features=RequestFeatures.from_workload(workload))

    def _projection(self, state: ClusterState) -> np.ndarray:
        """L̂ (G, T+1): current loads, minus each running request's s + a from its forecast
        departure step on (no growth: the paper's projection)."""
        t_max = int(self.horizon)
        loads = state.loads.astype(np.float64)
        proj = np.repeat(loads[:, None], t_max + 1, axis=1)
        n_act = state.active_age.shape[0]
        if t_max == 0 or self.predictor is None or n_act == 0:
            return proj
        if self.features is not None:
            feats = self.features.take(state.active_ids)
        else:
            feats = RequestFeatures(prompt_len=state.active_prompt)
        p_fin, mu_rem = self.predictor.predict(feats, state.active_age, t_max)
        dep = departure_steps(p_fin, mu_rem, t_max)  # 1..T+1 (T+1: stays the window)
        base = (state.active_prompt + state.active_age).astype(np.float64)
        gone = np.zeros((state.num_replicas, t_max + 2))
        np.add.at(gone, (state.active_replica, dep), base)
        return proj - np.cumsum(gone, axis=1)[:, : t_max + 1]

    def _scorer(self, proj: np.ndarray, g: int):
        """F_g(S) for replica g and the safe bound ⌊min_t m_g(t)⌋."""
        margin = np.maximum(proj.max(axis=0) - proj[g], 0.0)
        d = self.gamma ** np.arange(margin.shape[0], dtype=np.float64)
        ad = self.alpha * float(d.sum())

        def f(total: float) -> float:
            return ad * total - self.beta * float(d @ np.maximum(total - margin, 0.0))

        return f, int(np.floor(margin.min()))

    def assign(self, state: ClusterState, pool: PoolView) -> Assignment:
        """One BF-IO tick (module docstring)."""
        free = state.free_slots.astype(np.int64, copy=True)
        sizes = pool.prompt_len.astype(np.int64)
        alive = np.ones(len(pool), dtype=bool)
        out_i: list[int] = []
        out_g: list[int] = []
        if len(pool) == 0 or free.sum() == 0:
            return Assignment()
        proj = self._projection(state)

        def visible() -> np.ndarray:
            return np.flatnonzero(alive)[: self.max_candidates]

        def place(idx: list[int], g: int) -> None:
            for i in idx:
                alive[i] = False
                out_i.append(int(i))
                out_g.append(g)
            free[g] -= len(idx)
            proj[g] += float(sizes[idx].sum())

        # 0) the pool deadline (KV lease) and first-token guard, when set: oldest late first
        limits = [x for x in (self.deadline_s, urgency_scale(self.ttft_slo_s, pool.wait))
                  if x is not None and np.isfinite(x)]
        if limits:
            late = np.flatnonzero(pool.wait >= min(limits))
            for i in late[np.argsort(-pool.wait[late], kind="stable")]:
                open_g = np.flatnonzero(free > 0)
                if open_g.shape[0] == 0:
                    break
                scores = [self._scorer(proj, int(g))[0](float(sizes[i])) for g in open_g]
                best = max(range(open_g.shape[0]), key=lambda j: (scores[j], free[open_g[j]]))
                place([int(i)], int(open_g[best]))
        # 1) greedy phase
        while alive.any() and free.sum() > self.greedy_slots:
            open_g = np.flatnonzero(free == free.max())
            g = int(open_g[np.argmin(proj[open_g, 0])])
            f, _ = self._scorer(proj, g)
            cand = visible()
            scores = [f(float(s)) for s in sizes[cand]]
            place([int(cand[int(np.argmax(scores))])], g)
        if not alive.any() or free.sum() == 0:
            return Assignment(np.asarray(out_i, np.int64), np.asarray(out_g, np.int64))

        # 2) fine phase: min-heap of replicas by the blended current / end-of-window load
        lam = self._blend(state, proj)
        heap = [((1.0 - lam) * proj[g, 0] + lam * proj[g, -1], g) for g in np.flatnonzero(free > 0)]
        heapq.heapify(heap)
        rounds = min(1000, int(free.sum()))
        while heap and alive.any() and rounds > 0:
            rounds -= 1
            _, g = heapq.heappop(heap)
            g = int(g)
            f, safe = self._scorer(proj, g)
            cand = visible()
            cand_sizes = [int(s) for s in sizes[cand]]
            best: list[int] = []
            best_f = -np.inf
            for k in range(min(int(free[g]), len(cand)), 0, -1):
                found = best_sum_subset(cand_sizes, k, safe)
                if found is None:
                    continue
                pos, total = found
                value = f(float(total))
                if value > best_f:
                    best, best_f = [int(cand[p]) for p in pos], value
                    if total <= safe:
                        break
            if not best or best_f <= 0.0:
                scores = [f(float(s)) for s in cand_sizes]
                best = [int(cand[int(np.argmax(scores))])]
            place(best, g)
            if free[g] > 0:
                heapq.heappush(heap, ((1.0 - lam) * proj[g, 0] + lam * proj[g, -1], g))
        return Assignment(np.asarray(out_i, np.int64), np.asarray(out_g, np.int64))

    @staticmethod
    def _blend(state: ClusterState, proj: np.ndarray, tol: float = 1e-6) -> float:
        """λ = t_now / (t_now + τ̄·T_empty), τ̄ = mean step time so far, T_empty = the first step
        t ≥ 1 at which the projected envelope is empty (T if never; 0 when T = 0)."""
        env = proj[:, 1:].max(axis=0)
        if env.shape[0] == 0:
            steps_left = 0
        else:
            empty = np.flatnonzero(env <= tol)
            steps_left = int(empty[0]) + 1 if empty.shape[0] else env.shape[0]
        step_s = state.now / state.step if state.step > 0 else 0.0
        return float(np.clip(state.now / (state.now + steps_left * step_s + 1e-6), 0.0, 1.0))


def bfio_h0(**params: object) -> BFIOPolicy:
    """``bfio-h0``: BF-IO on current loads only (T = 0)."""
    return BFIOPolicy(**{"horizon": 0, "name": "bfio-h0", **params})  # type: ignore[arg-type]


def bfio_h0_lease(**params: object) -> BFIOPolicy:
    """``bfio-h0-lease``: ``bfio-h0`` held to what BR-0 keeps — the KV lease's pool deadline
    (``deadline_s`` = :attr:`DEFAULT_LEASE.deadline_s <balanceroute.core.lease.LeaseRule.deadline_s>`,
    25 s) and BR-0's first-token guard (``ttft_slo_s`` = 4 s), unless given. (The deadline used
    to be the lease itself, 30 s: a request was rescued only once it had already missed the
    lease, and each rescue freed a pool place for the next large prompt to starve — more misses
    than no deadline at all, whose few starved requests clog the pool for good.)"""
    return bfio_h0(**{"name": "bfio-h0-lease", "deadline_s": DEFAULT_LEASE.deadline_s,
                      "ttft_slo_s": 4.0, **params})
