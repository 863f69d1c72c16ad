"""The two-stage BalanceRoute tick (DESIGN §2), shared by BR-0 and BR-H.

Both policies run this one routine; they differ only in the projected loads they pass
(``(G, 1)`` current loads for BR-0, ``(G, H+1)`` projections for BR-H) and in (d, α, β).
With H = 0, d = (1,), α = 1, β = G the score is BR-0's ``F = Δ − G·(Δ − m)_+``.

The tick runs as one compiled kernel (:func:`_two_stage_kernel`, numba) that performs the
floating-point operations of the literal reference (``analysis/reference.py``) in the same
order, so its decisions equal the reference's exactly; without numba the numpy implementation
:func:`_two_stage_numpy` runs instead. The simulator, the proxy's ledger and the benchmarks all
reach the kernel through :func:`two_stage_assign` (or, in the simulator's fused loop, call it
directly): there is no second implementation on any hot path.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations

import numpy as np
from numpy.typing import NDArray

from ._jit import HAVE_NUMBA, njit
from .state import Assignment

__all__ = ["best_subset", "subset_masks", "two_stage_assign"]

_NO_GROWTH = np.zeros((0, 1), dtype=np.float64)  # writable: numba types read-only arrays apart


def _f64(values: NDArray) -> NDArray[np.float64]:
    """A C-contiguous, writable float64 array (one compiled specialisation for every caller)."""
    arr = np.ascontiguousarray(values, dtype=np.float64)
    return arr if arr.flags.writeable else arr.copy()


@lru_cache(maxsize=16)
def subset_masks(r: int) -> NDArray[np.float64]:
    """All non-empty subsets of ``r`` candidates as 0/1 rows, smallest subsets first."""
    rows = [
        [1.0 if j in combo else 0.0 for j in range(r)]
        for size in range(1, r + 1)
        for combo in combinations(range(r), size)
    ]
    masks = np.array(rows, dtype=np.float64).reshape(-1, r)
    masks.setflags(write=False)
    return masks


def _score(delta: NDArray, m: NDArray, d: NDArray, alpha: float, beta: float) -> NDArray:
    """Horizon F-score of Δ (any shape) against one replica's margin vector ``m`` (H+1,)."""
    if m.shape[0] == 1:  # BR-0 fast path: same formula with d = (1,)
        return alpha * d[0] * delta - beta * d[0] * np.maximum(delta - m[0], 0.0)
    over = np.maximum(delta[..., None] - m, 0.0)
    return alpha * d.sum() * delta - beta * (over @ d)


def best_subset(
    sizes: NDArray, m: NDArray, cap: int, d: NDArray, alpha: float, beta: float
) -> tuple[NDArray[np.int64], float]:
    """``Q* = argmax_{Q ⊆ candidates, 1 ≤ |Q| ≤ cap} F(Σ_{i∈Q} s_i)`` by enumeration.

    ``sizes`` are the candidates' prompt lengths. Returns the chosen positions within
    ``sizes`` (ties: the smaller, then lexicographically first subset) and F(Q*).
    """
    masks = subset_masks(sizes.shape[0])
    masks = masks[masks.sum(axis=1) <= cap]
    scores = _score(masks @ sizes, m, d, alpha, beta)
    best = int(np.argmax(scores))
    return np.flatnonzero(masks[best]).astype(np.int64), float(scores[best])


def two_stage_assign(
    proj_loads: NDArray,
    free_slots: NDArray,
    prompt_len: NDArray,
    wait: NDArray,
    *,
    d: NDArray,
    alpha: float,
    beta: float,
    s_greedy: int,
    r_max: int,
    deadline_s: float,
    growth: NDArray | None = None,
) -> Assignment:
    """One scheduling tick of BalanceRoute.

    ``proj_loads`` (G, H+1): projected loads L̂_g(h); ``free_slots`` (G,); pool columns
    ``prompt_len`` (P,) and ``wait`` (P,) seconds. ``growth`` (P, H+1), optional: what request i
    adds to L̂_g(h) beyond s_i once placed (BR-H's own growth of the new request); the score uses
    Δ·1 as DESIGN defines it, the projection update uses s_i + growth_i.

    Order: (0) requests that waited ``≥ deadline_s`` go first, oldest first, each to the replica
    with a free slot maximising F({i}) (ties: more free slots, larger margin); (1) while Σ free > ``s_greedy``, the replica with most free
    slots (ties: lower load) takes the request with the largest F({i}); (2) then the replica with
    the largest (free slots, margin m(0)) takes ``Q*`` among its ``r_max`` best single-request
    candidates, or — starvation guard — its best single request when F(Q*) ≤ 0. Every pop
    places at least one request, so the tick is work-conserving: it places min(Σ free, P).
    The score is ``F = α(1ᵀd)Δ − β Σ_h d_h (Δ − m_h)_+`` with the sums taken in h order.
    """
    if not HAVE_NUMBA:
        return _two_stage_numpy(
            proj_loads, free_slots, prompt_len, wait, d=d, alpha=alpha, beta=beta,
            s_greedy=s_greedy, r_max=r_max, deadline_s=deadline_s, growth=growth,
        )
    if int(r_max) < 1:
        raise ValueError(f"{r_max=} must be >= 1")
    loads = np.array(proj_loads, dtype=np.float64, order="C", copy=True)
    if loads.ndim != 2:
        raise ValueError(f"proj_loads must be (G, H+1), got shape {loads.shape}")
    free = np.array(free_slots, dtype=np.int64, copy=True)
    sizes = _f64(prompt_len)
    n_pool = sizes.shape[0]
    out_i = np.empty(n_pool, dtype=np.int64)
    out_g = np.empty(n_pool, dtype=np.int64)
    if growth is None:
        grow, has_growth = _NO_GROWTH, False
    else:
        grow, has_growth = _f64(growth), True
    count = _two_stage_kernel(
        loads, free, sizes, _f64(wait), _f64(d), float(alpha), float(beta), int(s_greedy),
        int(r_max), float(deadline_s), grow, has_growth, out_i, out_g,
    )
    return Assignment(pool_index=out_i[:count], replica=out_g[:count])


# --------------------------------------------------------------------------- compiled kernel
# The reference's arithmetic, in its order: F = (α·Σ_h d_h)·Δ − β·Σ_h d_h·max(Δ − m_h, 0) with
# m_h = M̂(h) − L̂_g(h) and both sums accumulated h = 0, 1, …. A term with Δ ≤ m_h adds ±0.0,
# which leaves the running sum unchanged, so skipping it is exact (this is what makes the pool
# scan cheap: only the horizon steps where some pooled request would overflow are visited).


@njit
def _score_one(delta, loads, env, g, d, ad, beta):  # pragma: no cover - compiled
    """F(Δ) on replica g."""
    total = 0.0
    for h in range(d.shape[0]):
        x = delta - (env[h] - loads[g, h])
        if x > 0.0:
            total += d[h] * x
    return ad * delta - beta * total


@njit
def _pool_scores(sizes, loads, env, g, d, ad, beta, smax, tot, out):  # pragma: no cover
    """out[j] = F({j}) on replica g for every pooled request j (dead ones included)."""
    n = sizes.shape[0]
    for j in range(n):
        tot[j] = 0.0
    for h in range(d.shape[0]):
        m = env[h] - loads[g, h]
        if m >= smax:  # no pooled request overflows this step's margin
            continue
        dh = d[h]
        for j in range(n):
            x = sizes[j] - m
            tot[j] += dh * (x if x > 0.0 else 0.0)
    for j in range(n):
        out[j] = ad * sizes[j] - beta * tot[j]


@njit
def _place(i, g, loads, env, sizes, growth, has_growth, free, alive):  # pragma: no cover
    """Request i joins replica g: L̂_g += s_i (+ growth_i); the envelope follows."""
    n_rep, width = loads.shape
    for h in range(width):
        add = sizes[i] + growth[i, h] if has_growth else sizes[i]
        loads[g, h] += add
        if add >= 0.0:
            if loads[g, h] > env[h]:
                env[h] = loads[g, h]
        else:  # a shrinking projection: recompute this step's envelope
            top = loads[0, h]
            for r in range(1, n_rep):
                if loads[r, h] > top:
                    top = loads[r, h]
            env[h] = top
    free[g] -= 1
    alive[i] = False


@njit
def _two_stage_kernel(
    loads, free, sizes, wait, d, alpha, beta, s_greedy, r_max, deadline_s, growth, has_growth,
    out_i, out_g,
):  # pragma: no cover - compiled; tested against the reference through two_stage_assign
    """The tick of :func:`two_stage_assign` on mutable copies ``loads`` (G, W) and ``free``;
    writes the decisions to ``out_i``/``out_g`` and returns how many there are."""
    n_rep, width = loads.shape
    n_pool = sizes.shape[0]
    total_d = 0.0
    for h in range(width):
        total_d += d[h]
    ad = alpha * total_d
    env = np.empty(width)
    for h in range(width):
        top = loads[0, h]
        for g in range(1, n_rep):
            if loads[g, h] > top:
                top = loads[g, h]
        env[h] = top
    free_sum = 0
    for g in range(n_rep):
        free_sum += free[g]
    remaining = min(free_sum, n_pool)
    if remaining <= 0:
        return 0
    smax = sizes[0]
    for j in range(1, n_pool):
        if sizes[j] > smax:
            smax = sizes[j]
    alive = np.ones(n_pool, dtype=np.bool_)
    tot = np.empty(n_pool)
    f1 = np.empty(n_pool)
    placed = 0

    # (0) pool deadline, oldest first (stable: ties keep pool order)
    n_late = 0
    for j in range(n_pool):
        if wait[j] >= deadline_s:
            n_late += 1
    if n_late > 0:
        late = np.empty(n_late, dtype=np.int64)
        k = 0
        for j in range(n_pool):
            if wait[j] >= deadline_s:
                late[k] = j
                k += 1
        order = np.argsort(-wait[late], kind="mergesort")
        for t in range(n_late):
            if placed == remaining:
                break
            i = late[order[t]]
            best_g = -1
            best_f = 0.0
            best_m = 0.0
            for g in range(n_rep):
                if free[g] <= 0:
                    continue
                f = _score_one(sizes[i], loads, env, g, d, ad, beta)
                m0 = env[0] - loads[g, 0]
                if (best_g < 0 or f > best_f
                        or (f == best_f and (free[g] > free[best_g]
                                             or (free[g] == free[best_g] and m0 > best_m)))):
                    best_g, best_f, best_m = g, f, m0
            _place(i, best_g, loads, env, sizes, growth, has_growth, free, alive)
            free_sum -= 1
            out_i[placed] = i
            out_g[placed] = best_g
            placed += 1

    # (1) plenty of room: the emptiest replica (ties: lower load) takes the best single request
    while placed < remaining and free_sum > s_greedy:
        g = -1
        for r in range(n_rep):
            if free[r] > 0 and (g < 0 or free[r] > free[g]
                                or (free[r] == free[g] and loads[r, 0] < loads[g, 0])):
                g = r
        _pool_scores(sizes, loads, env, g, d, ad, beta, smax, tot, f1)
        i = -1
        for j in range(n_pool):
            if alive[j] and (i < 0 or f1[j] > f1[i]):
                i = j
        _place(i, g, loads, env, sizes, growth, has_growth, free, alive)
        free_sum -= 1
        out_i[placed] = i
        out_g[placed] = g
        placed += 1

    # (2) scarce room: best subset of the top r_max candidates for the top replica
    cand = np.empty(max(r_max, 1), dtype=np.int64)
    idx = np.empty(max(r_max, 1), dtype=np.int64)
    best_q = np.empty(max(r_max, 1), dtype=np.int64)
    while placed < remaining:
        g = -1
        best_m = 0.0
        for r in range(n_rep):
            if free[r] <= 0:
                continue
            m0 = env[0] - loads[r, 0]
            if g < 0 or free[r] > free[g] or (free[r] == free[g] and m0 > best_m):
                g, best_m = r, m0
        _pool_scores(sizes, loads, env, g, d, ad, beta, smax, tot, f1)
        k = min(r_max, n_pool - placed)
        n_c = 0  # cand[:n_c]: best F({i}) first, ties in pool order
        for j in range(n_pool):
            if not alive[j]:
                continue
            v = f1[j]
            if n_c == k:
                if not v > f1[cand[k - 1]]:
                    continue
                pos = k - 1
            else:
                pos = n_c
                n_c += 1
            while pos > 0 and f1[cand[pos - 1]] < v:
                cand[pos] = cand[pos - 1]
                pos -= 1
            cand[pos] = j
        cap = min(free[g], k)
        best_f = -np.inf
        best_size = 0
        for size in range(1, cap + 1):  # subsets by size, then lexicographically
            for t in range(size):
                idx[t] = t
            while True:
                delta = 0.0
                for t in range(size):
                    delta += sizes[cand[idx[t]]]
                f = _score_one(delta, loads, env, g, d, ad, beta)
                if f > best_f:
                    best_f = f
                    best_size = size
                    for t in range(size):
                        best_q[t] = idx[t]
                t = size - 1
                while t >= 0 and idx[t] == k - size + t:
                    t -= 1
                if t < 0:
                    break
                idx[t] += 1
                for u in range(t + 1, size):
                    idx[u] = idx[u - 1] + 1
        if not best_f > 0.0:  # starvation guard: the best single request
            best_size = 1
            best_q[0] = 0
        for t in range(best_size):
            i = cand[best_q[t]]
            _place(i, g, loads, env, sizes, growth, has_growth, free, alive)
            free_sum -= 1
            out_i[placed] = i
            out_g[placed] = g
            placed += 1
    return placed


# ------------------------------------------------------------------------------ numpy path


def _two_stage_numpy(
    proj_loads: NDArray,
    free_slots: NDArray,
    prompt_len: NDArray,
    wait: NDArray,
    *,
    d: NDArray,
    alpha: float,
    beta: float,
    s_greedy: int,
    r_max: int,
    deadline_s: float,
    growth: NDArray | None = None,
) -> Assignment:
    """:func:`two_stage_assign` in numpy, for installs without numba (same decisions up to
    floating-point summation order, which BLAS may choose differently)."""
    loads = np.array(proj_loads, dtype=np.float64, copy=True)
    free = np.array(free_slots, dtype=np.int64, copy=True)
    sizes = np.asarray(prompt_len, dtype=np.float64)
    d = np.asarray(d, dtype=np.float64)
    n_pool = sizes.shape[0]
    alive = np.ones(n_pool, dtype=bool)
    pool_order = np.arange(n_pool)
    out_i: list[int] = []
    out_g: list[int] = []
    big = -np.inf

    def place(i: int, g: int) -> None:
        loads[g] += sizes[i] if growth is None else sizes[i] + growth[i]
        free[g] -= 1
        alive[i] = False
        out_i.append(i)
        out_g.append(g)

    def replica_margins(g: int) -> NDArray:
        return loads.max(axis=0) - loads[g]

    remaining = min(int(free.sum()), n_pool)

    # (0) pool deadline: the KV lease of a pooled request is about to expire.
    waited = np.asarray(wait, dtype=np.float64)
    late = np.flatnonzero(waited >= deadline_s)
    for i in late[np.argsort(-waited[late], kind="stable")]:
        if len(out_i) == remaining:
            break
        open_g = np.flatnonzero(free > 0)
        m_open = loads.max(axis=0) - loads[open_g]
        scores = alpha * d.sum() * sizes[i] - beta * (np.maximum(sizes[i] - m_open, 0.0) @ d)
        # best F; ties: more free slots, then larger margin m(0)
        best = np.lexsort((-m_open[:, 0], -free[open_g], -scores))[0]
        place(int(i), int(open_g[best]))

    # (1) plenty of room: greedy fill, largest F({i}) to the emptiest replica.
    while len(out_i) < remaining and free.sum() > s_greedy:
        open_g = np.flatnonzero(free == free.max())
        g = int(open_g[np.argmin(loads[open_g, 0])])
        f1 = _score(sizes, replica_margins(g), d, alpha, beta)
        f1[~alive] = big
        place(int(np.argmax(f1)), g)

    # (2) scarce room: best subset of the top r_max candidates for the top replica.
    while len(out_i) < remaining:
        open_g = np.flatnonzero(free == free.max())
        m0 = loads.max(axis=0)[0] - loads[open_g, 0]
        g = int(open_g[np.argmax(m0)])
        m = replica_margins(g)
        f1 = _score(sizes, m, d, alpha, beta)
        f1[~alive] = big
        k = min(r_max, n_pool - len(out_i))
        cand = np.lexsort((pool_order, -f1))[:k]  # best F({i}) first; ties: pool order
        chosen, best = best_subset(sizes[cand], m, min(int(free[g]), k), d, alpha, beta)
        if best <= 0.0:
            chosen = np.zeros(1, dtype=np.int64)  # starvation guard: best single request
        for j in chosen:
            place(int(cand[j]), g)

    return Assignment(
        pool_index=np.asarray(out_i, dtype=np.int64), replica=np.asarray(out_g, dtype=np.int64)
    )
