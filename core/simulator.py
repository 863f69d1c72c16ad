"""The step-synchronous data-parallel decode cluster of DESIGN §1.

Per decode step k, in this order: (1) the scheduling tick assigns pooled requests to free slots
(bound for life); (2) the step runs on the loads it has: L_g(k), I(k) are recorded and τ(k)
elapses; (3) every active request generates one token (L_g grows by n_g) and a request whose age
reaches o_i finishes and frees its slot (its s_i + o_i tokens leave L_g).

Request state lives in numpy columns; no per-request Python objects. Two loops run these
dynamics with identical results: the fused compiled loop (:mod:`.fused`, for policies with a
compiled tick) and the generic loop (any :class:`Policy`, called through ``assign``). Memory is
O(requests + G·B): per-request outcome columns, no per-step history unless
``record_series``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from ._jit import HAVE_NUMBA
from ._kernels import skip_tickless_steps
from .dynamics import StepModel, request_metrics, step_metrics
from .fused import compiled_tick, run_fused
from .outcomes import RequestColumns
from .policies.base import Policy
from .state import ClusterState, PoolView, validate_assignment
from .workloads.base import Workload

__all__ = ["SimConfig", "SimResult", "simulate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """One simulated cluster and how requests reach it.

    ``mode="saturated"``: the pool is refilled once per step (before the tick) to ``pool_size``
    requests, taken in trace order — the paper's saturated load. ``mode="open_loop"``: requests
    join the pool at ``arrival_s / rate_scale + prefill_delay_s``.
    ``pool_size`` defaults to 2·G (enough choice for the tick, short enough that pool waits stay
    far below a KV lease).
    """

    num_replicas: int = 8
    slots: int = 64
    mode: Literal["saturated", "open_loop"] = "saturated"
    pool_size: int | None = None
    rate_scale: float = 1.0
    prefill_delay_s: float = 0.0
    step_model: StepModel = field(default_factory=StepModel)
    record_series: bool = False
    check_assignments: bool = True
    max_steps: int = 100_000_000

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"{self.num_replicas=} must be >= 1")
        if self.slots < 1:
            raise ValueError(f"{self.slots=} must be >= 1")
        if self.mode not in ("saturated", "open_loop"):
            raise ValueError(f"{self.mode=} must be 'saturated' or 'open_loop'")
        if self.pool_size is not None and self.pool_size < 1:
            raise ValueError(f"{self.pool_size=} must be >= 1")
        if not self.rate_scale > 0:
            raise ValueError(f"{self.rate_scale=} must be > 0")
        if self.prefill_delay_s < 0:
            raise ValueError(f"{self.prefill_delay_s=} must be >= 0")

    @property
    def pool_target(self) -> int:
        """The saturated-mode pool size."""
        return self.pool_size if self.pool_size is not None else 2 * self.num_replicas


@dataclass(slots=True)
class SimResult:
    """Metrics of one run, per-request outcomes and (if asked) the per-step series.

    The metrics and their definitions are :mod:`~balanceroute.core.dynamics`'s (the loaded
    phase, ``mean_imbalance``, ``barrier_idle_fraction``, ``throughput_loaded_tok_s``, TPOT,
    TTFT, pool wait), plus ``requests`` and ``makespan_s`` (the clock when the last request
    finished).
    """

    metrics: dict[str, float]
    replica: NDArray[np.int64]
    start_step: NDArray[np.int64]
    finish_step: NDArray[np.int64]
    ttft_s: NDArray[np.float64]
    tpot_s: NDArray[np.float64]
    pool_wait_s: NDArray[np.float64]
    series: dict[str, NDArray] | None = None


class _Series:
    """Growable per-step columns (amortised doubling, numpy storage)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.n = 0
        self.cols = {name: np.empty(1024, dtype=np.float64) for name in names}

    def append(self, **values: float) -> None:
        if self.n == next(iter(self.cols.values())).shape[0]:
            self.cols = {k: np.concatenate([v, np.empty_like(v)]) for k, v in self.cols.items()}
        for key, value in values.items():
            self.cols[key][self.n] = value
        self.n += 1

    def extend(self, block: NDArray) -> None:
        """Append the columns of ``block`` (one row per series, in ``names`` order)."""
        m = block.shape[1]
        while self.n + m > next(iter(self.cols.values())).shape[0]:
            self.cols = {k: np.concatenate([v, np.empty_like(v)]) for k, v in self.cols.items()}
        for row, col in zip(block, self.cols.values(), strict=True):
            col[self.n:self.n + m] = row
        self.n += m

    def arrays(self) -> dict[str, NDArray]:
        return {k: v[: self.n].copy() for k, v in self.cols.items()}


Engine = Literal["auto", "fused", "generic"]


@dataclass(slots=True)
class _Raw:
    """What either loop leaves behind, before metrics are computed."""

    cols: RequestColumns
    steps: int
    now: float
    generated: int
    sum_i: float
    sum_tau: float
    loaded: tuple[float, float, int]
    loads_left: bool
    series: dict[str, NDArray] | None


_SERIES = ("imbalance", "envelope", "total_load", "step_time", "active", "pool")


def simulate(
    workload: Workload,
    policy: Policy,
    config: SimConfig,
    *,
    progress: Callable[[int], None] | None = None,
    engine: Engine = "auto",
) -> SimResult:
    """Run ``workload`` through ``policy`` on the cluster of ``config`` until every request has
    finished. Deterministic for a given workload, policy (and its seed) and config.

    ``engine``: ``"auto"`` runs the fused compiled loop (:mod:`~balanceroute.core.fused`) when
    the policy declares a compiled tick (``policy.compiled_tick``: BR-0, JSQ, LeastLoad,
    RoundRobin; the run's state goes back through ``policy.restore_tick_state``) and the generic
    loop —
    ``policy.assign`` on a :class:`ClusterState`/:class:`PoolView` every tick — otherwise;
    ``"generic"`` forces the generic loop, ``"fused"`` demands the fused one (``ValueError`` if
    the policy has none). Both give identical results. The fused loop does not re-validate
    assignments (``config.check_assignments``): its ticks are the tested kernels.

    ``progress(n_finished)`` is called now and then (for a progress bar).
    """
    n = len(workload)
    if n == 0:
        raise ValueError("the workload has no requests")
    if engine not in ("auto", "fused", "generic"):
        raise ValueError(f"{engine=} must be 'auto', 'fused' or 'generic'")
    prompt = np.ascontiguousarray(workload.prompt_len, dtype=np.int64)
    output = np.ascontiguousarray(workload.output_len, dtype=np.int64)
    saturated = config.mode == "saturated"
    if saturated:
        ready = np.full(n, np.nan)
    else:
        if workload.arrival_s is None:
            raise ValueError(f"workload {workload.name!r} has no timestamps: open-loop mode needs them")
        arrival = workload.arrival_s.astype(np.float64) / config.rate_scale
        if np.any(np.diff(arrival) < 0):
            raise ValueError(f"workload {workload.name!r}: arrival_s must be non-decreasing")
        ready = arrival + config.prefill_delay_s

    tick = compiled_tick(policy, config.slots) if engine != "generic" else None
    if engine == "fused" and tick is None:
        raise ValueError(f"policy {getattr(policy, 'name', policy)!r} has no fused loop")
    if tick is not None:
        raw = _run_fused(prompt, output, ready, policy, tick, config, progress)
    else:
        raw = _run_generic(prompt, output, ready, policy, config, progress)

    if raw.generated != int(output.sum()) or raw.loads_left:
        raise AssertionError("token conservation violated")  # pragma: no cover
    arrival = raw.cols.joined if saturated else arrival
    return _result(raw, n, output, arrival)


def _run_fused(prompt, output, ready, policy, tick, config, progress) -> _Raw:
    step = config.step_model
    run = run_fused(
        prompt, output, ready, saturated=config.mode == "saturated", target=config.pool_target,
        num_replicas=config.num_replicas, slots=config.slots, tick=tick, step_b=step.b,
        step_a=step.a, step_c=step.c, max_steps=config.max_steps,
        record_series=config.record_series, progress=progress,
    )
    policy.restore_tick_state(run.state)  # e.g. RoundRobin's cursor persists, as in assign
    now, sum_i, _, sum_tau, loaded_i, loaded_gm = run.totals
    return _Raw(
        cols=run.cols, steps=run.steps, now=now, generated=run.generated, sum_i=sum_i,
        sum_tau=sum_tau,
        loaded=(loaded_i, loaded_gm, run.loaded_steps), loads_left=bool(run.loads.any()),
        series=None if run.series is None else dict(zip(_SERIES, run.series, strict=True)),
    )


def _run_generic(prompt, output, ready, policy, config, progress) -> _Raw:
    """The generic loop: ``policy.assign`` through the contract, every tick. Steps at whose
    start nothing is admitted or assigned (every slot busy or the pool empty) run in a
    compiled helper that does exactly what the Python body below does for them."""
    n = prompt.shape[0]
    g_count, b_slots = config.num_replicas, config.slots
    saturated = config.mode == "saturated"
    cols = RequestColumns.empty(ready)
    replica, start, finish, joined, tick_time, first_time, finish_time = cols.arrays()

    slot_req = np.full(g_count * b_slots, -1, dtype=np.int64)
    slot_end = np.full(g_count * b_slots, -1, dtype=np.int64)
    loads = np.zeros(g_count, dtype=np.int64)
    n_act = np.zeros(g_count, dtype=np.int64)
    pool = np.zeros(0, dtype=np.int64)
    nxt = 0
    k = 0
    now = 0.0
    finished = 0
    generated = 0
    sum_i = sum_gm = sum_tau = 0.0
    loaded = (0.0, 0.0, 0)  # (Σ I, Σ G·M, steps) up to the last assigning step
    series = _Series(_SERIES) if config.record_series else None
    target = config.pool_target

    # steps with nothing to admit or assign run compiled (same arithmetic, same order)
    skip = HAVE_NUMBA
    if skip:
        step = config.step_model
        ints = np.zeros(3, dtype=np.int64)
        floats = np.zeros(4, dtype=np.float64)
        block = np.empty((6, 4096 if series is not None else 0), dtype=np.float64)

    while finished < n:
        if skip:
            ints[:] = (k, finished, generated)
            floats[:] = (now, sum_i, sum_gm, sum_tau)
            ran = skip_tickless_steps(
                prompt, output, ready, saturated, pool.shape[0], target, nxt, g_count, b_slots,
                step.b, step.a, step.c, config.max_steps, loads, n_act, slot_req, slot_end,
                finish, finish_time, ints, floats, block,
            )
            if ran:
                before = finished
                k, finished, generated = (int(x) for x in ints)
                now, sum_i, sum_gm, sum_tau = (float(x) for x in floats)
                if series is not None:
                    series.extend(block[:, :ran])
                if progress is not None and finished != before:
                    progress(finished)
                continue
        if k >= config.max_steps:
            raise RuntimeError(f"simulation exceeded {config.max_steps} steps")
        # admit: saturated refill, or arrivals whose prefill has completed
        if saturated:
            take = min(target - pool.shape[0], n - nxt)
            if take > 0:
                new = np.arange(nxt, nxt + take, dtype=np.int64)
                joined[new] = now
        else:
            take = int(np.searchsorted(ready, now, side="right")) - nxt
            new = np.arange(nxt, nxt + take, dtype=np.int64)
        if take > 0:
            pool = np.concatenate([pool, new])
            nxt += take

        # (1) the scheduling tick
        assigned_now = False
        chosen = pool[:0]
        free = b_slots - n_act
        if pool.shape[0] and free.sum():
            occupied = np.flatnonzero(slot_req >= 0)
            ids = slot_req[occupied]
            state = ClusterState(
                loads=loads.copy(), free_slots=free, num_active=n_act.copy(), step=k, now=now,
                active_replica=occupied // b_slots, active_prompt=prompt[ids],
                active_age=k - start[ids], active_ids=ids,
            )
            view = PoolView(prompt_len=prompt[pool], wait=now - joined[pool], request_ids=pool.copy())
            decision = policy.assign(state, view)
            if config.check_assignments:
                validate_assignment(state, view, decision)
            if len(decision):
                chosen = pool[decision.pool_index]
                for rid, g in zip(chosen.tolist(), decision.replica.tolist()):
                    row = slot_req[g * b_slots:(g + 1) * b_slots]
                    slot = g * b_slots + int(np.argmax(row < 0))
                    slot_req[slot] = rid
                    slot_end[slot] = k + output[rid] - 1
                replica[chosen] = decision.replica
                start[chosen] = k
                tick_time[chosen] = now
                np.add.at(loads, decision.replica, prompt[chosen])
                n_act += np.bincount(decision.replica, minlength=g_count)
                keep = np.ones(pool.shape[0], dtype=bool)
                keep[decision.pool_index] = False
                pool = pool[keep]
                assigned_now = True

        if not n_act.any():
            # idle: nothing runs; jump to the next arrival (open loop only)
            if pool.shape[0] == 0 and nxt < n and not saturated:
                now = max(now, float(ready[nxt]))
                continue
            raise RuntimeError("no request is running and none can be assigned")  # pragma: no cover

        # (2) the step runs on the loads it has
        envelope = int(loads.max())
        total = int(loads.sum())
        imb = g_count * envelope - total
        tau = config.step_model.step_time(loads, n_act)
        now += tau
        sum_i += imb
        sum_gm += g_count * envelope
        sum_tau += tau
        if assigned_now:
            loaded = (sum_i, sum_gm, k + 1)
            first_time[chosen] = now
        if series is not None:
            series.append(imbalance=imb, envelope=envelope, total_load=total, step_time=tau,
                          active=int(n_act.sum()), pool=pool.shape[0])

        # (3) every active request generates one token; some finish
        generated += int(n_act.sum())
        loads += n_act
        done = np.flatnonzero(slot_end == k)
        if done.shape[0]:
            rids = slot_req[done]
            gs = done // b_slots
            np.subtract.at(loads, gs, prompt[rids] + output[rids])
            n_act -= np.bincount(gs, minlength=g_count)
            slot_req[done] = -1
            slot_end[done] = -1
            finish[rids] = k
            finish_time[rids] = now
            finished += done.shape[0]
            if progress is not None:
                progress(finished)
        k += 1

    return _Raw(
        cols=cols, steps=k, now=now, generated=generated,
        sum_i=sum_i, sum_tau=sum_tau, loaded=loaded, loads_left=bool(loads.any()),
        series=series.arrays() if series is not None else None,
    )


def _result(raw: _Raw, n: int, output: NDArray, arrival: NDArray) -> SimResult:
    """Metrics (:mod:`.dynamics`) and per-request outcomes from either loop."""
    cols = raw.cols
    loaded_i, loaded_gm, loaded_steps = raw.loaded
    tokens, clock = _loaded_window(cols, loaded_steps)
    per_request, tpot, ttft, wait = request_metrics(output, cols.first_time, cols.finish_time,
                                                     arrival, cols.tick_time, cols.joined)
    metrics: dict[str, float] = {
        "requests": float(n),
        **step_metrics(steps=raw.steps, generated=raw.generated, sum_i=raw.sum_i,
                       sum_tau=raw.sum_tau, loaded_i=loaded_i, loaded_gm=loaded_gm,
                       loaded_steps=loaded_steps, loaded_tokens=tokens, loaded_clock=clock,
                       makespan=raw.now),
        **per_request,
    }
    return SimResult(
        metrics=metrics,
        replica=cols.replica,
        start_step=cols.start,
        finish_step=cols.finish,
        ttft_s=ttft,
        tpot_s=tpot,
        pool_wait_s=wait,
        series=raw.series,
    )


def _loaded_window(cols: RequestColumns, loaded_steps: int) -> tuple[float, float]:
    """(tokens generated in steps 0..k_last, the clock at the end of step k_last)."""
    k_last = loaded_steps - 1
    if k_last < 0:
        return 0.0, 0.0
    started = cols.start >= 0
    active_steps = np.minimum(cols.finish[started], k_last) - cols.start[started] + 1
    tokens = float(np.clip(active_steps, 0, None).sum())
    return tokens, float(np.max(cols.first_time[cols.start == k_last]))  # the end of step k_last
