"""The numba kernels of the simulator's loops: the fused simulation loop and the generic loop's
tickless steps.

* :func:`simulate_loop` — the simulation loop of :mod:`~balanceroute.core.fused`, which runs a
  policy's compiled tick (:mod:`._tick_kernels`) inside it;
* :func:`skip_tickless_steps` — the generic loop's steps at which no tick is needed.

The fused loop links the tick kernels into its own compiled code, so its cache entry is stamped
with the tick's source file as well as this one (``njit(stamp_with=...)``,
:mod:`~balanceroute.core._jit`): an edit of the tick invalidates the cached loop too.

No fastmath anywhere: every floating-point operation keeps its written order, which is what
makes the results equal to the references bit for bit.
"""

from __future__ import annotations

import numpy as np

from . import _tick_kernels
from ._jit import njit as _njit
from ._tick_kernels import (
    _deadline_from,
    _pool_median_known,
    _scale_from,
    fifo_choose,
    fill_singles,
    singles_apply_max,
    singles_scratch,
    tick_workspace,
    two_stage_tick,
)
from .tick_contract import TWO_STAGE


def njit(fn):
    """:func:`~balanceroute.core._jit.njit`, cached under this file's and the tick's source."""
    return _njit(stamp_with=(_tick_kernels.__file__,))(fn)


# int state slots of the fused loop
K, NXT, FINISHED, GENERATED, POOL_N, LOADED_STEPS, STATUS, N_SERIES = range(8)
# float state slots
NOW, SUM_I, SUM_GM, SUM_TAU, LOADED_I, LOADED_GM = range(6)
# statuses
RUNNING, DONE, MAX_STEPS, STUCK = 0, 1, 2, 3


# ------------------------------------------------------------------------- fused loop


@njit
def _barrier_step(loads, n_act, g_count, step_a, step_b, step_c):  # pragma: no cover - compiled
    """M(k), Σ_g L_g(k) and τ(k) = b + max_g(a·L_g + c·n_g) (b + a·M when c = 0)."""
    envelope = loads[0]
    total = 0
    for g in range(g_count):
        total += loads[g]
        if loads[g] > envelope:
            envelope = loads[g]
    if step_c == 0.0:
        return envelope, total, step_b + step_a * float(envelope)
    top = step_a * float(loads[0]) + step_c * float(n_act[0])
    for g in range(1, g_count):
        v = step_a * float(loads[g]) + step_c * float(n_act[g])
        if v > top:
            top = v
    return envelope, total, step_b + top


@njit
def simulate_loop(
    prompt, output, ready, saturated, target, g_count, slots, kind, key, state, s_greedy, r_max,
    deadline_s, deadline_factor, beta, fit_stage1, growth_steps, ttft_slo_s, lpt_batches,
    step_b, step_a, step_c, max_steps, budget, record, replica, start, finish, joined, tick_time,
    first_time, finish_time, loads, n_act, pool, head, link, ints, floats, series,
):  # pragma: no cover - compiled; checked against the generic loop by tests/core/test_fast_paths
    """Advance the simulation by at most ``budget`` steps; returns the (maybe grown) series.

    The tick is ``kind``'s: :data:`TWO_STAGE` (BR-0's parameters) or :data:`FIFO` (the pool
    head to :func:`fifo_choose` by ``key``; ``state[0]`` is the cursor, left after the last
    replica chosen)."""
    n = prompt.shape[0]
    ring = head.shape[0]
    cap = pool.shape[0]
    k, nxt, finished = ints[K], ints[NXT], ints[FINISHED]
    generated, pool_n, loaded_steps = ints[GENERATED], ints[POOL_N], ints[LOADED_STEPS]
    n_series = ints[N_SERIES]
    now, sum_i, sum_gm, sum_tau = floats[NOW], floats[SUM_I], floats[SUM_GM], floats[SUM_TAU]
    loaded_i, loaded_gm = floats[LOADED_I], floats[LOADED_GM]
    status = RUNNING
    # tick scratch (BR-0 runs the two-stage kernel on float copies)
    proj = np.empty((g_count, 1))
    free = np.empty(g_count, dtype=np.int64)
    sizes = np.empty(cap)
    waited = np.empty(cap)
    out_i = np.empty(cap, dtype=np.int64)
    out_g = np.empty(cap, dtype=np.int64)
    taken = np.zeros(cap, dtype=np.bool_)
    chosen = np.empty(cap, dtype=np.int64)
    ones = np.ones(1)
    no_growth = np.zeros((0, 1))
    # equal replicas, no KV budget (the fused loop models neither)
    lim = (np.ones(g_count), np.ones(g_count), np.zeros((g_count, 0)), np.zeros((cap, 0)))
    work = tick_workspace(g_count, 1, cap, r_max)  # the tick's scratch, allocated once
    alive, spare = singles_scratch(work)
    steps_here = 0
    while True:
        if finished >= n:
            status = DONE
            break
        if k >= max_steps:
            status = MAX_STEPS
            break
        if steps_here >= budget:
            break
        # admit: saturated refill, or arrivals whose prefill has completed
        if saturated:
            take = min(target - pool_n, n - nxt)
            for t in range(take):
                joined[nxt + t] = now
                pool[pool_n + t] = nxt + t
        else:
            take = 0
            while nxt + take < n and ready[nxt + take] <= now:
                pool[pool_n + take] = nxt + take
                take += 1
        if take > 0:
            pool_n += take
            nxt += take

        # (1) the scheduling tick
        n_chosen = 0
        free_sum = 0
        for g in range(g_count):
            free_sum += slots - n_act[g]
        if pool_n > 0 and free_sum > 0:
            for g in range(g_count):
                free[g] = slots - n_act[g]
            if kind == TWO_STAGE:
                for g in range(g_count):
                    proj[g, 0] = float(loads[g])
                longest = -np.inf
                up = down = True  # whether the waits are monotone (_median's check, on the way)
                for j in range(pool_n):
                    sizes[j] = float(prompt[pool[j]])
                    wait_j = now - joined[pool[j]]
                    waited[j] = wait_j
                    if wait_j > longest:
                        longest = wait_j
                    if j > 0:
                        up = up and waited[j - 1] <= wait_j
                        down = down and waited[j - 1] >= wait_j
                # the pool's median once, for the pool deadline (two_stage_tick is then given
                # it, factor inf) and the first-token guard's scale θ
                mid_wait = _pool_median_known(ttft_slo_s, waited[:pool_n], spare[:pool_n], up or down)
                late_s = _deadline_from(deadline_s, deadline_factor, ttft_slo_s, mid_wait)
                if singles_apply_max(free, pool_n, longest, s_greedy, r_max, late_s):
                    # a full cluster's tick (what two_stage_tick itself would run) without the
                    # general tick's set-up
                    n_chosen = fill_singles(
                        proj, free, sizes[:pool_n], waited[:pool_n], ones, 1.0, beta,
                        _scale_from(ttft_slo_s, mid_wait), out_i, out_g, alive, lim[0], lim[1])
                else:
                    n_chosen = two_stage_tick(
                        proj, free, sizes[:pool_n], waited[:pool_n], ones, 1.0, beta, s_greedy,
                        r_max, late_s, np.inf, no_growth, False, False, fit_stage1, growth_steps,
                        ttft_slo_s, True, lpt_batches, out_i, out_g, lim, work,
                    )
                for t in range(n_chosen):
                    rid = pool[out_i[t]]
                    g = out_g[t]
                    taken[out_i[t]] = True
                    chosen[t] = rid
                    replica[rid] = g
                    loads[g] += prompt[rid]
                    n_act[g] += 1
            else:
                n_chosen = min(free_sum, pool_n)
                for t in range(n_chosen):
                    rid = pool[t]
                    g = fifo_choose(key, free, loads, n_act, state[0])
                    state[0] = (g + 1) % g_count
                    free[g] -= 1
                    taken[t] = True
                    chosen[t] = rid
                    replica[rid] = g
                    loads[g] += prompt[rid]
                    n_act[g] += 1
            for t in range(n_chosen):
                rid = chosen[t]
                start[rid] = k
                tick_time[rid] = now
                end = k + output[rid] - 1
                link[rid] = head[end % ring]
                head[end % ring] = rid
            if n_chosen > 0:  # the rest of the pool keeps its order
                kept = 0
                for j in range(pool_n):
                    if taken[j]:
                        taken[j] = False
                    else:
                        pool[kept] = pool[j]
                        kept += 1
                pool_n = kept

        active = 0
        for g in range(g_count):
            active += n_act[g]
        if active == 0:
            # idle: nothing runs; jump to the next arrival (open loop only)
            if pool_n == 0 and nxt < n and not saturated:
                now = max(now, ready[nxt])
                continue
            status = STUCK
            break

        # (2) the step runs on the loads it has
        envelope, total, tau = _barrier_step(loads, n_act, g_count, step_a, step_b, step_c)
        imb = g_count * envelope - total
        now += tau
        sum_i += float(imb)
        sum_gm += float(g_count * envelope)
        sum_tau += tau
        if n_chosen > 0:
            loaded_i, loaded_gm, loaded_steps = sum_i, sum_gm, k + 1
            for t in range(n_chosen):
                first_time[chosen[t]] = now
        if record:
            if n_series == series.shape[1]:
                grown = np.empty((6, max(2 * n_series, 1024)))
                for row in range(6):  # (a loop: numba's slice copy compiles an error message)
                    for t in range(n_series):
                        grown[row, t] = series[row, t]
                series = grown
            series[0, n_series] = float(imb)
            series[1, n_series] = float(envelope)
            series[2, n_series] = float(total)
            series[3, n_series] = tau
            series[4, n_series] = float(active)
            series[5, n_series] = float(pool_n)
            n_series += 1

        # (3) every active request generates one token; those reaching o_i finish
        generated += active
        for g in range(g_count):
            loads[g] += n_act[g]
        rid = head[k % ring]
        head[k % ring] = -1
        while rid >= 0:
            g = replica[rid]
            loads[g] -= prompt[rid] + output[rid]
            n_act[g] -= 1
            finish[rid] = k
            finish_time[rid] = now
            finished += 1
            rid = link[rid]
        k += 1
        steps_here += 1

    ints[K], ints[NXT], ints[FINISHED] = k, nxt, finished
    ints[GENERATED], ints[POOL_N], ints[LOADED_STEPS] = generated, pool_n, loaded_steps
    ints[N_SERIES], ints[STATUS] = n_series, status
    floats[NOW], floats[SUM_I], floats[SUM_GM], floats[SUM_TAU] = now, sum_i, sum_gm, sum_tau
    floats[LOADED_I], floats[LOADED_GM] = loaded_i, loaded_gm
    return series


# ------------------------------------------------------------- generic loop: tickless steps


@njit
def skip_tickless_steps(
    prompt, output, ready, saturated, pool_len, target, nxt, g_count, slots, step_b, step_a,
    step_c, max_steps, loads, n_act, slot_req, slot_end, finish, finish_time, ints, floats,
    block,
):  # pragma: no cover - compiled; the generic loop's tests cover it
    """Run the generic loop's steps at whose start nothing would be admitted or assigned — every
    slot busy or the pool empty, no arrival due — doing exactly its steps (2) and (3) on its
    slot table. Stops before a step that needs Python (admission, a tick, idling), at the end or
    at the step limit. ``ints`` = (k, finished, generated), ``floats`` = (now, Σ I, Σ G·M, Σ τ);
    with a non-empty ``block`` (6, m) the per-step series of up to m steps is written to it.
    Returns the number of steps run."""
    n = prompt.shape[0]
    k, finished, generated = ints[0], ints[1], ints[2]
    now, sum_i, sum_gm, sum_tau = floats[0], floats[1], floats[2], floats[3]
    width = block.shape[1]
    ran = 0
    if saturated and pool_len < target and nxt < n:
        return 0  # the pool is refilled at the start of the next step
    while finished < n and k < max_steps:
        if width > 0 and ran == width:
            break
        if not saturated and nxt < n and ready[nxt] <= now:
            break
        active = 0
        for g in range(g_count):
            active += n_act[g]
        if active == 0 or (pool_len > 0 and active < g_count * slots):
            break
        envelope, total, tau = _barrier_step(loads, n_act, g_count, step_a, step_b, step_c)
        imb = g_count * envelope - total
        now += tau
        sum_i += float(imb)
        sum_gm += float(g_count * envelope)
        sum_tau += tau
        if width > 0:
            block[0, ran] = float(imb)
            block[1, ran] = float(envelope)
            block[2, ran] = float(total)
            block[3, ran] = tau
            block[4, ran] = float(active)
            block[5, ran] = float(pool_len)
        generated += active
        for g in range(g_count):
            loads[g] += n_act[g]
        for slot in range(slot_end.shape[0]):
            if slot_end[slot] == k:
                rid = slot_req[slot]
                g = slot // slots
                loads[g] -= prompt[rid] + output[rid]
                n_act[g] -= 1
                slot_req[slot] = -1
                slot_end[slot] = -1
                finish[rid] = k
                finish_time[rid] = now
                finished += 1
        k += 1
        ran += 1
    ints[0], ints[1], ints[2] = k, finished, generated
    floats[0], floats[1], floats[2], floats[3] = now, sum_i, sum_gm, sum_tau
    return ran
