"""The fused simulation loop: :func:`~balanceroute.core.simulator.simulate`'s dynamics and a
policy's tick compiled together (numba), for the policies that have a compiled tick.

The generic loop calls ``policy.assign`` once per tick through the Python contract; here the
whole run — admission, tick, step, finishes — is one compiled loop with no per-request Python
objects and no per-step allocation. Same dynamics, same floating-point operations in the same
order, so the per-request outcomes and the metrics are identical to the generic loop's (a test
checks it). Policies with a compiled tick are registered in :data:`FUSED_POLICIES` by exact
type (a subclass may override the rule, so it takes the generic path): BR-0 (the very kernel
:func:`~balanceroute.core.two_stage.two_stage_assign` runs) and the deterministic FIFO
baselines JSQ, LeastLoad and RoundRobin. Random and PowerOfTwo keep the generic path (their
draws come from a ``np.random.Generator``), as does BR-H (its predictor is Python).

Requests finish through a calendar ring indexed by finish step (one linked list per step), so
a step costs O(G + finishes + tick), not O(G·B).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._jit import HAVE_NUMBA, njit
from .policies.br0 import BR0Policy
from .policies.jsq import JSQPolicy
from .policies.least_load import LeastLoadPolicy
from .policies.round_robin import RoundRobinPolicy
from .two_stage import _two_stage_kernel

__all__ = ["FUSED_POLICIES", "FusedPolicy", "fused_policy", "run_fused"]

TWO_STAGE, JSQ, LEAST_LOAD, ROUND_ROBIN = 0, 1, 2, 3

# int state slots
_K, _NXT, _FINISHED, _GENERATED, _POOL_N, _LOADED_STEPS, _CURSOR, _STATUS, _N_SERIES = range(9)
# float state slots
_NOW, _SUM_I, _SUM_GM, _SUM_TAU, _LOADED_I, _LOADED_GM = range(6)
# statuses
_RUNNING, _DONE, _MAX_STEPS, _STUCK = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class FusedPolicy:
    """A policy's tick as the fused loop runs it: ``kind`` and its parameters."""

    kind: int
    s_greedy: int = 0
    r_max: int = 1
    deadline_s: float = float("inf")


def _br0(p: BR0Policy) -> FusedPolicy:
    return FusedPolicy(kind=TWO_STAGE, s_greedy=p.s_greedy, r_max=p.r_max, deadline_s=p.deadline_s)


FUSED_POLICIES: dict[type, Callable[[Any], FusedPolicy]] = {
    BR0Policy: _br0,
    JSQPolicy: lambda p: FusedPolicy(kind=JSQ),
    LeastLoadPolicy: lambda p: FusedPolicy(kind=LEAST_LOAD),
    RoundRobinPolicy: lambda p: FusedPolicy(kind=ROUND_ROBIN),
}
"""Policy class (exact type) → its compiled tick."""


def fused_policy(policy: object) -> FusedPolicy | None:
    """The compiled tick of ``policy``, or ``None`` if it has none (or numba is missing)."""
    if not HAVE_NUMBA:
        return None
    build = FUSED_POLICIES.get(type(policy))
    return None if build is None else build(policy)


@dataclass(slots=True)
class FusedRun:
    """What the fused loop leaves behind: per-request columns and the running totals."""

    replica: NDArray[np.int64]
    start: NDArray[np.int64]
    finish: NDArray[np.int64]
    joined: NDArray[np.float64]
    tick_time: NDArray[np.float64]
    first_time: NDArray[np.float64]
    finish_time: NDArray[np.float64]
    loads: NDArray[np.int64]
    ints: NDArray[np.int64]
    floats: NDArray[np.float64]
    series: NDArray[np.float64] | None

    @property
    def steps(self) -> int:
        """Decode steps run."""
        return int(self.ints[_K])

    @property
    def generated(self) -> int:
        """Tokens generated."""
        return int(self.ints[_GENERATED])

    @property
    def loaded_steps(self) -> int:
        """Steps up to and including the last one that assigned a request."""
        return int(self.ints[_LOADED_STEPS])

    @property
    def cursor(self) -> int:
        """RoundRobin's cursor after the run."""
        return int(self.ints[_CURSOR])

    @property
    def totals(self) -> tuple[float, float, float, float, float, float]:
        """``(now, Σ I, Σ G·M, Σ τ, Σ I loaded phase, Σ G·M loaded phase)``."""
        return tuple(float(x) for x in self.floats)  # type: ignore[return-value]


def run_fused(
    prompt: NDArray[np.int64],
    output: NDArray[np.int64],
    ready: NDArray[np.float64],
    *,
    saturated: bool,
    target: int,
    num_replicas: int,
    slots: int,
    spec: FusedPolicy,
    cursor: int,
    step_b: float,
    step_a: float,
    step_c: float,
    max_steps: int,
    record_series: bool,
    progress: Callable[[int], None] | None = None,
    chunk_steps: int = 1 << 15,
) -> FusedRun:
    """Run the whole workload (``ready`` = prefill-completed times, open loop; NaN saturated).

    Raises ``RuntimeError`` like the generic loop (step limit, or nothing can run). With
    ``progress``, the loop returns to Python every ``chunk_steps`` steps to report.
    """
    n = prompt.shape[0]
    g_count = num_replicas
    cap = min(n, target) if saturated else n
    ring = int(output.max()) + 1
    run = FusedRun(
        replica=np.full(n, -1, dtype=np.int64),
        start=np.full(n, -1, dtype=np.int64),
        finish=np.full(n, -1, dtype=np.int64),
        joined=np.array(ready, dtype=np.float64, copy=True),
        tick_time=np.full(n, np.nan),
        first_time=np.full(n, np.nan),
        finish_time=np.full(n, np.nan),
        loads=np.zeros(g_count, dtype=np.int64),
        ints=np.zeros(9, dtype=np.int64),
        floats=np.zeros(6, dtype=np.float64),
        series=np.empty((6, 1024), dtype=np.float64) if record_series else None,
    )
    run.ints[_CURSOR] = cursor
    n_act = np.zeros(g_count, dtype=np.int64)
    pool = np.empty(max(cap, 1), dtype=np.int64)
    head = np.full(ring, -1, dtype=np.int64)
    link = np.full(n, -1, dtype=np.int64)
    series = run.series if run.series is not None else np.empty((6, 0), dtype=np.float64)
    budget = chunk_steps if progress is not None else max_steps + 1
    reported = 0
    while True:
        series = _loop(
            prompt, output, ready, saturated, target, g_count, slots, spec.kind, spec.s_greedy,
            spec.r_max, float(spec.deadline_s), step_b, step_a, step_c, max_steps, budget,
            record_series, run.replica, run.start, run.finish, run.joined, run.tick_time,
            run.first_time, run.finish_time, run.loads, n_act, pool, head, link, run.ints,
            run.floats, series,
        )
        status = run.ints[_STATUS]
        finished = int(run.ints[_FINISHED])
        if progress is not None and finished != reported:
            progress(finished)
            reported = finished
        if status == _MAX_STEPS:
            raise RuntimeError(f"simulation exceeded {max_steps} steps")
        if status == _STUCK:  # pragma: no cover - a work-conserving policy never gets here
            raise RuntimeError("no request is running and none can be assigned")
        if status == _DONE:
            break
    if record_series:
        run.series = series[:, : run.ints[_N_SERIES]].copy()
    return run


@njit
def _fifo_choose(kind, loads, n_act, slots, cursor):  # pragma: no cover - compiled
    """The replica that takes the pool head: JSQ (fewest running, then KV load), LeastLoad (KV
    load, then running) or RoundRobin (next with a free slot from ``cursor``); ties: index."""
    g_count = loads.shape[0]
    if kind == ROUND_ROBIN:
        for t in range(g_count):
            r = (cursor + t) % g_count
            if n_act[r] < slots:
                return r
        return -1
    g = -1
    for r in range(g_count):
        if n_act[r] >= slots:
            continue
        if g < 0:
            g = r
        elif kind == JSQ:
            if n_act[r] < n_act[g] or (n_act[r] == n_act[g] and loads[r] < loads[g]):
                g = r
        elif loads[r] < loads[g] or (loads[r] == loads[g] and n_act[r] < n_act[g]):
            g = r
    return g


@njit
def _loop(
    prompt, output, ready, saturated, target, g_count, slots, kind, s_greedy, r_max, deadline_s,
    step_b, step_a, step_c, max_steps, budget, record, replica, start, finish, joined, tick_time,
    first_time, finish_time, loads, n_act, pool, head, link, ints, floats, series,
):  # pragma: no cover - compiled; checked against the generic loop by tests/core/test_fast_paths
    """Advance the simulation by at most ``budget`` steps; returns the (maybe grown) series."""
    n = prompt.shape[0]
    ring = head.shape[0]
    cap = pool.shape[0]
    k, nxt, finished = ints[_K], ints[_NXT], ints[_FINISHED]
    generated, pool_n, loaded_steps = ints[_GENERATED], ints[_POOL_N], ints[_LOADED_STEPS]
    cursor, n_series = ints[_CURSOR], ints[_N_SERIES]
    now, sum_i, sum_gm, sum_tau = floats[_NOW], floats[_SUM_I], floats[_SUM_GM], floats[_SUM_TAU]
    loaded_i, loaded_gm = floats[_LOADED_I], floats[_LOADED_GM]
    status = _RUNNING
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
    beta = float(g_count)
    steps_here = 0
    while True:
        if finished >= n:
            status = _DONE
            break
        if k >= max_steps:
            status = _MAX_STEPS
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
            if kind == TWO_STAGE:
                for g in range(g_count):
                    proj[g, 0] = float(loads[g])
                    free[g] = slots - n_act[g]
                for j in range(pool_n):
                    sizes[j] = float(prompt[pool[j]])
                    waited[j] = now - joined[pool[j]]
                n_chosen = _two_stage_kernel(
                    proj, free, sizes[:pool_n], waited[:pool_n], ones, 1.0, beta, s_greedy,
                    r_max, deadline_s, no_growth, False, out_i, out_g,
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
                    g = _fifo_choose(kind, loads, n_act, slots, cursor)
                    if kind == ROUND_ROBIN:
                        cursor = (g + 1) % g_count
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
            status = _STUCK
            break

        # (2) the step runs on the loads it has
        envelope = loads[0]
        total = 0
        for g in range(g_count):
            total += loads[g]
            if loads[g] > envelope:
                envelope = loads[g]
        imb = g_count * envelope - total
        if step_c == 0.0:
            tau = step_b + step_a * float(envelope)
        else:
            top = step_a * float(loads[0]) + step_c * float(n_act[0])
            for g in range(1, g_count):
                v = step_a * float(loads[g]) + step_c * float(n_act[g])
                if v > top:
                    top = v
            tau = step_b + top
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
                grown[:, :n_series] = series[:, :n_series]
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

    ints[_K], ints[_NXT], ints[_FINISHED] = k, nxt, finished
    ints[_GENERATED], ints[_POOL_N], ints[_LOADED_STEPS] = generated, pool_n, loaded_steps
    ints[_CURSOR], ints[_N_SERIES], ints[_STATUS] = cursor, n_series, status
    floats[_NOW], floats[_SUM_I], floats[_SUM_GM], floats[_SUM_TAU] = now, sum_i, sum_gm, sum_tau
    floats[_LOADED_I], floats[_LOADED_GM] = loaded_i, loaded_gm
    return series
