"""The numba kernels of a policy's compiled tick: the two-stage tick and the FIFO chooser.

* :func:`two_stage_tick` — the tick of :func:`~balanceroute.core.two_stage.two_stage_assign`
  (with :func:`lpt_batch`, its check of small batches) on a :func:`tick_workspace` its caller
  keeps (the fused loop one per run, ``two_stage_assign`` one per thread), so a tick allocates
  nothing;
* :func:`fill_singles` — that tick's decisions on a full cluster (:func:`singles_apply`: every
  free slot on its own replica), in one pass over the pool per placement;
* :func:`fifo_choose` — the FIFO baselines' choice of replica, by the key each one declares.

The policies call them directly, and the simulator's fused loop (:mod:`._kernels`) links them
into itself; nothing here knows the loop. No fastmath anywhere: every floating-point operation
keeps its written order, which is what makes the results equal to the references bit for bit.
"""

from __future__ import annotations

import numpy as np

from ._jit import njit

LOAD, ACTIVE, TURN = 0, 1, 2
"""Replica features a FIFO key ranks by: KV tokens L_g, running requests n_g, and the turn
(g − cursor) mod G (0 for the replica after the last one chosen)."""


# -------------------------------------------------------------------------- two-stage tick
# The reference's arithmetic, in its order. A candidate set Q on replica g contributes
# δ(h) = Σ_{i∈Q} c_i(h) to L̂_g(h); the score is
#     F = α·Σ_h d_h·δ(h) − β·Σ_h d_h·max(δ(h) − m_h, 0) + Σ_{i∈Q} u_i,   m_h = M̂(h) − L̂_g(h),
# with both sums accumulated h = 0, 1, …. ``exact`` scores c_i(h) = s_i + growth_i(h) (the
# candidate's own projected trajectory: s_i + h while it stays, 0 after); otherwise c_i(h) = s_i
# (the paper's form, computed as (α·Σ_h d_h)·Δ − β·Σ…). u_i is the urgency bonus (0 when off).
# A term with δ ≤ m_h adds ±0.0, which leaves the running sum unchanged, so skipping it is exact
# (BR-0's pool scan visits only the steps where some pooled request would overflow; with a
# horizon the best single requests are found by the best-first search below, which scores only
# the requests that might still beat the best found).


@njit
def _score_one(delta, loads, env, g, d, ad, beta, lim):  # pragma: no cover - compiled
    """The paper's F(Δ) on replica g."""
    total = 0.0
    for h in range(d.shape[0]):
        x = delta - (env[h] - loads[g, h]) * lim[1][g]
        if x > 0.0:
            total += d[h] * x
    return ad * delta - beta * total


@njit
def _score_traj(traj, loads, env, g, d, alpha, beta, lim):  # pragma: no cover - compiled
    """The exact F of a contribution trajectory ``traj`` (W,) on replica g."""
    lin = 0.0
    total = 0.0
    for h in range(d.shape[0]):
        lin += d[h] * traj[h]
        x = traj[h] - (env[h] - loads[g, h]) * lim[1][g]
        if x > 0.0:
            total += d[h] * x
    return alpha * lin - beta * total


@njit
def _single(i, g, loads, env, sizes, growth, d, alpha, ad, beta, exact, traj,
            lim):  # pragma: no cover - compiled
    """F({i}) on replica g (without the urgency bonus), in replica g's token units."""
    if not exact:
        return _score_one(sizes[i], loads, env, g, d, ad, beta, lim)
    for h in range(d.shape[0]):
        traj[h] = sizes[i] + growth[i, h]
    return _score_traj(traj, loads, env, g, d, alpha, beta, lim)


@njit
def _pool_scores(sizes, growth, exact, lin, cmax, loads, env, g, d, alpha, ad, beta, bonus,
                 tot, out, lim):  # pragma: no cover - compiled
    """out[j] = F({j}) + u_j on replica g for every pooled request j (dead ones included)."""
    n = sizes.shape[0]
    for j in range(n):
        tot[j] = 0.0
    for h in range(d.shape[0]):
        m = (env[h] - loads[g, h]) * lim[1][g]
        if m >= cmax[h]:  # no pooled request overflows this step's margin
            continue
        dh = d[h]
        if exact:
            for j in range(n):
                x = (sizes[j] + growth[j, h]) - m
                tot[j] += dh * (x if x > 0.0 else 0.0)
        else:
            for j in range(n):
                x = sizes[j] - m
                tot[j] += dh * (x if x > 0.0 else 0.0)
    for j in range(n):
        if exact:
            out[j] = (alpha * lin[j] - beta * tot[j]) + bonus[j]
        else:
            out[j] = (ad * sizes[j] - beta * tot[j]) + bonus[j]


# Best-first search over the pool (a horizon, W > 1). Every F({j}) + u_j is at most its bound
# ub_j = α·Σ_h d_h c_j(h) + u_j (exact; (α·Σ d)·s_j + u_j for the paper's form), the score with
# no overflow: with β ≥ 0 and d ≥ 0 the overflow sum is ≥ 0, and rounded subtraction and addition
# are monotone, so the computed F never exceeds the computed ub, and equals it when nothing
# overflows. Visiting the pool once per tick in ub order (ties: pool order) and stopping at the
# first ub below the best F found (the k-th best, for Stage 2's candidates) finds exactly the
# requests — ties included — that the full scan finds, each visited one scored with the full
# scan's operations in its order. The top of the order usually fits the replica (its F is its
# ub), so a pop scores a handful of requests where the scan scored all P over H + 1 steps.


@njit
def _values(sizes, growth, d, lin):  # pragma: no cover - compiled
    """lin[j] = Σ_h d_h·(s_j + growth_j(h)), summed h = 0, 1, … (four requests at a time: the
    same operations per request, in independent chains)."""
    n, width = growth.shape
    j = 0
    while j + 4 <= n:
        a0 = a1 = a2 = a3 = 0.0
        for h in range(width):
            dh = d[h]
            a0 += dh * (sizes[j] + growth[j, h])
            a1 += dh * (sizes[j + 1] + growth[j + 1, h])
            a2 += dh * (sizes[j + 2] + growth[j + 2, h])
            a3 += dh * (sizes[j + 3] + growth[j + 3, h])
        lin[j], lin[j + 1], lin[j + 2], lin[j + 3] = a0, a1, a2, a3
        j += 4
    for r in range(j, n):
        acc = 0.0
        for h in range(width):
            acc += d[h] * (sizes[r] + growth[r, h])
        lin[r] = acc


@njit
def _largest_contribution(sizes, growth, exact, cmax):  # pragma: no cover - compiled
    """cmax[h] = max_j c_j(h): the pool scan skips the steps where no request overflows."""
    for h in range(cmax.shape[0]):
        top = sizes[0] + growth[0, h] if exact else sizes[0]
        for j in range(1, sizes.shape[0]):
            c = sizes[j] + growth[j, h] if exact else sizes[j]
            if c > top:
                top = c
        cmax[h] = top


@njit
def _median(x, buf):  # pragma: no cover - compiled
    """``np.median(x)`` (P ≥ 1, no NaN) without allocating: a quickselect on the copy in ``buf``;
    the same order statistics, so the same value, (a + b) / 2 for an even P as numpy and numba
    compute it."""
    up = down = True  # a pool in the order its requests joined has its waits sorted already
    for j in range(1, x.shape[0]):
        up = up and x[j - 1] <= x[j]
        down = down and x[j - 1] >= x[j]
    return _median_known(x, buf, up or down)


@njit
def _median_known(x, buf, ordered):  # pragma: no cover - compiled
    """:func:`_median` of ``x`` when the caller knows whether ``x`` is monotone (``ordered``:
    non-decreasing or non-increasing, then the middle elements are order statistics half − 1
    and half and are read directly)."""
    n = x.shape[0]
    half = n >> 1
    if ordered:
        return x[half] if n & 1 else (x[half - 1] + x[half]) / 2
    for j in range(n):
        buf[j] = x[j]
    lo, hi = 0, n - 1
    while lo < hi:  # Hoare's selection of buf[half]: everything left of it ≤, right of it ≥
        pivot = buf[(lo + hi) >> 1]
        i, j = lo, hi
        while i <= j:
            while buf[i] < pivot:
                i += 1
            while buf[j] > pivot:
                j -= 1
            if i <= j:
                buf[i], buf[j] = buf[j], buf[i]
                i += 1
                j -= 1
        if half <= j:
            hi = j
        elif half >= i:
            lo = i
        else:
            break
    upper = buf[half]
    if n & 1:
        return upper
    lower = buf[0]
    for j in range(1, half):  # the largest of the lower half: order statistic half − 1
        if buf[j] > lower:
            lower = buf[j]
    return (lower + upper) / 2


@njit(inline="always")
def _pool_median(ttft_slo_s, wait, spare):  # pragma: no cover - compiled
    """w̃, the pool's median wait, where the first-token guard reads it (``ttft_slo_s`` finite
    and > 0, a pooled request), else 0: the one median a tick takes, for the guard's scale θ
    (:func:`_scale_from`) and the relative deadline (:func:`_deadline_from`). ``spare`` (P,):
    the median's scratch."""
    if ttft_slo_s > 0.0 and ttft_slo_s < np.inf and wait.shape[0] > 0:
        return _median(wait, spare)
    return 0.0


@njit(inline="always")
def _pool_median_known(ttft_slo_s, wait, spare, ordered):  # pragma: no cover - compiled
    """:func:`_pool_median` when the caller knows whether the waits are monotone
    (:func:`_median_known`; the fused loop learns it while it writes them)."""
    if ttft_slo_s > 0.0 and ttft_slo_s < np.inf and wait.shape[0] > 0:
        return _median_known(wait, spare, ordered)
    return 0.0


@njit(inline="always")
def _scale_from(ttft_slo_s, mid_wait):  # pragma: no cover - compiled
    """θ, the first-token guard's scale, from the pool's median wait w̃ (:func:`_pool_median`):
    min(``ttft_slo_s``, 2·w̃) while w̃ > 0 (:func:`~balanceroute.core.two_stage.urgency_scale`)."""
    if ttft_slo_s > 0.0 and ttft_slo_s < np.inf and mid_wait > 0.0:
        ttft_slo_s = min(ttft_slo_s, 2.0 * mid_wait)
    return ttft_slo_s


@njit(inline="always")
def _guard_scale(ttft_slo_s, wait, spare):  # pragma: no cover - compiled
    """θ of the pool ``wait`` (:func:`_scale_from` of :func:`_pool_median`)."""
    return _scale_from(ttft_slo_s, _pool_median(ttft_slo_s, wait, spare))


@njit(inline="always")
def _deadline_from(deadline_s, factor, ttft_slo_s, mid_wait):  # pragma: no cover - compiled
    """The pool deadline with the relative deadline ``factor`` f (``inf``: off), from the pool's
    median wait w̃ (:func:`_pool_median`): min(``deadline_s``, f·2·w̃) (``ttft_slo_s`` instead of
    2·w̃ while w̃ = 0), while the first-token guard is on."""
    if factor < np.inf and ttft_slo_s > 0.0 and ttft_slo_s < np.inf:
        scale = 2.0 * mid_wait if mid_wait > 0.0 else ttft_slo_s
        deadline_s = min(deadline_s, factor * scale)
    return deadline_s


@njit
def relative_deadline(deadline_s, factor, ttft_slo_s, wait, spare):  # pragma: no cover - compiled
    """The tick's pool deadline with the relative deadline ``factor`` f (``inf``: off):
    min(``deadline_s``, f·2·w̃), w̃ the pool's median wait (``ttft_slo_s`` instead of 2·w̃ while
    w̃ = 0), while the first-token guard is on — what
    :func:`~balanceroute.core.two_stage.pool_deadline` computes (the compiled tick and the
    fused loop take w̃ once, :func:`_pool_median`, and share it with θ; ``spare`` (P,): the
    median's scratch)."""
    if factor < np.inf:
        return _deadline_from(deadline_s, factor, ttft_slo_s, _pool_median(ttft_slo_s, wait, spare))
    return deadline_s


@njit
def _pool_setup(sizes, growth, wait, d, alpha, ad, beta, exact, theta, lin, bonus, ub_buf,
                cmax, order, count):  # pragma: no cover - compiled
    """A tick's constants of the pool (P ≥ 1), written into the workspace's ``lin``, ``bonus``,
    ``ub_buf`` (P,), ``cmax`` (W,), ``order`` (2, P) and ``count`` (2,): each request's own value
    lin_j = Σ_h d_h c_j(h) (exact), the urgency bonus u_j (``theta``: the guard's scale θ,
    :func:`_guard_scale`), the bound ub_j, and either the bound order of the best-first search
    (``prune``: a horizon and a valid bound) or the pool scan's ``cmax``. Returns (ub, prune)."""
    n_pool = sizes.shape[0]
    if exact:
        _values(sizes, growth, d, lin)
    else:
        for j in range(n_pool):
            lin[j] = 0.0
    for j in range(n_pool):
        bonus[j] = 0.0
    if theta > 0.0 and theta < np.inf:
        top = -np.inf
        for j in range(n_pool):
            v = alpha * lin[j] if exact else ad * sizes[j]
            if v > top:
                top = v
        for j in range(n_pool):
            bonus[j] = top * (wait[j] / theta)
    if d.shape[0] == 1:  # BR-0 scans its pool (P terms per pop): no bound (``ub`` unused)
        ub = lin
    else:
        ub = ub_buf
        for j in range(n_pool):
            ub[j] = (alpha * lin[j] if exact else ad * sizes[j]) + bonus[j]
    prune = d.shape[0] > 1 and _prunable(d, beta, ub)
    if prune:
        _bound_order(ub, order, count)
    else:
        count[0] = count[1] = 0
        _largest_contribution(sizes, growth, exact, cmax)
    return ub, prune


@njit
def _prunable(d, beta, ub):  # pragma: no cover - compiled
    """Whether ub bounds every F({j}) + u_j: β ≥ 0, every d_h ≥ 0 and every ub finite."""
    if not beta >= 0.0:
        return False
    for h in range(d.shape[0]):
        if not d[h] >= 0.0:
            return False
    for j in range(ub.shape[0]):
        if not np.isfinite(ub[j]):
            return False
    return True


@njit
def _ranks_before(ub, a, b):  # pragma: no cover - compiled
    """Whether request a comes before b in the bound order: larger ub, ties the smaller index."""
    return ub[a] > ub[b] or (ub[a] == ub[b] and a < b)


@njit
def _sift_down(ub, heap, n, pos):  # pragma: no cover - compiled
    """Restore the heap property of ``heap[:n]`` below position ``pos``."""
    item = heap[pos]
    while True:
        c = 2 * pos + 1
        if c >= n:
            break
        if c + 1 < n and _ranks_before(ub, heap[c + 1], heap[c]):
            c += 1
        if not _ranks_before(ub, heap[c], item):
            break
        heap[pos] = heap[c]
        pos = c
    heap[pos] = item


@njit
def _bound_order(ub, order, count):  # pragma: no cover - compiled
    """The bound order, built lazily in ``order`` (2, ≥ P) and ``count`` (2,): row 0 holds its
    first ``count[0]`` requests, row 1 a heap (``count[1]`` entries) of the rest. A tick usually
    reads a few dozen, so sorting all P would cost more than the search; :func:`_ordered` extends
    the prefix on demand."""
    n = ub.shape[0]
    for j in range(n):
        order[1, j] = j
    for pos in range(n // 2 - 1, -1, -1):
        _sift_down(ub, order[1], n, pos)
    count[0] = 0
    count[1] = n


@njit
def _ordered(t, ub, order, count):  # pragma: no cover - compiled
    """The t-th request of the bound order (−1 past the end), extending the prefix as needed."""
    while count[0] <= t:
        if count[1] == 0:
            return -1
        heap = order[1]
        order[0, count[0]] = heap[0]
        count[0] += 1
        count[1] -= 1
        heap[0] = heap[count[1]]
        _sift_down(ub, heap, count[1], 0)
    return order[0, t]


@njit
def _margins(loads, env, g, marg, lim):  # pragma: no cover - compiled
    """marg[h] = (M̂(h) − L̂_g(h))/w_g, the margins of replica g in its token units."""
    for h in range(marg.shape[0]):
        marg[h] = (env[h] - loads[g, h]) * lim[1][g]


@njit
def _fits(j, g, lim):  # pragma: no cover - compiled
    """Whether request j fits replica g's KV room in every step of the budget window:
    cost_j(h) ≤ room_g(h) (always, without a budget: a window of width 0)."""
    room, cost = lim[2], lim[3]
    for h in range(room.shape[1]):
        if cost[j, h] > room[g, h]:
            return False
    return True


@njit
def _set_fits(q, n_q, g, lim):  # pragma: no cover - compiled
    """Whether the pool indices ``q[:n_q]`` fit replica g's KV room together."""
    room, cost = lim[2], lim[3]
    for h in range(room.shape[1]):
        acc = 0.0
        for t in range(n_q):
            acc += cost[q[t], h]
        if acc > room[g, h]:
            return False
    return True


@njit
def _subset_fits(cand, idx, size, g, lim):  # pragma: no cover - compiled
    """Whether the candidates ``cand[idx[:size]]`` fit replica g's KV room together."""
    room, cost = lim[2], lim[3]
    for h in range(room.shape[1]):
        acc = 0.0
        for t in range(size):
            acc += cost[cand[idx[t]], h]
        if acc > room[g, h]:
            return False
    return True


@njit
def _one_score(j, sizes, growth, exact, lin, marg, d, alpha, ad, beta,
               bonus):  # pragma: no cover - compiled
    """F({j}) + u_j against the margins ``marg``: :func:`_pool_scores`' value for j (the same
    operations; the steps it leaves out add +0.0)."""
    total = 0.0
    for h in range(d.shape[0]):
        if exact:
            x = (sizes[j] + growth[j, h]) - marg[h]
        else:
            x = sizes[j] - marg[h]
        if x > 0.0:
            total += d[h] * x
    if exact:
        return (alpha * lin[j] - beta * total) + bonus[j]
    return (ad * sizes[j] - beta * total) + bonus[j]


@njit
def _best_k(k, order, count, ub, alive, sizes, growth, exact, lin, marg, d, alpha, ad, beta,
            bonus, cand, cand_f, g, lim):  # pragma: no cover - compiled
    """``cand[:n]``: the ``k`` live requests with the largest F({j}) + u_j, best first (ties: pool
    order), by best-first search in the bound order, among those that fit replica g's KV room;
    returns n = min(k, such requests)."""
    n_c = 0
    budget = lim[2].shape[1] > 0
    for t in range(ub.shape[0]):
        j = _ordered(t, ub, order, count)
        if not alive[j] or (budget and not _fits(j, g, lim)):
            continue
        if n_c == k and ub[j] < cand_f[k - 1]:
            break
        v = _one_score(j, sizes, growth, exact, lin, marg, d, alpha, ad, beta, bonus)
        if n_c == k:
            last = cand[k - 1]
            if not (v > cand_f[k - 1] or (v == cand_f[k - 1] and j < last)):
                continue
            pos = k - 1
        else:
            pos = n_c
            n_c += 1
        while pos > 0 and (cand_f[pos - 1] < v or (cand_f[pos - 1] == v and cand[pos - 1] > j)):
            cand[pos] = cand[pos - 1]
            cand_f[pos] = cand_f[pos - 1]
            pos -= 1
        cand[pos] = j
        cand_f[pos] = v
    return n_c


@njit
def _pick_k(prune, k, order, count, ub, alive, sizes, growth, exact, lin, cmax, loads, env, g, d,
            alpha, ad, beta, bonus, tot, f1, marg, cand, cand_f, lim):  # pragma: no cover
    """``cand[:n]``: the ``k`` (≤ live) requests with the largest F({j}) + u_j on replica g, best
    first (ties: pool order), and ``cand_f[:n]`` their scores: best-first (``prune``) or by scoring
    the whole pool; with a KV budget only the requests that fit g's room. ``k = 1`` is the best
    single request (Stage 1, the fill, the guard). Returns n (0: nothing fits)."""
    if prune:
        _margins(loads, env, g, marg, lim)
        return _best_k(k, order, count, ub, alive, sizes, growth, exact, lin, marg, d, alpha, ad,
                       beta, bonus, cand, cand_f, g, lim)
    _pool_scores(sizes, growth, exact, lin, cmax, loads, env, g, d, alpha, ad, beta, bonus, tot, f1,
                 lim)
    budget = lim[2].shape[1] > 0
    n_c = 0
    last = 0.0  # f1[cand[k − 1]] once k are kept (a local: the scan compares every request to it)
    for j in range(sizes.shape[0]):
        if not alive[j] or (budget and not _fits(j, g, lim)):
            continue
        v = f1[j]
        if n_c == k:
            if not v > last:
                continue
            pos = k - 1
        else:
            pos = n_c
            n_c += 1
        while pos > 0 and f1[cand[pos - 1]] < v:
            cand[pos] = cand[pos - 1]
            pos -= 1
        cand[pos] = j
        if n_c == k:
            last = f1[cand[k - 1]]
    for t in range(n_c):
        cand_f[t] = f1[cand[t]]
    return n_c


@njit
def _place(i, g, loads, env, sizes, growth, has_growth, free, alive, lim):  # pragma: no cover
    """Request i joins replica g: L̂_g += w_g·(s_i (+ growth_i)), its KV room shrinks by cost_i;
    the envelope follows. Returns whether the envelope changed (every replica's margins then
    changed)."""
    n_rep, width = loads.shape
    room, cost = lim[2], lim[3]
    for h in range(room.shape[1]):
        room[g, h] -= cost[i, h]
    moved = False
    for h in range(width):
        add = (sizes[i] + growth[i, h] if has_growth else sizes[i]) * lim[0][g]
        loads[g, h] += add
        if add >= 0.0:
            if loads[g, h] > env[h]:
                env[h] = loads[g, h]
                moved = True
        else:  # a shrinking projection: recompute this step's envelope
            top = loads[0, h]
            for r in range(1, n_rep):
                if loads[r, h] > top:
                    top = loads[r, h]
            moved = moved or top != env[h]
            env[h] = top
    free[g] -= 1
    alive[i] = False
    return moved


BACKLOG_PER_REPLICA = 2
"""A pool of at least this many requests per replica is a *backlog*: the fill tick then runs Stage 1
by the paper's rule, the small-batch check stays off, and BR-H may take its backlog window."""

FILL_LEVELS = 4096
"""Stage 2's fill (``r_max = 0``) tracks subset sums 0..2·safe in at most this many quantum steps
(a quantum q = 1 + 2·safe // FILL_LEVELS tokens; q = 1 — exact — while 2·safe < FILL_LEVELS)."""

FILL_WINDOW = 256
"""The fill's dynamic programme runs over at most this many pooled requests (the oldest first)."""


@njit
def _bit(sets, k, b):  # pragma: no cover - compiled
    """Whether sum ``b`` is in the bitset ``sets[k]``."""
    return ((sets[k, b >> 6] >> np.uint64(b & 63)) & np.uint64(1)) != np.uint64(0)


@njit
def _highest_at_most(sets, k, b):  # pragma: no cover - compiled
    """The largest sum ≤ ``b`` in the bitset ``sets[k]`` (word by word), or −1."""
    w = b >> 6
    word = sets[k, w]
    if (b & 63) != 63:
        word &= (np.uint64(1) << np.uint64((b & 63) + 1)) - np.uint64(1)
    while word == np.uint64(0):
        w -= 1
        if w < 0:
            return -1
        word = sets[k, w]
    top = 63
    while ((word >> np.uint64(top)) & np.uint64(1)) == np.uint64(0):
        top -= 1
    return (w << 6) + top


@njit
def _lowest_in(sets, k, lo, hi):  # pragma: no cover - compiled
    """The smallest sum in [``lo``, ``hi``] in the bitset ``sets[k]`` (word by word), or −1."""
    if lo > hi:
        return -1
    w = lo >> 6
    word = sets[k, w] & ~((np.uint64(1) << np.uint64(lo & 63)) - np.uint64(1))
    last = hi >> 6
    while word == np.uint64(0):
        w += 1
        if w > last:
            return -1
        word = sets[k, w]
    low = 0
    while ((word >> np.uint64(low)) & np.uint64(1)) == np.uint64(0):
        low += 1
    total = (w << 6) + low
    return total if total <= hi else -1


_DEBRUIJN = np.uint64(0x03F79D71B4CB0A89)
_DEBRUIJN_INDEX = np.array([
    0, 1, 48, 2, 57, 49, 28, 3, 61, 58, 50, 42, 38, 29, 17, 4, 62, 55, 59, 36, 53, 51, 43, 22,
    45, 39, 33, 30, 24, 18, 12, 5, 63, 47, 56, 27, 60, 41, 37, 16, 54, 35, 52, 21, 44, 32, 23, 11,
    46, 26, 40, 15, 34, 20, 31, 10, 25, 14, 19, 9, 13, 8, 7, 6], dtype=np.int64)
"""Index of the lowest set bit of a word x: ``_DEBRUIJN_INDEX[((x & −x)·_DEBRUIJN) >> 58]``."""


@njit
def _fill_proposals(items, qsize, n_items, k_lo, cap, safe_q, hi_q, prop, prop_len):  # pragma: no cover
    """The fill's candidate sets: for k = cap, cap − 1, …, k_lo the exactly-k subset of the
    ``items[:n_items]`` (quantised sizes ``qsize``) whose sum is the largest ≤ ``safe_q``, then the
    one whose sum is the smallest in (``safe_q``, ``hi_q``] (when they exist). Subset sums are
    bitsets (uint64 words); ``first[k, b]`` is the item at which sum b first became reachable with k
    items (−1 for the empty set), recorded as its bit is newly set. A k-subset is rebuilt from the
    last item back, taking item t whenever the sum left minus its size is reachable with k − 1 of
    the items before it, i.e. ``first[k − 1, left − s_t] < t``. Writes the sets (item positions,
    ascending) to ``prop`` rows with their sizes in ``prop_len``; returns the number of sets.

    With ``cap = 1`` (a replica with one free slot) the sets are single items: the rebuild takes
    the last item whose size is the sum, so one scan finds them without the bitsets."""
    if cap == 1:
        low = -1  # the last item of the largest size <= safe_q, then of the smallest above it
        high = -1
        for t in range(n_items):
            s = qsize[t]
            if s <= safe_q:
                if low < 0 or s >= qsize[low]:
                    low = t
            elif s <= hi_q and (high < 0 or s <= qsize[high]):
                high = t
        n_prop = 0
        for t in (low, high):
            if t >= 0:
                prop[n_prop, 0] = t
                prop_len[n_prop] = 1
                n_prop += 1
        return n_prop
    words = (hi_q >> 6) + 1
    last_bits = (hi_q & 63) + 1
    last_mask = np.uint64(0xFFFFFFFFFFFFFFFF) if last_bits == 64 else \
        (np.uint64(1) << np.uint64(last_bits)) - np.uint64(1)
    reach = np.zeros((cap + 1, words), dtype=np.uint64)
    reach[0, 0] = np.uint64(1)
    # rows' non-zero words lie in lo[k]..hi[k] (a superset): the shifts skip the empty words
    lo = np.full(cap + 1, words, dtype=np.int64)
    hi = np.full(cap + 1, -1, dtype=np.int64)
    lo[0] = hi[0] = 0
    # read only where the final ``reach`` has the bit: every such entry has been written
    first = np.empty((cap, hi_q + 1), dtype=np.int32)
    first[0, 0] = -1
    for t in range(n_items):
        s = qsize[t]
        ws = s >> 6
        bs = np.uint64(s & 63)
        back = np.uint64(64 - (s & 63))
        for k in range(min(t + 1, cap), 0, -1):
            w_lo = lo[k - 1] + ws
            w_hi = min(hi[k - 1] + ws + 1, words - 1)
            if w_lo > w_hi:  # row k − 1 is empty, or every shifted sum exceeds hi_q
                continue
            for w in range(w_lo, w_hi + 1):
                src = w - ws
                v = reach[k - 1, src] << bs
                if bs != np.uint64(0) and src > 0:
                    v |= reach[k - 1, src - 1] >> back
                if w == words - 1:
                    v &= last_mask
                new = v & ~reach[k, w]
                if new != np.uint64(0):
                    reach[k, w] |= new
                    while k < cap and new != np.uint64(0):  # (no one rebuilds from the top row)
                        low = new & (~new + np.uint64(1))
                        first[k, (w << 6) + _DEBRUIJN_INDEX[(low * _DEBRUIJN) >> np.uint64(58)]] = t
                        new ^= low
            lo[k] = min(lo[k], w_lo)
            hi[k] = max(hi[k], w_hi)
    n_prop = 0
    for k in range(cap, k_lo - 1, -1):
        for side in range(2):
            if side == 0:
                total = _highest_at_most(reach, k, safe_q)
            else:
                total = _lowest_in(reach, k, safe_q + 1, hi_q)
            if total < 0:
                continue
            left = total
            j = k
            for t in range(n_items - 1, -1, -1):
                if j == 0:
                    break
                s = qsize[t]
                if left >= s and _bit(reach, j - 1, left - s) and first[j - 1, left - s] < t:
                    j -= 1
                    prop[n_prop, j] = t
                    left -= s
            prop_len[n_prop] = k
            n_prop += 1
    return n_prop


@njit
def _stage2_replica(free, loads, env, by_margin):  # pragma: no cover - compiled
    """The open replica Stage 2 serves next: the largest margin m(0), ties more free slots
    (``by_margin``: the fill), or the most free slots, ties the larger margin (the paper's);
    further ties: the lower index."""
    g = -1
    best_m = 0.0
    for r in range(loads.shape[0]):
        if free[r] <= 0:
            continue
        m0 = env[0] - loads[r, 0]
        if g < 0:
            g, best_m = r, m0
        elif by_margin:
            if m0 > best_m or (m0 == best_m and free[r] > free[g]):
                g, best_m = r, m0
        elif free[r] > free[g] or (free[r] == free[g] and m0 > best_m):
            g, best_m = r, m0
    return g


@njit
def _fill_level(loads, env, g, d, alpha, beta, marg):  # pragma: no cover - compiled
    """The best constant fill of replica g's margin profile m_h = M̂(h) − L̂_g(h): the Δ maximising
    α·(Σ_h d_h)·Δ − β·Σ_h d_h·(Δ − m_h)_+ — the smallest margin (ascending; ties: smaller h) at
    which the discount weight of the margins up to it reaches α·Σ d/β (else the largest margin)."""
    width = d.shape[0]
    total = 0.0
    for h in range(width):
        total += d[h]
        marg[h] = env[h] - loads[g, h]
    order = np.argsort(marg, kind="mergesort")
    need = alpha * total
    acc = 0.0
    for t in range(width):
        acc += d[order[t]]
        if beta * acc >= need:
            return marg[order[t]]
    return marg[order[width - 1]]


@njit
def _fill_replica(free, loads, env, d, alpha, beta, by_level, marg, level,
                  known):  # pragma: no cover - compiled
    """The open replica the fill serves next: the largest fill level (``by_level``, with a horizon;
    with H = 0 it is the margin m(0)) or the largest margin m(0); ties: more free slots, lower
    index. ``level[r]`` caches replica r's fill level while ``known[r]`` (the caller clears it
    when r's loads or the envelope change)."""
    if not by_level or loads.shape[1] == 1:
        return _stage2_replica(free, loads, env, True)
    g = -1
    best = 0.0
    for r in range(loads.shape[0]):
        if free[r] <= 0:
            continue
        if not known[r]:
            level[r] = _fill_level(loads, env, r, d, alpha, beta, marg)
            known[r] = True
        if g < 0 or level[r] > best or (level[r] == best and free[r] > free[g]):
            g, best = r, level[r]
    return g


@njit
def _set_score(q, n_q, sizes, growth, exact, bonus, loads, env, g, d, alpha, ad, beta,
               traj, lim):  # pragma: no cover - compiled
    """F(Q) + Σ_{i∈Q} u_i on replica g for the pool indices ``q[:n_q]`` (the reference's order)."""
    width = d.shape[0]
    urg = 0.0
    for t in range(n_q):
        urg += bonus[q[t]]
    if exact:
        for h in range(width):
            acc = 0.0
            for t in range(n_q):
                acc += sizes[q[t]] + growth[q[t], h]
            traj[h] = acc
        return _score_traj(traj, loads, env, g, d, alpha, beta, lim) + urg
    delta = 0.0
    for t in range(n_q):
        delta += sizes[q[t]]
    return _score_one(delta, loads, env, g, d, ad, beta, lim) + urg


@njit
def singles_apply(free, wait, s_greedy, r_max, deadline_s):  # pragma: no cover - compiled
    """Whether a tick with W = 1, no growth and no KV budget is :func:`fill_singles`' case: the
    fill (``r_max = 0``), a pooled request, 1 to ``s_greedy`` free slots and no replica with two,
    and no pooled request at the pool deadline (:func:`singles_apply_max` on the pool's
    longest wait)."""
    longest = -np.inf
    for j in range(wait.shape[0]):
        if wait[j] > longest:
            longest = wait[j]
    return singles_apply_max(free, wait.shape[0], longest, s_greedy, r_max, deadline_s)


@njit(inline="always")
def singles_apply_max(free, n_pool, longest, s_greedy, r_max, deadline_s):  # pragma: no cover - compiled
    """:func:`singles_apply` for a pool of ``n_pool`` requests whose longest wait is ``longest``
    (a request at the deadline is one whose wait is ≥ it: the longest wait is)."""
    if r_max > 0 or n_pool == 0:
        return False
    total = 0
    for g in range(free.shape[0]):
        if free[g] > 1:
            return False
        total += max(free[g], 0)
    if not 0 < total <= s_greedy:
        return False
    return not longest >= deadline_s


@njit(inline="always")  # (into the fused loop and two_stage_tick: no argument set-up per tick,
# about 1.08x the fused BR-0 loop; the compile on an empty cache grows by about 2 CPU-s)
def fill_singles(loads, free, sizes, wait, d, alpha, beta, theta, out_i, out_g, alive, w,
                 inv_w):  # pragma: no cover - compiled
    """The tick of a full cluster, in one pass over the pool per placement: W = 1, no growth, no
    KV budget and :func:`singles_apply` (the fill, at most ``s_greedy`` free slots so Stage 1 and
    the batch check idle, none two on one replica, no request at the pool deadline) — a
    saturated cluster's tick, where each departure frees one slot. ``theta``: the first-token
    guard's scale θ (:func:`_guard_scale`; the caller has the pool's median for its deadline
    already); ``w``, ``inv_w``: the step-time weights and their inverses (``lim[0]``,
    ``lim[1]``); ``alive`` (P,): scratch. It makes the general path's
    decisions with the general path's floating-point operations (``_pool_setup``,
    ``_stage2_replica``, ``_pick_k``, ``_fill_proposals``' one-slot case, ``_set_score``,
    ``_place``), without its per-tick set-up: the replica with the largest margin (ties: lower
    index) takes the best of the largest pooled request that fits its margin, the smallest that
    overflows it by less than the margin, and the best single request by F + u. Returns how
    many it placed (tested against the general path and the reference). Those helpers' lines are
    written out here on a scalar envelope: calling them (an envelope array, ``lim``) made this
    tick 1.44× slower (424 against 295 ns, pool 32)."""
    n_rep = loads.shape[0]
    n_pool = sizes.shape[0]
    env = loads[0, 0]  # the envelope M̂(0)
    free_sum = 0
    for g in range(n_rep):
        if loads[g, 0] > env:
            env = loads[g, 0]
        free_sum += free[g]
    remaining = min(free_sum, n_pool)
    total_d = 0.0
    total_d += d[0]
    ad = alpha * total_d
    # the pool's constants (_pool_setup with BR-0's scan): θ, max_j α·Σd·s_j (u_j's scale), max_j s_j
    guard = theta > 0.0 and theta < np.inf
    top = -np.inf
    cmax = sizes[0]
    for j in range(n_pool):
        alive[j] = True
        v = ad * sizes[j]
        if v > top:
            top = v
        if sizes[j] > cmax:
            cmax = sizes[j]
    window = min(n_pool, FILL_WINDOW)
    placed = 0
    while placed < remaining:
        g = -1  # _stage2_replica's choice: the largest margin, ties more free slots, lower index
        best_m = 0.0
        for r in range(n_rep):
            if free[r] <= 0:
                continue
            m0 = env - loads[r, 0]
            if g < 0 or m0 > best_m or (m0 == best_m and free[r] > free[g]):
                g, best_m = r, m0
        m = (env - loads[g, 0]) * inv_w[g]
        scan = m < cmax  # (else no pooled request overflows: every overflow term is 0)
        safe = int(np.floor(m)) if m > 0.0 else 0
        hi = 2 * safe
        quantum = 1 + hi // FILL_LEVELS
        # a request of c = ⌈s_j⌉ tokens is qs = ⌈c / quantum⌉ quanta; qs ≤ b ⟺ c ≤ b·quantum and
        # qs ≥ b ⟺ c > (b − 1)·quantum, so the scan compares tokens against bucket edges and
        # divides only when it takes a new candidate (alone, this saved less than the runs'
        # noise; the median once and the inlining are what moved the fused loop)
        safe_c = (safe // quantum) * quantum  # qs ≤ safe_q
        hi_c = (hi // quantum) * quantum  # qs ≤ hi_q
        single = -1
        f_single = 0.0
        low = high = -1
        low_edge = high_edge = 0  # c > low_edge: qs ≥ low's; c ≤ high_edge: qs ≤ high's
        n_items = 0
        for j in range(n_pool):
            if not alive[j]:
                continue
            tot = 0.0
            if scan:
                x = sizes[j] - m
                tot += d[0] * (x if x > 0.0 else 0.0)
            v = (ad * sizes[j] - beta * tot) + (top * (wait[j] / theta) if guard else 0.0)
            if single < 0 or v > f_single:
                single, f_single = j, v
            if safe > 0 and n_items < window:
                c = int(np.ceil(sizes[j]))
                if c <= hi_c:
                    n_items += 1
                    if c <= safe_c:
                        if low < 0 or c > low_edge:
                            low = j
                            low_edge = ((c + quantum - 1) // quantum - 1) * quantum
                    elif high < 0 or c <= high_edge:
                        high = j
                        high_edge = ((c + quantum - 1) // quantum) * quantum
        best_f = -np.inf
        best = -1
        for i in (low, high):
            if i < 0:
                continue
            urg = 0.0
            urg += top * (wait[i] / theta) if guard else 0.0  # u_i
            delta = 0.0
            delta += sizes[i]
            total = 0.0  # _score_one
            x = delta - m
            if x > 0.0:
                total += d[0] * x
            f = (ad * delta - beta * total) + urg
            if f > best_f:
                best_f, best = f, i
        if f_single > best_f:  # (one slot: k_lo = 1)
            best_f, best = f_single, single
        if not best_f > 0.0:  # starvation guard: the best single request
            best = single
        add = sizes[best] * w[g]  # _place
        loads[g, 0] += add
        if add >= 0.0:
            if loads[g, 0] > env:
                env = loads[g, 0]
        else:
            env = loads[0, 0]
            for r in range(1, n_rep):
                if loads[r, 0] > env:
                    env = loads[r, 0]
        free[g] -= 1
        alive[best] = False
        out_i[placed] = best
        out_g[placed] = g
        placed += 1
    return placed


@njit
def _fill_stage(loads, env, free, free_sum, sizes, growth, has_growth, exact, lin, cmax, d, alpha,
                ad, beta, bonus, tot, f1, traj, mg, alive, placed, remaining, by_level, prune,
                order, count, ub, cand, cand_f, out_i, out_g, lim, items, qsize, q_set, marg,
                level, known, prop1, prop1_len):  # pragma: no cover - compiled
    """Stage 2 as a fill (``r_max = 0``): while slots are left, the open replica with the largest
    fill level (``by_level``; else margin m(0); ties: more free slots, lower index, see
    :func:`_fill_replica`) takes the best of the DP's proposals
    (:func:`_fill_proposals` over the oldest ``FILL_WINDOW`` pooled requests, sizes in quanta of
    q = 1 + 2·safe // ``FILL_LEVELS``, safe = ⌊min_h m_h⌋) and the best single request, by
    F(Q) + Σ u_i (ties: the earlier proposal, the single last); if that is ≤ 0, the best single
    request (starvation guard). With a KV budget only sets that fit the replica's room are
    candidates, and a replica where no request fits closes for the tick. Returns the new
    ``placed``."""
    width = loads.shape[1]
    n_pool = sizes.shape[0]
    budget = lim[2].shape[1] > 0
    extra = 0.0  # budget: the largest cost_j(0) − s_j (BR-0's growth reserve per request)
    if budget:
        for j in range(n_pool):
            if lim[3][j, 0] - sizes[j] > extra:
                extra = lim[3][j, 0] - sizes[j]
    window = min(n_pool, FILL_WINDOW)  # (the workspace's items, qsize: at least this long)
    known[:] = False  # (``level`` is read only with fill levels: a horizon and ``by_level``)
    while placed < remaining:
        g = _fill_replica(free, loads, env, d, alpha, beta, by_level, marg, level, known)
        # best F({i}) + u_i, ties: pool order
        if _pick_k(prune, 1, order, count, ub, alive, sizes, growth, exact, lin, cmax, loads, env,
                   g, d, alpha, ad, beta, bonus, tot, f1, mg, cand, cand_f, lim) == 0:
            free_sum -= free[g]  # budget: nothing fits g, which closes for this tick
            free[g] = 0
            remaining = placed + min(free_sum, n_pool - placed)
            continue
        single, f_single = cand[0], cand_f[0]
        cap = min(free[g], remaining - placed)
        # every slot but the tick's slack (Σ free − still to place) is filled this tick, so g takes
        # at least free[g] − slack now: fewer would only defer the rest to an overflow
        k_lo = max(1, free[g] - (free_sum - (remaining - placed)))
        low = env[0] - loads[g, 0]
        for h in range(1, width):
            if env[h] - loads[g, h] < low:
                low = env[h] - loads[g, h]
        low = low * lim[1][g]
        safe = int(np.floor(low)) if low > 0.0 else 0
        hi = 2 * safe
        if budget:  # sums above the room cannot fit (cost_j(0) ≥ s_j + extra ... ≥ s_j)
            lim_s = lim[2][g, 0] - cap * extra
            top = int(np.floor(lim_s)) if lim_s > 0.0 else 0
            safe = min(safe, top)
            hi = min(hi, top)
        best_f = -np.inf
        best_n = 0
        if safe > 0:
            quantum = 1 + hi // FILL_LEVELS
            safe_q = safe // quantum
            hi_q = hi // quantum
            n_items = 0
            for j in range(n_pool):
                if n_items == window:
                    break
                if not alive[j] or (budget and not _fits(j, g, lim)):
                    continue
                w = (int(np.ceil(sizes[j])) + quantum - 1) // quantum
                if w <= hi_q:
                    items[n_items] = j
                    qsize[n_items] = w
                    n_items += 1
            k_max = min(cap, n_items)
            if k_max >= k_lo:
                if k_max == 1:  # (the common case, a replica with one free slot: no allocation)
                    prop, prop_len = prop1, prop1_len
                else:
                    prop = np.empty((2 * k_max, k_max), dtype=np.int64)
                    prop_len = np.empty(2 * k_max, dtype=np.int64)
                n_prop = _fill_proposals(items, qsize, n_items, k_lo, k_max, safe_q, hi_q, prop,
                                         prop_len)
                for p in range(n_prop):
                    for t in range(prop_len[p]):
                        q_set[t] = items[prop[p, t]]
                    if budget and not _set_fits(q_set, prop_len[p], g, lim):
                        continue
                    f = _set_score(q_set, prop_len[p], sizes, growth, exact, bonus, loads, env, g,
                                   d, alpha, ad, beta, traj, lim)
                    if f > best_f:
                        best_f = f
                        best_n = prop_len[p]
                        for t in range(best_n):
                            out_i[placed + t] = q_set[t]
        if (k_lo == 1 or best_n == 0) and f_single > best_f:  # the single beats the proposals
            best_f = f_single
            best_n = 1
            out_i[placed] = single
        if not best_f > 0.0:  # starvation guard: the best single request
            best_n = 1
            out_i[placed] = single
        known[g] = False
        for _ in range(best_n):
            i = out_i[placed]
            if _place(i, g, loads, env, sizes, growth, has_growth, free, alive, lim):
                known[:] = False
            free_sum -= 1
            out_g[placed] = g
            placed += 1
    return placed


@njit
def lpt_batch(loads0, free0, sizes, out_i, out_g, count, w):  # pragma: no cover - compiled
    """A small batch placed whole (every pooled request, Stage 1 only): the LPT plan — largest
    prompt first (ties: pool order), each to the least-loaded replica with a free slot (ties:
    more free slots, lower index) — replaces the tick's ``count`` decisions in ``out_i``/``out_g``
    when it overflows the current envelope max_g L_g less, Σ_g (L'_g − max_g L_g)_+ (ties keep
    the tick's). ``loads0`` (G,) and ``free0`` (G,): the loads and free slots before the tick;
    ``w`` (G,): each replica's step-time weight (a request of s tokens adds w_g·s). Returns
    whether it did."""
    n_rep = loads0.shape[0]
    top = loads0[0]
    for g in range(1, n_rep):
        if loads0[g] > top:
            top = loads0[g]
    lo = loads0.copy()
    for t in range(count):
        lo[out_g[t]] += sizes[out_i[t]] * w[out_g[t]]
    over_tick = 0.0
    for g in range(n_rep):
        if lo[g] > top:
            over_tick += lo[g] - top
    order = np.argsort(-sizes[:count], kind="mergesort")
    fr = free0.copy()
    lpt_g = np.empty(count, dtype=np.int64)
    for g in range(n_rep):
        lo[g] = loads0[g]
    for t in range(count):
        i = order[t]
        best = -1
        for g in range(n_rep):
            if fr[g] > 0 and (best < 0 or lo[g] < lo[best]
                              or (lo[g] == lo[best] and fr[g] > fr[best])):
                best = g
        lpt_g[t] = best
        lo[best] += sizes[i] * w[best]
        fr[best] -= 1
    over_lpt = 0.0
    for g in range(n_rep):
        if lo[g] > top:
            over_lpt += lo[g] - top
    if not over_lpt < over_tick:
        return False
    for t in range(count):
        out_i[t] = order[t]
        out_g[t] = lpt_g[t]
    return True


@njit
def tick_workspace(n_rep, width, n_pool, r_max):  # pragma: no cover - compiled
    """The scratch arrays of :func:`two_stage_tick` for G = ``n_rep`` replicas, W = ``width``
    steps, pools of up to ``n_pool`` requests and Stage 2's ``r_max``: allocated once by a caller
    that ticks many times, so a tick allocates nothing (the fill's
    DP still allocates its subset-sum tables for a replica with two or more free slots, a
    deadline stage sorts its late requests, a small batch its LPT plan)."""
    k = max(r_max, 1)
    window = min(n_pool, FILL_WINDOW)
    return (
        np.empty(width), np.empty(width), np.empty(width), np.empty(width), np.empty(width),
        np.empty(n_rep), np.zeros(n_rep, dtype=np.bool_),
        np.empty(n_pool), np.empty(n_pool), np.empty(n_pool), np.empty(n_pool), np.empty(n_pool),
        np.empty(n_pool), np.empty(n_pool, dtype=np.bool_),
        np.empty(k, dtype=np.int64), np.empty(k),
        np.empty(window, dtype=np.int64), np.empty(window, dtype=np.int64),
        np.empty(n_pool, dtype=np.int64), np.empty((2, n_pool), dtype=np.int64),
        np.zeros(2, dtype=np.int64), np.empty((2, 1), dtype=np.int64), np.empty(2, dtype=np.int64),
    )


@njit
def singles_scratch(ws):  # pragma: no cover - compiled
    """The scratch :func:`fill_singles` takes from a :func:`tick_workspace`: (``alive``,
    ``spare``), both (P,)."""
    return ws[13], ws[12]


@njit
def two_stage_tick(
    loads, free, sizes, wait, d, alpha, beta, s_greedy, r_max, deadline_s, deadline_factor, growth,
    has_growth, exact_score, fit_stage1, growth_steps, ttft_slo_s, fill_by_level, lpt_batches,
    out_i, out_g, lim, ws,
):  # pragma: no cover - compiled; tested against the reference through two_stage_assign
    """The tick of :func:`two_stage_assign` on mutable copies ``loads`` (G, W) and ``free``;
    writes the decisions to ``out_i``/``out_g`` and returns how many there are. The pool deadline
    is min(``deadline_s``, ``deadline_factor``·2·w̃), w̃ the pool's median wait
    (:func:`relative_deadline`; ``inf``: the lease's alone). ``ws``: a
    :func:`tick_workspace` for at least this G, W, pool size and ``r_max`` (its contents are
    scratch: nothing carries over from one tick to the next).

    ``lim`` = (w, 1/w, room, cost): replica g's step-time weight w_g (``loads`` are then in step
    time over the reference replica's a: a request of s tokens adds w_g·s, and scores are taken
    in g's own tokens against its margin/w_g — ones: §1's token form, bit for bit) and the KV
    budget window: ``room`` (G, K) and ``cost`` (P, K), request j fitting replica g while
    cost_j(h) ≤ room_g(h) for every h; K = 0: no budget. A replica where nothing fits closes
    for the tick (the tick then places fewer than min(Σ free, P))."""
    n_rep, width = loads.shape
    n_pool = sizes.shape[0]
    budget = lim[2].shape[1] > 0
    alive, spare = singles_scratch(ws)
    mid_wait = _pool_median(ttft_slo_s, wait, spare[:n_pool])  # once: the deadline's and θ's
    deadline_s = _deadline_from(deadline_s, deadline_factor, ttft_slo_s, mid_wait)
    theta = _scale_from(ttft_slo_s, mid_wait)
    if width == 1 and not has_growth and not budget and singles_apply(free, wait, s_greedy, r_max,
                                                                      deadline_s):
        return fill_singles(loads, free, sizes, wait, d, alpha, beta, theta, out_i, out_g,
                            alive[:n_pool], lim[0], lim[1])
    exact = exact_score and has_growth
    total_d = 0.0
    for h in range(width):
        total_d += d[h]
    ad = alpha * total_d
    (env, traj, mg, marg, cmax, level, known, lin, bonus, ub_buf, tot, f1, spare, alive, cand,
     cand_f, items, qsize, q_set, ranked, ranked_n, prop1, prop1_len) = ws
    lin, bonus, ub_buf = lin[:n_pool], bonus[:n_pool], ub_buf[:n_pool]
    tot, f1, spare, alive = tot[:n_pool], f1[:n_pool], spare[:n_pool], alive[:n_pool]
    env, traj, mg, marg, cmax = env[:width], traj[:width], mg[:width], marg[:width], cmax[:width]
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
    # a small batch placed whole in Stage 1 (fewer than 2G requests, room to spare): checked
    # against LPT at the end (``lpt_batch``)
    batch = (lpt_batches and n_pool < BACKLOG_PER_REPLICA * n_rep and free_sum - n_pool >= s_greedy
             and not budget)  # (LPT knows no budget)
    loads0 = loads[:, 0].copy() if batch else env[:0]  # (empty views: no allocation)
    free0 = free.copy() if batch else free[:0]
    ub, prune = _pool_setup(sizes, growth, wait, d, alpha, ad, beta, exact, theta, lin,
                            bonus, ub_buf, cmax, ranked, ranked_n)
    alive[:] = True
    # cand, cand_f: the best candidates of a pick, best first
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
                if free[g] <= 0 or (budget and not _fits(i, g, lim)):
                    continue
                # in step time: w_g times the score in g's tokens
                f = _single(i, g, loads, env, sizes, growth, d, alpha, ad, beta, exact, traj,
                            lim) * lim[0][g]
                m0 = env[0] - loads[g, 0]
                if (best_g < 0 or f > best_f
                        or (f == best_f and (free[g] > free[best_g]
                                             or (free[g] == free[best_g] and m0 > best_m)))):
                    best_g, best_f, best_m = g, f, m0
            if best_g < 0:  # budget: it fits nowhere now and stays pooled
                continue
            _place(i, best_g, loads, env, sizes, growth, has_growth, free, alive, lim)
            free_sum -= 1
            out_i[placed] = i
            out_g[placed] = best_g
            placed += 1

    # (1) plenty of room: one replica at a time takes its best single request — with
    # ``fit_stage1`` the replica with the largest margin ``growth_steps`` steps ahead, m(0) + T·free
    # (each running request grows one token per step; ties: more free slots); otherwise (the
    # paper's rule) the one with most free slots (ties: lower load)
    while placed < remaining and free_sum > s_greedy:
        g = -1
        best_m = 0.0
        # the fill tick (r_max = 0) spreads by free slots while the pool holds ≥ 2 requests per
        # replica (a batch: every replica takes some), by margin below that
        by_fit = fit_stage1 and not (r_max <= 0 and n_pool >= BACKLOG_PER_REPLICA * n_rep)
        for r in range(n_rep):
            if free[r] <= 0:
                continue
            m0 = (env[0] - loads[r, 0]) + growth_steps * free[r]
            if g < 0:
                g, best_m = r, m0
            elif by_fit:
                if m0 > best_m or (m0 == best_m and free[r] > free[g]):
                    g, best_m = r, m0
            elif free[r] > free[g] or (free[r] == free[g] and loads[r, 0] < loads[g, 0]):
                g, best_m = r, m0
        if _pick_k(prune, 1, ranked, ranked_n, ub, alive, sizes, growth, exact, lin, cmax, loads,
                   env, g, d, alpha, ad, beta, bonus, tot, f1, mg, cand, cand_f, lim) == 0:
            free_sum -= free[g]  # budget: nothing fits g, which closes for this tick
            free[g] = 0
            remaining = placed + min(free_sum, n_pool - placed)
            continue
        i = cand[0]
        _place(i, g, loads, env, sizes, growth, has_growth, free, alive, lim)
        free_sum -= 1
        out_i[placed] = i
        out_g[placed] = g
        placed += 1
    if batch:  # everything is placed: LPT instead, if it overflows the envelope less
        lpt_batch(loads0, free0, sizes, out_i, out_g, placed, lim[0])
        return placed

    if r_max <= 0:  # (2') the fill: exact subset sums over the pool, replicas by margin
        return _fill_stage(loads, env, free, free_sum, sizes, growth, has_growth, exact, lin, cmax,
                           d, alpha, ad, beta, bonus, tot, f1, traj, mg, alive, placed,
                           remaining, fill_by_level, prune, ranked, ranked_n, ub, cand, cand_f,
                           out_i, out_g, lim, items, qsize, q_set, marg, level, known, prop1,
                           prop1_len)
    # (2) scarce room: best subset of the top r_max candidates for the top replica
    idx = np.empty(max(r_max, 1), dtype=np.int64)
    best_q = np.empty(max(r_max, 1), dtype=np.int64)
    while placed < remaining:
        g = _stage2_replica(free, loads, env, False)
        k = min(r_max, n_pool - placed)
        k = _pick_k(prune, k, ranked, ranked_n, ub, alive, sizes, growth, exact, lin, cmax, loads,
                    env, g, d, alpha, ad, beta, bonus, tot, f1, mg, cand, cand_f, lim)
        if k == 0:
            free_sum -= free[g]  # budget: nothing fits g, which closes for this tick
            free[g] = 0
            remaining = placed + min(free_sum, n_pool - placed)
            continue
        cap = min(free[g], k)
        best_f = -np.inf
        best_size = 0
        for size in range(1, cap + 1):  # subsets by size, then lexicographically
            for t in range(size):
                idx[t] = t
            while True:
                urg = 0.0
                for t in range(size):
                    urg += bonus[cand[idx[t]]]
                fits = not budget or _subset_fits(cand, idx, size, g, lim)
                if exact:
                    for h in range(width):
                        acc = 0.0
                        for t in range(size):
                            j = cand[idx[t]]
                            acc += sizes[j] + growth[j, h]
                        traj[h] = acc
                    f = _score_traj(traj, loads, env, g, d, alpha, beta, lim) + urg
                else:
                    delta = 0.0
                    for t in range(size):
                        delta += sizes[cand[idx[t]]]
                    f = _score_one(delta, loads, env, g, d, ad, beta, lim) + urg
                if fits and f > best_f:
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
            _place(i, g, loads, env, sizes, growth, has_growth, free, alive, lim)
            free_sum -= 1
            out_i[placed] = i
            out_g[placed] = g
            placed += 1
    return placed


# ------------------------------------------------------------------------- FIFO tick


@njit
def _feature(f, r, loads, active, cursor):  # pragma: no cover - compiled
    """Feature ``f`` (:data:`LOAD`, :data:`ACTIVE` or :data:`TURN`) of replica r."""
    if f == LOAD:
        return loads[r]
    if f == ACTIVE:
        return active[r]
    return (r - cursor) % loads.shape[0]


@njit
def fifo_choose(key, free, loads, active, cursor):  # pragma: no cover - compiled
    """The replica (with ``free > 0``) that takes the pool head: the one whose features
    (``key[0]``, ``key[1]``, …; each :data:`LOAD`, :data:`ACTIVE` or :data:`TURN`) are
    lexicographically smallest, ties: the lower index; −1 if none has a free slot. The one rule
    of every FIFO baseline, in the generic loop, the proxy and the fused loop."""
    g = -1
    for r in range(loads.shape[0]):
        if free[r] <= 0:
            continue
        if g < 0:
            g = r
            continue
        for t in range(key.shape[0]):
            a = _feature(key[t], r, loads, active, cursor)
            b = _feature(key[t], g, loads, active, cursor)
            if a != b:
                if a < b:
                    g = r
                break
    return g
