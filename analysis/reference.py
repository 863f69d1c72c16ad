"""Straightforward pure-Python references: the yardsticks of the benchmarks and the tests.

``reference_tick`` is the two-stage tick (:mod:`balanceroute.core.two_stage`) written literally with lists and a heap, no numpy. It must make
the same decisions as :func:`balanceroute.core.two_stage.two_stage_assign` (a test checks it).

``naive_simulate`` is the barrier model's dynamics written the obvious way: one Python object per
request, a list of slots per replica, loads summed from the running requests every step. It
must produce the same outcomes and metrics as :func:`balanceroute.core.simulator.simulate` (a
test checks it); ``balanceroute bench`` times the simulator against it.
"""

from __future__ import annotations

import heapq
import math
import time
from itertools import combinations
from typing import Any

import numpy as np

from balanceroute.core.dynamics import request_metrics, step_metrics
from balanceroute.core.two_stage import FILL_LEVELS, FILL_WINDOW

__all__ = ["naive_simulate", "reference_tick"]


def _score(delta: float, margin: list[float], d: list[float], alpha: float, beta: float) -> float:
    """The paper's F(Δ) = (α·Σ d)·Δ − β·Σ_h d_h·(Δ − m_h)_+."""
    total = 0.0
    for dh, mh in zip(d, margin):
        x = delta - mh
        if x > 0.0:
            total += dh * x
    return alpha * sum(d) * delta - beta * total


def _score_traj(traj: list[float], margin: list[float], d: list[float], alpha: float,
                beta: float) -> float:
    """The exact F of a contribution trajectory: α·Σ_h d_h·δ(h) − β·Σ_h d_h·(δ(h) − m_h)_+."""
    lin = 0.0
    total = 0.0
    for dh, th, mh in zip(d, traj, margin):
        lin += dh * th
        x = th - mh
        if x > 0.0:
            total += dh * x
    return alpha * lin - beta * total


def _lpt_plan(loads: list[float], free: list[int], prompt_len: list[int]) -> list[tuple[int, int]]:
    """Largest prompt first (ties: pool order), each to the least-loaded replica with a free slot
    (ties: more free slots, lower index)."""
    loads, free, plan = list(loads), list(free), []
    for i in sorted(range(len(prompt_len)), key=lambda i: (-prompt_len[i], i)):
        g = min((g for g in range(len(free)) if free[g] > 0), key=lambda g: (loads[g], -free[g], g))
        loads[g] += prompt_len[i]
        free[g] -= 1
        plan.append((i, g))
    return plan


def _overflow(loads: list[float], plan: list[tuple[int, int]], prompt_len: list[int]) -> float:
    """Σ_g (L'_g − max_g L_g)_+ after ``plan``."""
    top, after = max(loads), list(loads)
    for i, g in plan:
        after[g] += prompt_len[i]
    return sum(max(x - top, 0.0) for x in after)


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
    score: str = "exact",
    stage1: str = "fit",
    growth_steps: float = 0.0,
    ttft_slo_s: float | None = None,
    fill_order: str = "level",
    lpt_batches: bool = False,
    deadline_factor: float | None = None,
) -> list[tuple[int, int]]:
    """One tick; returns ``[(pool_index, replica), ...]`` in decision order."""
    loads = [list(row) for row in proj_loads]
    free = list(free_slots)
    horizon = len(d)
    n = len(prompt_len)
    alive = [True] * n
    out: list[tuple[int, int]] = []
    remaining = min(sum(free), n)
    exact = score == "exact" and growth is not None
    contrib = [[prompt_len[i] + (growth[i][h] if growth is not None else 0.0) for h in range(horizon)]
               for i in range(n)]

    def env() -> list[float]:
        return [max(row[h] for row in loads) for h in range(horizon)]

    def margin(g: int) -> list[float]:
        e = env()
        return [e[h] - loads[g][h] for h in range(horizon)]

    def value(i: int) -> float:  # the linear term of F({i})
        if not exact:
            return alpha * sum(d) * prompt_len[i]
        lin = 0.0
        for h in range(horizon):
            lin += d[h] * contrib[i][h]
        return alpha * lin

    top = max((value(i) for i in range(n)), default=0.0)
    slo = ttft_slo_s if ttft_slo_s is not None else float("inf")
    ordered = sorted(float(x) for x in wait)
    half = len(ordered) // 2
    mid_wait = (0.0 if not ordered else ordered[half] if len(ordered) % 2
                else (ordered[half - 1] + ordered[half]) / 2.0)
    if 0 < slo < float("inf") and mid_wait > 0:  # the guard's scale: min(slo, 2·median wait)
        slo = min(slo, 2.0 * mid_wait)
    urgency = [top * (wait[i] / slo) if slo < float("inf") else 0.0 for i in range(n)]
    if deadline_factor is not None and ttft_slo_s is not None:  # the relative deadline: f·2·w̃
        deadline_s = min(deadline_s, deadline_factor * (2.0 * mid_wait if mid_wait > 0 else ttft_slo_s))

    def f_set(q: list[int], m: list[float]) -> float:
        urg = 0.0
        for i in q:
            urg += urgency[i]
        if exact:
            traj = []
            for h in range(horizon):
                acc = 0.0
                for i in q:
                    acc += contrib[i][h]
                traj.append(acc)
            return _score_traj(traj, m, d, alpha, beta) + urg
        delta = 0.0
        for i in q:
            delta += prompt_len[i]
        return _score(delta, m, d, alpha, beta) + urg

    def f_one(i: int, m: list[float]) -> float:  # F({i}) without the urgency
        if exact:
            return _score_traj(contrib[i], m, d, alpha, beta)
        return _score(prompt_len[i], m, d, alpha, beta)

    def place(i: int, g: int) -> None:
        for h in range(horizon):
            loads[g][h] += contrib[i][h] if growth is not None else prompt_len[i]
        free[g] -= 1
        alive[i] = False
        out.append((i, g))

    batch = lpt_batches and n < 2 * len(free) and sum(free) - n >= s_greedy
    before = ([row[0] for row in loads], list(free))

    late = sorted((i for i in range(len(wait)) if wait[i] >= deadline_s), key=lambda i: -wait[i])
    for i in late:
        if len(out) == remaining:
            break
        best = max(
            (g for g in range(len(free)) if free[g] > 0),
            key=lambda g: (f_one(i, margin(g)), free[g], margin(g)[0], -g),
        )
        place(i, best)

    while len(out) < remaining and sum(free) > s_greedy:
        if stage1 == "fit" and not (r_max == 0 and n >= 2 * len(free)):  # (fill: a batch by slots)
            g = max((g for g in range(len(free)) if free[g] > 0),
                    key=lambda g: (margin(g)[0] + growth_steps * free[g], free[g], -g))
        else:
            g = min((g for g in range(len(free)) if free[g] > 0), key=lambda g: (-free[g], loads[g][0], g))
        m = margin(g)
        i = max((i for i in range(n) if alive[i]), key=lambda i: (f_set([i], m), -i))
        place(i, g)
    if batch:  # a small batch placed whole: LPT's plan if it overflows the envelope less
        lpt = _lpt_plan(*before, prompt_len)
        if _overflow(before[0], lpt, prompt_len) < _overflow(before[0], out, prompt_len):
            return lpt
        return out

    def level(g: int) -> float:  # the best constant fill Δ of g's margins (fill order "level")
        m = margin(g)
        if fill_order != "level" or horizon == 1:
            return m[0]
        acc, total = 0.0, 0.0
        for dh in d:
            total += dh
        for h in sorted(range(horizon), key=lambda h: m[h]):  # ascending, ties: smaller h
            acc += d[h]
            if beta * acc >= alpha * total:  # the slope α·Σd − β·acc of the fill turns ≤ 0
                return m[h]
        return max(m)

    while r_max == 0 and len(out) < remaining:  # the fill (r_max = 0)
        g = max((g for g in range(len(free)) if free[g] > 0),
                key=lambda g: (level(g), free[g], -g))
        m = margin(g)
        single = max((i for i in range(n) if alive[i]), key=lambda i: (f_set([i], m), -i))
        best_q, best_f = [single], f_set([single], m)
        safe = math.floor(min(m)) if min(m) > 0 else 0
        if safe > 0:
            quantum = 1 + (2 * safe) // FILL_LEVELS
            safe_q, hi_q = safe // quantum, (2 * safe) // quantum
            qsize = {i: -(-math.ceil(prompt_len[i]) // quantum) for i in range(n)}
            items = [i for i in range(n) if alive[i] and qsize[i] <= hi_q][:FILL_WINDOW]
            cap = min(free[g], remaining - len(out), len(items))
            k_lo = max(1, free[g] - (sum(free) - (remaining - len(out))))  # the tick's slack
            # sums[t][k]: the sums of k-subsets of items[:t] (up to hi_q)
            sums = [[{0}] + [set() for _ in range(cap)]]
            for i in items:
                prev = sums[-1]
                sums.append([prev[0]] + [prev[k] | {x + qsize[i] for x in prev[k - 1]
                                                    if x + qsize[i] <= hi_q}
                                         for k in range(1, cap + 1)])
            props = []
            for k in range(cap, k_lo - 1, -1):
                fits = [x for x in sums[-1][k] if x <= safe_q]
                over = [x for x in sums[-1][k] if x > safe_q]
                for total in ([max(fits)] if fits else []) + ([min(over)] if over else []):
                    chosen, left, j = [], total, k
                    for t in range(len(items) - 1, -1, -1):
                        if j and left - qsize[items[t]] in sums[t][j - 1]:
                            chosen.append(items[t])
                            left -= qsize[items[t]]
                            j -= 1
                    props.append(sorted(chosen))
            best_prop = max(props, key=lambda q: f_set(q, m), default=None)  # first of equals
            if best_prop is not None and (k_lo > 1 or f_set(best_prop, m) >= best_f):
                best_q, best_f = best_prop, f_set(best_prop, m)
        for i in best_q if best_f > 0 else [single]:
            place(i, g)

    while len(out) < remaining:
        e0 = env()[0]
        heap = [(-free[g], -(e0 - loads[g][0]), g) for g in range(len(free)) if free[g] > 0]
        heapq.heapify(heap)
        _, _, g = heapq.heappop(heap)
        m = margin(g)
        ranked = sorted((i for i in range(n) if alive[i]), key=lambda i: (-f_set([i], m), i))
        cand = ranked[:r_max]
        cap = min(free[g], len(cand))
        best_q: tuple[int, ...] = ()
        best_f = float("-inf")
        for size in range(1, cap + 1):
            for q in combinations(range(len(cand)), size):
                f = f_set([cand[j] for j in q], m)
                if f > best_f:
                    best_q, best_f = q, f
        chosen = [cand[j] for j in best_q] if best_f > 0 else [cand[0]]
        for i in chosen:
            place(i, g)
    return out


# ------------------------------------------------------------------------ naive simulator


class _Request:
    """One request and everything that happens to it."""

    __slots__ = ("rid", "prompt", "output", "age", "ready", "joined", "replica", "start",
                 "finish", "tick_time", "first_time", "finish_time")

    def __init__(self, rid: int, prompt: int, output: int, ready: float) -> None:
        self.rid, self.prompt, self.output, self.ready = rid, prompt, output, ready
        self.age = 0
        self.joined = ready
        self.replica = self.start = self.finish = -1
        self.tick_time = self.first_time = self.finish_time = float("nan")


class _Replica:
    """B slots, each empty or holding one running request."""

    __slots__ = ("slots",)

    def __init__(self, slots: int) -> None:
        self.slots: list[_Request | None] = [None] * slots

    def running(self) -> list[_Request]:
        return [r for r in self.slots if r is not None]

    def load(self) -> int:
        return sum(r.prompt + r.age for r in self.slots if r is not None)


def naive_simulate(workload: Any, policy: Any, config: Any, *,
                   time_limit_s: float | None = None) -> dict[str, Any]:
    """The barrier model's dynamics with per-request objects; ``policy.assign`` decides each tick.

    Returns ``{"metrics": ..., "replica", "start_step", "finish_step", "ttft_s", "tpot_s",
    "pool_wait_s"}`` shaped like :class:`~balanceroute.core.simulator.SimResult`. With
    ``time_limit_s`` it stops after that much wall time and returns only
    ``{"steps": k, "seconds": t, "partial": True}`` (for timing a rate).
    """
    from balanceroute.core.state import ClusterState, PoolView

    g_count, b_slots = config.num_replicas, config.slots
    saturated = config.mode == "saturated"
    n = len(workload)
    if saturated:
        arrival = [float("nan")] * n
    else:
        arrival = [float(a) / config.rate_scale for a in workload.arrival_s]
    requests = [
        _Request(i, int(s), int(o), arrival[i] + config.prefill_delay_s)
        for i, (s, o) in enumerate(zip(workload.prompt_len.tolist(), workload.output_len.tolist()))
    ]
    replicas = [_Replica(b_slots) for _ in range(g_count)]
    pool: list[_Request] = []
    nxt = k = finished = generated = 0
    now = sum_i = sum_gm = sum_tau = 0.0
    loaded = (0.0, 0.0, 0)
    loaded_tokens, loaded_clock = 0, 0.0
    step = config.step_model
    t0 = time.perf_counter()
    while finished < n:
        if time_limit_s is not None and time.perf_counter() - t0 > time_limit_s:
            return {"steps": k, "seconds": time.perf_counter() - t0, "partial": True}
        if saturated:
            while len(pool) < config.pool_target and nxt < n:
                requests[nxt].joined = now
                pool.append(requests[nxt])
                nxt += 1
        else:
            while nxt < n and requests[nxt].ready <= now:
                pool.append(requests[nxt])
                nxt += 1

        chosen: list[_Request] = []
        running = [rep.running() for rep in replicas]
        if pool and sum(b_slots - len(r) for r in running):
            active = [(g, slot, req) for g, rep in enumerate(replicas)
                      for slot, req in enumerate(rep.slots) if req is not None]
            state = ClusterState(
                loads=np.array([rep.load() for rep in replicas], dtype=np.int64),
                free_slots=np.array([b_slots - len(r) for r in running], dtype=np.int64),
                num_active=np.array([len(r) for r in running], dtype=np.int64), step=k, now=now,
                active_replica=np.array([g for g, _, _ in active], dtype=np.int64),
                active_prompt=np.array([r.prompt for _, _, r in active], dtype=np.int64),
                active_age=np.array([r.age for _, _, r in active], dtype=np.int64),
                active_ids=np.array([r.rid for _, _, r in active], dtype=np.int64),
            )
            view = PoolView(
                prompt_len=np.array([r.prompt for r in pool], dtype=np.int64),
                wait=np.array([now - r.joined for r in pool], dtype=np.float64),
                request_ids=np.array([r.rid for r in pool], dtype=np.int64),
            )
            decision = policy.assign(state, view)
            for j, g in zip(decision.pool_index.tolist(), decision.replica.tolist()):
                req = pool[j]
                rep = replicas[g]
                rep.slots[rep.slots.index(None)] = req
                req.replica, req.start, req.tick_time = g, k, now
                chosen.append(req)
            taken = {id(r) for r in chosen}
            pool = [r for r in pool if id(r) not in taken]

        loads = [rep.load() for rep in replicas]
        counts = [len(rep.running()) for rep in replicas]
        if not any(counts):
            if not pool and nxt < n and not saturated:
                now = max(now, requests[nxt].ready)
                continue
            raise RuntimeError("no request is running and none can be assigned")
        envelope = max(loads)
        imb = g_count * envelope - sum(loads)
        if step.c == 0.0:
            tau = step.b + step.a * float(envelope)
        else:
            tau = step.b + max(step.a * float(L) + step.c * float(c) for L, c in zip(loads, counts))
        now += tau
        sum_i += imb
        sum_gm += g_count * envelope
        sum_tau += tau
        if chosen:
            loaded = (sum_i, sum_gm, k + 1)
            for req in chosen:
                req.first_time = now
        for rep in replicas:
            for slot, req in enumerate(rep.slots):
                if req is None:
                    continue
                req.age += 1
                generated += 1
                if req.age == req.output:
                    req.finish, req.finish_time = k, now
                    rep.slots[slot] = None
                    finished += 1
        if chosen:
            loaded_tokens, loaded_clock = generated, now  # up to the last assigning step
        k += 1

    out = np.array([r.output for r in requests], dtype=np.int64)
    first = np.array([r.first_time for r in requests])
    last = np.array([r.finish_time for r in requests])
    joined = np.array([r.joined for r in requests])
    ticked = np.array([r.tick_time for r in requests])
    arrived = joined if saturated else np.array(arrival)
    per_request, tpot, ttft, wait = request_metrics(out, first, last, arrived, ticked, joined)
    lease = getattr(config, "lease", None)  # the KV lease: counted, its re-prefill not modelled
    if lease is not None and np.any(wait >= lease.forward_by_s):
        raise NotImplementedError("naive_simulate does not model the KV lease's re-prefill")
    per_request = {**per_request, "kv_lease_reprefilled": 0.0, "kv_lease_failed": 0.0}
    loaded_i, loaded_gm, loaded_steps = loaded
    metrics = {
        "requests": float(n),
        **step_metrics(steps=k, generated=generated, sum_i=sum_i, sum_tau=sum_tau,
                       loaded_i=loaded_i, loaded_gm=loaded_gm, loaded_steps=loaded_steps,
                       loaded_tokens=loaded_tokens, loaded_clock=loaded_clock, makespan=now),
        **per_request,
    }
    return {
        "metrics": metrics,
        "replica": np.array([r.replica for r in requests], dtype=np.int64),
        "start_step": np.array([r.start for r in requests], dtype=np.int64),
        "finish_step": np.array([r.finish for r in requests], dtype=np.int64),
        "ttft_s": ttft,
        "tpot_s": tpot,
        "pool_wait_s": wait,
    }
