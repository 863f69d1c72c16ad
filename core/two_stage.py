"""The two-stage BalanceRoute tick, shared by BR-0 and BR-H.

Both policies run this one routine; they differ only in the projected loads they pass
(``(G, 1)`` current loads for BR-0, ``(G, H+1)`` projections for BR-H) and in (d, α, β).
With H = 0, d = (1,), α = 1, β = G the score is BR-0's ``F = Δ − G·(Δ − m)_+``.

The default score is the exact change of the discounted projected imbalance Σ_h d_h·I(h) when a
set Q joins a replica, each candidate contributing its own projected trajectory c_i(h) = s_i +
growth_i(h) (``papers/horizon_score.md``); ``score="paper"`` scores Δ·1 (candidates stay the
window without growing). An optional urgency bonus u_i = U·w_i/θ (U: the largest
single-request value in the pool; θ = :func:`urgency_scale`: ``ttft_slo_s``, or twice the pool's
median wait when that is shorter) makes waiting part of the decision (``papers/ttft.md``).

The tick runs as one compiled kernel (``_tick_kernels.two_stage_tick``, numba) that performs
the floating-point operations of the literal reference (``analysis/reference.py``) in the same
order, so its decisions equal the reference's exactly; with a horizon it finds a replica's best
single requests by a best-first search over the pool, in the order of each request's
no-overflow bound α·Σ_h d_h c_i(h) + u_i, and scores (with those operations) only the requests
whose bound still reaches the best score found — the same requests, ties included, as scoring
the whole pool over H + 1 steps per pop. Without numba the numpy implementation
:func:`_two_stage_numpy` runs instead. The simulator, the proxy's ledger and the benchmarks all
reach the kernel through :func:`two_stage_assign` (or, in the simulator's fused loop, call it
directly): there is no second implementation on any hot path.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from itertools import combinations

import numpy as np
from numpy.typing import NDArray

from ._jit import HAVE_NUMBA
from ._tick_kernels import BACKLOG_PER_REPLICA, FILL_LEVELS, FILL_WINDOW, lpt_batch
from ._tick_kernels import tick_workspace as _tick_workspace
from ._tick_kernels import two_stage_tick as _two_stage_tick
from .state import Assignment

__all__ = [
    "FILL_LEVELS", "FILL_WINDOW", "best_subset", "fill_level", "fill_proposals", "subset_masks",
    "pool_deadline", "two_stage_assign", "urgency_scale",
]

_NO_GROWTH = np.zeros((0, 1), dtype=np.float64)  # writable: numba types read-only arrays apart


def urgency_scale(ttft_slo_s: float | None, wait: NDArray) -> float:
    """θ, the first-token guard's wait scale (``papers/ttft.md``, "A guard relative to the
    pool"): ``min(ttft_slo_s, 2·w̃)``, w̃ the median wait of the pool, ``ttft_slo_s`` while
    w̃ = 0, ``inf`` when the guard is off. Under FIFO the pool's ages spread evenly over [0, W],
    W the FIFO wait, so 2·w̃ ≈ W: a request outranks any that merely fits once it has waited
    about as long as FIFO would have made it wait (the median, unlike the mean, is not pulled
    up by the few requests that starve)."""
    slo = float("inf") if ttft_slo_s is None else float(ttft_slo_s)
    w = np.asarray(wait, dtype=np.float64)
    mid = float(np.median(w)) if w.shape[0] else 0.0
    return min(slo, 2.0 * mid) if np.isfinite(slo) and slo > 0 and mid > 0 else slo


def pool_deadline(deadline_s: float, ttft_slo_s: float | None, wait: NDArray,
                  factor: float | None) -> float:
    """The wait from which a pooled request is placed first (stage 0 of the tick):
    ``deadline_s`` (the KV lease's), or — the *relative deadline*, with ``factor`` f — f·2·w̃
    when that comes sooner, w̃ the pool's median wait (``papers/ttft.md``, "A relative
    deadline"): a few times the wait FIFO would give, read from the pool, with no wall-clock
    constant (``ttft_slo_s`` stands in for 2·w̃ only while w̃ = 0). ``factor=None`` or the
    first-token guard off (``ttft_slo_s=None``): ``deadline_s``. The compiled tick and the fused
    loop compute the same in their kernel (``_tick_kernels._deadline_from``); this is the
    numpy path's."""
    if factor is None or ttft_slo_s is None:
        return float(deadline_s)
    w = np.asarray(wait, dtype=np.float64)
    mid = float(np.median(w)) if w.shape[0] else 0.0
    scale = 2.0 * mid if mid > 0 else float(ttft_slo_s)
    return min(float(deadline_s), float(factor) * scale)


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


def fill_proposals(
    qsize: list[int], k_lo: int, cap: int, safe_q: int, hi_q: int
) -> list[list[int]]:
    """The fill's candidate sets over items of quantised sizes ``qsize``: for k = cap, …, k_lo the
    exactly-k subset whose sum is the largest ≤ ``safe_q``, then the one whose sum is the smallest
    in (``safe_q``, ``hi_q``] (each when it exists), as ascending item positions.

    Subset sums are bitsets (Python ints; ``reach[k]`` holds the sums of k-subsets of the items
    seen so far, truncated at ``hi_q``); a subset is rebuilt from the last item back, taking an
    item whenever the sum left minus its size is reachable with k − 1 of the items before it."""
    mask = (1 << (hi_q + 1)) - 1
    reach = [1] + [0] * cap
    history = []
    for t, s in enumerate(qsize):
        history.append(reach[:cap])
        for k in range(min(t + 1, cap), 0, -1):
            reach[k] = (reach[k] | (reach[k - 1] << s)) & mask
    out: list[list[int]] = []
    for k in range(cap, k_lo - 1, -1):
        low = reach[k] & ((1 << (safe_q + 1)) - 1)
        high = reach[k] >> (safe_q + 1)
        for total in (low.bit_length() - 1 if low else -1,
                      safe_q + 1 + (high & -high).bit_length() - 1 if high else -1):
            if total < 0:
                continue
            chosen, left, j = [], total, k
            for t in range(len(qsize) - 1, -1, -1):
                if j == 0:
                    break
                if left >= qsize[t] and (history[t][j - 1] >> (left - qsize[t])) & 1:
                    chosen.append(t)
                    left -= qsize[t]
                    j -= 1
            out.append(chosen[::-1])
    return out


def fill_level(margin: NDArray, d: NDArray, alpha: float, beta: float) -> float:
    """The best constant fill of a margin profile ``margin`` (H+1,): the Δ maximising
    α·(Σ_h d_h)·Δ − β·Σ_h d_h·(Δ − m_h)_+ (concave, piecewise linear, kinks at the m_h). It is
    the smallest margin (ascending; ties: smaller h) at which the discount weight of the margins
    up to it reaches α·Σ d/β — the slope turns ≤ 0 there — or the largest margin if it never does.
    With H = 0 it is m_0 (``papers/fill.md``, "BR-H: the replica order")."""
    m = np.asarray(margin, dtype=np.float64)
    total = 0.0
    for dh in np.asarray(d, dtype=np.float64).tolist():  # Σ d in h order, as the kernel
        total += dh
    order = np.argsort(m, kind="stable")
    acc = 0.0
    for h in order.tolist():
        acc += float(d[h])
        if beta * acc >= alpha * total:
            return float(m[h])
    return float(m[order[-1]])


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
    score: str = "exact",
    stage1: str = "fit",
    growth_steps: float = 0.0,
    ttft_slo_s: float | None = None,
    fill_order: str = "level",
    lpt_batches: bool = False,
    weights: NDArray | None = None,
    offsets: NDArray | None = None,
    room: NDArray | None = None,
    cost: NDArray | None = None,
    deadline_factor: float | None = None,
) -> Assignment:
    """One scheduling tick of BalanceRoute.

    ``proj_loads`` (G, H+1): projected loads L̂_g(h); ``free_slots`` (G,); pool columns
    ``prompt_len`` (P,) and ``wait`` (P,) seconds. ``growth`` (P, H+1), optional: what request i
    adds to L̂_g(h) beyond s_i once placed, c_i(h) = s_i + growth_i(h) (BR-H's projection of the
    new request). The projection update always uses c_i; the score uses c_i with
    ``score="exact"`` and Δ·1 with ``score="paper"`` (identical without ``growth``).

    Score of a set Q on replica g, δ(h) = Σ_{i∈Q} c_i(h):
    ``F = α Σ_h d_h δ(h) − β Σ_h d_h (δ(h) − m_h)_+ + Σ_{i∈Q} u_i`` (sums in h order), with
    u_i = U·w_i/``ttft_slo_s`` (U = max_j of the linear term of F({j})) or 0 when the knob is off.

    Order: (0) requests that waited ``≥ deadline_s`` go first — or ``≥ deadline_factor`` times
    twice the pool's median wait when that is sooner and ``ttft_slo_s`` is set
    (:func:`pool_deadline`, the relative deadline) — oldest first, each to the replica
    with a free slot maximising F({i}) (ties: more free slots, larger margin); (1) while Σ free >
    ``s_greedy``: the replica with the largest margin ``growth_steps`` (T) steps ahead,
    m(0) + T·free (a replica running fewer requests grows slower; ties: more free slots) —
    ``stage1="paper"``: with most free slots (ties: lower load) — takes the request with the
    largest F({i}) + u_i; (2) then, with ``r_max`` ≥ 1 (the paper's Stage 2), the replica with
    the largest (free slots, margin m(0)) takes ``Q*`` among its ``r_max`` best single-request
    candidates, or — starvation guard — its best single request when F(Q*) ≤ 0.

    ``r_max = 0`` is the *fill* tick (``papers/fill.md``): in (2) the replica with the largest
    fill level :func:`fill_level` of its margins m(h) (``fill_order="margin"``: the largest m(0);
    the two agree when H = 0; ties: more free slots) takes the best, by F(Q) + Σ u_i, of an exact
    subset-sum search over the first ``FILL_WINDOW`` pooled requests — for each size k from its free slots
    (capped by what is left to place) down to free slots − the tick's slack, the k-set with the
    largest sum ≤ ⌊min_h m(h)⌋ and the one with the smallest sum above it (≤ 2⌊min_h m(h)⌋; sizes in
    quanta of 1 + 2⌊min_h m(h)⌋ // ``FILL_LEVELS`` tokens) — or its best single request when that
    is better (only if k may be 1) or when nothing scores > 0; and with ``stage1="fit"`` Stage 1
    uses the paper's rule while the pool holds ≥ 2G requests. Every pop places at least one
    request, so the tick is work-conserving: it places min(Σ free, P).

    ``lpt_batches`` (on in BR-0 and BR-H; ``papers/quality.md``): when the tick places a small batch
    whole in Stage 1 — fewer than 2G pooled requests and Σ free − P ≥ ``s_greedy`` — it is
    checked against LPT (largest prompt first, each to the least-loaded replica with a free
    slot; ties: more free slots, lower index; :func:`~balanceroute.core._tick_kernels.lpt_batch`),
    whose plan replaces it when it overflows the current envelope less: Σ_g (L'_g − max L)_+
    on the current loads L (column h = 0).

    Replicas of different speed: ``weights`` w_g = a_g/a_ref and ``offsets`` o_g
    (G,) put the loads in step time, in tokens of the reference replica: L'_g(h) = w_g·L̂_g(h) +
    o_g, so that τ_g = b_ref + a_ref·L'_g; a request adds w_g·c_i(h) to it. Margins, envelope,
    the replica orders and LPT are taken on L', and a set's score on replica g is
    w_g·F_g(Q; m'_g/w_g) — F in g's own tokens against its time margin (Stage 1, Stage 2 and the
    fill compare sets on one replica, so only the pool deadline's choice of replica sees the
    factor w_g). ``None``: §1's token form exactly.
    KV budgets: ``room`` (G, K) — what each replica may still take in each step of
    the budget window — and ``cost`` (P, K) — what pooled request i takes of it: a set Q may join
    replica g only while Σ_{i∈Q} cost_i(h) ≤ room_g(h) for every h; a replica where nothing
    fits closes for the tick, and a late request that fits nowhere stays pooled. ``None``: no
    budget. The small-batch LPT check is off under a budget (LPT knows none).
    """
    if score not in ("exact", "paper"):
        raise ValueError(f"{score=} must be 'exact' or 'paper'")
    if stage1 not in ("fit", "paper"):
        raise ValueError(f"{stage1=} must be 'fit' or 'paper'")
    if fill_order not in ("level", "margin"):
        raise ValueError(f"{fill_order=} must be 'level' or 'margin'")
    slo = float("inf") if ttft_slo_s is None else float(ttft_slo_s)
    if not slo > 0:
        raise ValueError(f"{ttft_slo_s=} must be > 0 (or None: off)")
    if deadline_factor is not None and not (deadline_factor > 0 and np.isfinite(deadline_factor)):
        raise ValueError(f"{deadline_factor=} must be a finite number > 0 (or None: off)")
    if not HAVE_NUMBA:
        return _two_stage_numpy(
            proj_loads, free_slots, prompt_len, wait, d=d, alpha=alpha, beta=beta,
            s_greedy=s_greedy, r_max=r_max,
            deadline_s=pool_deadline(deadline_s, ttft_slo_s, wait, deadline_factor),
            growth=growth, score=score,
            stage1=stage1, growth_steps=growth_steps, ttft_slo_s=ttft_slo_s, fill_order=fill_order,
            lpt_batches=lpt_batches, weights=weights, offsets=offsets, room=room, cost=cost,
        )
    if int(r_max) < 0:
        raise ValueError(f"{r_max=} must be >= 0 (0: the fill)")
    loads = np.array(proj_loads, dtype=np.float64, order="C", copy=True)
    if loads.ndim != 2:
        raise ValueError(f"proj_loads must be (G, H+1), got shape {loads.shape}")
    lim = tick_limits(loads, prompt_len, weights, offsets, room, cost)
    free = np.array(free_slots, dtype=np.int64, copy=True)
    sizes = _f64(prompt_len)
    n_pool = sizes.shape[0]
    out_i = np.empty(n_pool, dtype=np.int64)
    out_g = np.empty(n_pool, dtype=np.int64)
    if growth is None:
        grow, has_growth = _NO_GROWTH, False
    else:
        grow, has_growth = _f64(growth), True
    count = _two_stage_tick(
        loads, free, sizes, _f64(wait), _f64(d), float(alpha), float(beta), int(s_greedy),
        int(r_max), float(deadline_s), float("inf") if deadline_factor is None else float(deadline_factor),
        grow, has_growth, score == "exact", stage1 == "fit",
        float(growth_steps), slo, fill_order == "level", bool(lpt_batches), out_i, out_g, lim,
        _workspace(loads.shape[0], loads.shape[1], n_pool, int(r_max)),
    )
    return Assignment(pool_index=out_i[:count], replica=out_g[:count])


_THREAD = threading.local()


def _workspace(n_rep: int, width: int, n_pool: int, r_max: int) -> tuple:
    """The tick's scratch arrays (``tick_workspace``) for this thread and (G, W, ``r_max``) —
    BR-H ticks at W = H + 1 and checks BR-0's plan at W = 1 — kept while the pool fits (grown
    to the next power of two when it does not; at most 8 shapes kept)."""
    work = getattr(_THREAD, "work", None)
    if work is None:
        work = _THREAD.work = {}
    key = (n_rep, width, r_max)
    kept = work.get(key)
    if kept is None or kept[0] < n_pool:
        if len(work) >= 8:
            work.clear()
        cap = max(16, 1 << max(n_pool - 1, 0).bit_length())
        kept = work[key] = (cap, _tick_workspace(n_rep, width, cap, r_max))
    return kept[1]


def tick_limits(loads: NDArray, prompt_len: NDArray, weights: NDArray | None,
                offsets: NDArray | None, room: NDArray | None,
                cost: NDArray | None) -> tuple[NDArray, NDArray, NDArray, NDArray]:
    """The kernel's ``lim`` = (w, 1/w, room, cost); puts ``loads`` (G, W, a writable float copy)
    in step time in place (L' = w·L + o) when ``weights`` are given."""
    g_count, n_pool = loads.shape[0], np.shape(prompt_len)[0]
    if weights is None:
        w = np.ones(g_count)
    else:
        w = _f64(weights)
        if w.shape != (g_count,) or not np.all(w > 0) or not np.all(np.isfinite(w)):
            raise ValueError(f"{weights=} must be one finite number > 0 per replica")
        loads *= w[:, None]
        if offsets is not None:
            loads += _f64(offsets)[:, None]
    if (room is None) != (cost is None):
        raise ValueError("room and cost come together (a KV budget) or not at all")
    if room is None:
        kv_room, kv_cost = np.zeros((g_count, 0)), np.zeros((n_pool, 0))
    else:
        kv_room, kv_cost = _f64(room).copy(), _f64(cost)
        if kv_room.ndim != 2 or kv_room.shape[0] != g_count or kv_cost.shape != (n_pool, kv_room.shape[1]):
            raise ValueError(f"room {kv_room.shape} and cost {kv_cost.shape} must be (G, K) and (P, K)")
    return w, 1.0 / w, kv_room, kv_cost


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
    score: str = "exact",
    stage1: str = "fit",
    growth_steps: float = 0.0,
    ttft_slo_s: float | None = None,
    fill_order: str = "level",
    lpt_batches: bool = False,
    weights: NDArray | None = None,
    offsets: NDArray | None = None,
    room: NDArray | None = None,
    cost: NDArray | None = None,
) -> Assignment:
    """:func:`two_stage_assign` in numpy, for installs without numba (same decisions up to
    floating-point summation order, which BLAS may choose differently)."""
    if int(r_max) < 0:
        raise ValueError(f"{r_max=} must be >= 0 (0: the fill)")
    loads = np.array(proj_loads, dtype=np.float64, copy=True)
    free = np.array(free_slots, dtype=np.int64, copy=True)
    sizes = np.asarray(prompt_len, dtype=np.float64)
    d = np.asarray(d, dtype=np.float64)
    n_pool = sizes.shape[0]
    w, iw, kv_room, kv_cost = tick_limits(loads, prompt_len, weights, offsets, room, cost)
    budget = kv_room.shape[1] > 0
    exact = score == "exact" and growth is not None
    # c[i, h]: what request i adds to L̂(h) once placed
    contrib = sizes[:, None] + (np.zeros((n_pool, d.shape[0])) if growth is None else growth)
    value = alpha * (contrib @ d) if exact else alpha * d.sum() * sizes  # linear term of F({i})
    waited = np.asarray(wait, dtype=np.float64)
    slo = urgency_scale(ttft_slo_s, waited)
    bonus = value.max() * (waited / slo) if np.isfinite(slo) and n_pool else np.zeros(n_pool)
    alive = np.ones(n_pool, dtype=bool)
    pool_order = np.arange(n_pool)
    out_i: list[int] = []
    out_g: list[int] = []

    def place(i: int, g: int) -> None:
        loads[g] += (contrib[i] if growth is not None else sizes[i]) * w[g]
        kv_room[g] -= kv_cost[i]
        free[g] -= 1
        alive[i] = False
        out_i.append(i)
        out_g.append(g)

    def replica_margins(g: NDArray | int) -> NDArray:
        return loads.max(axis=0) - loads[g]

    def token_margins(g: int) -> NDArray:
        """Replica g's margins in its own tokens (step-time margin / w_g)."""
        return replica_margins(g) * iw[g]

    def fits(g: int) -> NDArray:
        """Which pooled requests fit replica g's KV room (all, without a budget)."""
        return np.all(kv_cost <= kv_room[g], axis=1)

    def close(g: int) -> int:
        """Nothing fits g: it closes for the tick; returns the new number to place."""
        free[g] = 0
        return len(out_i) + min(int(free.sum()), n_pool - len(out_i))

    def scores(traj: NDArray, m: NDArray) -> NDArray:
        """F of trajectories ``traj`` (..., H+1) against margins ``m`` (..., H+1)."""
        return alpha * (traj @ d) - beta * (np.maximum(traj - m, 0.0) @ d)

    def single_traj() -> NDArray:
        return contrib if exact else sizes[:, None] * np.ones_like(d)

    remaining = min(int(free.sum()), n_pool)
    batch = (lpt_batches and n_pool < BACKLOG_PER_REPLICA * loads.shape[0]
             and int(free.sum()) - n_pool >= s_greedy and not budget)
    loads0, free0 = loads[:, 0].copy(), free.copy()

    # (0) pool deadline: the KV lease of a pooled request is about to expire.
    late = np.flatnonzero(waited >= deadline_s)
    for i in late[np.argsort(-waited[late], kind="stable")]:
        if len(out_i) == remaining:
            break
        open_g = np.flatnonzero(free > 0)
        if budget:
            open_g = open_g[np.all(kv_cost[i] <= kv_room[open_g], axis=1)]
            if open_g.shape[0] == 0:  # it fits nowhere now: stays pooled
                continue
        m_open = replica_margins(open_g)
        f = scores(single_traj()[i][None, :], m_open * iw[open_g, None]) * w[open_g]
        # best F (in step time); ties: more free slots, then larger margin m(0)
        best = np.lexsort((-m_open[:, 0], -free[open_g], -f))[0]
        place(int(i), int(open_g[best]))

    # (1) plenty of room: one replica at a time takes its best single request.
    while len(out_i) < remaining and free.sum() > s_greedy:
        open_g = np.flatnonzero(free > 0)
        # (the fill tick, r_max = 0, spreads by free slots while the pool has ≥ 2G requests)
        if stage1 == "fit" and not (r_max == 0 and n_pool >= BACKLOG_PER_REPLICA * loads.shape[0]):
            m0 = (loads.max(axis=0)[0] - loads[open_g, 0]) + growth_steps * free[open_g]
            g = int(open_g[np.lexsort((-free[open_g], -m0))[0]])
        else:  # the paper's rule: most free slots, ties: lower load
            open_g = np.flatnonzero(free == free.max())
            g = int(open_g[np.argmin(loads[open_g, 0])])
        ok = alive & fits(g)
        if not ok.any():
            remaining = close(g)
            continue
        f1 = scores(single_traj(), token_margins(g)) + bonus
        f1[~ok] = -np.inf
        place(int(np.argmax(f1)), g)
    if batch:  # everything is placed: LPT instead, if it overflows the envelope less
        out = (np.asarray(out_i, dtype=np.int64), np.asarray(out_g, dtype=np.int64))
        lpt_batch(loads0, free0, sizes, *out, len(out_i), w)
        return Assignment(pool_index=out[0], replica=out[1])

    # (2') the fill: exact subset sums over the pool, replicas by fill level (r_max = 0)
    while r_max == 0 and len(out_i) < remaining:
        open_g = np.flatnonzero(free > 0)
        if fill_order == "level" and loads.shape[1] > 1:
            m0 = np.array([fill_level(replica_margins(int(r)), d, alpha, beta) for r in open_g])
        else:  # (with H = 0 the fill level is m(0))
            m0 = loads.max(axis=0)[0] - loads[open_g, 0]
        g = int(open_g[np.lexsort((-free[open_g], -m0))[0]])  # largest; ties: more free slots
        ok = alive & fits(g)
        if not ok.any():
            remaining = close(g)
            continue
        m = token_margins(g)
        f1 = scores(single_traj(), m) + bonus
        f1[~ok] = -np.inf
        single = int(np.argmax(f1))
        best_q, best_f = [single], float(f1[single])
        # every slot but the tick's slack is filled this tick: g takes at least free[g] − slack
        k_lo = max(1, int(free[g]) - (int(free.sum()) - (remaining - len(out_i))))
        safe = int(np.floor(m.min())) if m.min() > 0.0 else 0
        hi = 2 * safe
        if budget:  # sums above the room cannot fit
            extra = max(0.0, float((kv_cost[:, 0] - sizes).max()))
            lim_s = kv_room[g, 0] - min(int(free[g]), remaining - len(out_i)) * extra
            top = int(np.floor(lim_s)) if lim_s > 0.0 else 0
            safe, hi = min(safe, top), min(hi, top)
        if safe > 0:
            quantum = 1 + hi // FILL_LEVELS
            qsize = -(-np.ceil(sizes).astype(np.int64) // quantum)
            items = [j for j in np.flatnonzero(ok) if qsize[j] <= hi // quantum]
            items = items[:FILL_WINDOW]
            cap = min(int(free[g]), remaining - len(out_i), len(items))
            props = fill_proposals([int(qsize[j]) for j in items], k_lo, cap, safe // quantum,
                                   hi // quantum) if cap >= k_lo else []
            f_best_prop, q_prop = -np.inf, None
            for prop in props:
                q = np.array([items[t] for t in prop], dtype=np.int64)
                if budget and not np.all(kv_cost[q].sum(axis=0) <= kv_room[g]):
                    continue
                f = float(scores(single_traj()[q].sum(axis=0), m) + bonus[q].sum())
                if f > f_best_prop:
                    f_best_prop, q_prop = f, q.tolist()
            if q_prop is not None and (k_lo > 1 or not f1[single] > f_best_prop):
                best_q, best_f = q_prop, f_best_prop
        if not best_f > 0.0:  # starvation guard: the best single request
            best_q = [single]
        for i in best_q:
            place(int(i), g)

    # (2) scarce room: best subset of the top r_max candidates for the top replica.
    while len(out_i) < remaining:
        open_g = np.flatnonzero(free == free.max())
        m0 = loads.max(axis=0)[0] - loads[open_g, 0]
        g = int(open_g[np.argmax(m0)])
        ok = alive & fits(g)
        if not ok.any():
            remaining = close(g)
            continue
        m = token_margins(g)
        f1 = scores(single_traj(), m) + bonus
        f1[~ok] = -np.inf
        k = min(r_max, int(ok.sum()))
        cand = np.lexsort((pool_order, -f1))[:k]  # best F({i}) + u_i first; ties: pool order
        masks = subset_masks(k)
        masks = masks[masks.sum(axis=1) <= min(int(free[g]), k)]
        f_q = scores(masks @ single_traj()[cand], m) + masks @ bonus[cand]
        if budget:  # a set that overflows the room is no candidate
            f_q[~np.all(masks @ kv_cost[cand] <= kv_room[g], axis=1)] = -np.inf
        best = int(np.argmax(f_q))
        chosen = np.flatnonzero(masks[best]) if f_q[best] > 0.0 else np.zeros(1, dtype=np.int64)
        for j in chosen:  # (else: starvation guard, the best single request)
            place(int(cand[j]), g)

    return Assignment(
        pool_index=np.asarray(out_i, dtype=np.int64), replica=np.asarray(out_g, dtype=np.int64)
    )
