"""The step-synchronous data-parallel decode cluster of the barrier model (``papers/theory.md``).

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
from .lease import DEFAULT_LEASE, LeaseRule
from .outcomes import RequestColumns
from .policies.base import Policy
from .replica_engine import RECOMPUTE_S_PER_TOKEN, CompiledReplicaEngine, engine_class
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
    ``lease``: the KV lease (:class:`~balanceroute.core.lease.LeaseRule`): a pooled request whose
    wait reaches ``lease.forward_by_s`` is never placed; it is prefilled again (rejoins the pool
    ``prefill_delay_s`` after that point, its wait restarted) up to ``lease.max_reprefills``
    times, then failed (metrics ``kv_lease_reprefilled``, ``kv_lease_failed``: counts;
    ``kv_lease_missed``: share of requests that missed it at least once). ``None``: no lease.
    ``kv_budget``: each replica's KV token budget B^KV_g (one number for every replica, or one
    per replica; ``None``: unbounded) and ``replica_steps``: one :class:`StepModel` per replica
    (``None``: ``step_model`` everywhere). With either set the generic loop hands its steps to a
    :class:`~balanceroute.core.replica_engine.ReplicaEngine` — waiting queues at the replicas,
    vLLM's preemption of the newest running request, recompute at ``recompute_s_per_token``,
    τ = max_g τ_g — and the policy sees the budgets and coefficients in its
    :class:`ClusterState`; metrics ``preemptions``, ``recomputed_tokens``,
    ``replica_wait_mean_steps``, ``step_idle_fraction`` and ``mean_step_idle_ms`` are added.
    ``output_cap``: every request's ``max_tokens`` — outputs longer than this stop at it — told to
    the policy (``ClusterState.output_cap``), so that a budget-aware policy can plan until every
    request has ended; ``None``: outputs as the workload has them, no cap told.
    """

    num_replicas: int = 8
    slots: int = 64
    mode: Literal["saturated", "open_loop"] = "saturated"
    pool_size: int | None = None
    rate_scale: float = 1.0
    prefill_delay_s: float = 0.0
    step_model: StepModel = field(default_factory=StepModel)
    lease: LeaseRule | None = DEFAULT_LEASE
    kv_budget: int | tuple[int, ...] | None = None
    replica_steps: tuple[StepModel, ...] | None = None
    recompute_s_per_token: float = RECOMPUTE_S_PER_TOKEN
    output_cap: int | None = None
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
        if self.kv_budget is not None:
            budget = np.atleast_1d(np.asarray(self.kv_budget))
            if budget.shape[0] not in (1, self.num_replicas) or not np.all(budget >= 1):
                raise ValueError(f"{self.kv_budget=} must be one positive token count or one "
                                 f"per replica ({self.num_replicas})")
        if self.replica_steps is not None and len(self.replica_steps) != self.num_replicas:
            raise ValueError(f"{self.replica_steps=} must name one step model per replica "
                             f"({self.num_replicas})")
        if not (self.recompute_s_per_token >= 0 and np.isfinite(self.recompute_s_per_token)):
            raise ValueError(f"{self.recompute_s_per_token=} must be a finite number >= 0")
        if self.output_cap is not None and not (int(self.output_cap) == self.output_cap
                                                and self.output_cap >= 1):
            raise ValueError(f"{self.output_cap=} must be an integer >= 1 (or None)")

    @property
    def engine_model(self) -> bool:
        """Whether the replicas' engines are modelled (a KV budget or per-replica speeds)."""
        return self.kv_budget is not None or self.replica_steps is not None

    def budgets(self) -> NDArray[np.int64] | None:
        """The KV budget per replica, (G,), or ``None``."""
        if self.kv_budget is None:
            return None
        budget = np.atleast_1d(np.asarray(self.kv_budget, dtype=np.int64))
        return np.broadcast_to(budget, (self.num_replicas,)).copy()

    def steps_per_replica(self) -> tuple[StepModel, ...]:
        """The step model of each replica."""
        return self.replica_steps or (self.step_model,) * self.num_replicas

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
    reprefills: NDArray[np.int64] | None = None  # KV lease: re-prefills per request
    failed: NDArray[np.bool_] | None = None  # KV lease: requests failed after the last one
    first_joined: NDArray[np.float64] | None = None  # saturated: first time in the pool
    loaded_window: tuple[float, float] | None = None  # replicas: (tokens, clock) to k_last
    engine_metrics: dict[str, float] | None = None  # replicas: preemptions, step idle, ...


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
    if config.output_cap is not None:  # max_tokens: longer outputs stop at the cap
        output = np.minimum(output, int(config.output_cap))
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

    # (the fused loop models neither KV budgets nor per-replica speeds: the generic loop does)
    tick = (compiled_tick(policy, config.slots)
            if engine != "generic" and not config.engine_model else None)
    if engine == "fused" and config.engine_model:
        raise ValueError("the fused loop models no KV budget and no per-replica speed: "
                         "use engine='generic' or 'auto'")
    if engine == "fused" and tick is None:
        raise ValueError(f"policy {getattr(policy, 'name', policy)!r} has no fused loop")
    if tick is not None:
        raw = _run_fused(prompt, output, ready, policy, tick, config, progress)
        # --- KV lease (LeaseRule): the fused loop has no lease; a run in which no placed request
        # had waited past forward_by_s had no lease event, so it is exactly the leased run;
        # otherwise the generic loop, which applies the lease, runs it again.
        if config.lease is not None and np.any(
                raw.cols.tick_time - raw.cols.joined >= config.lease.forward_by_s):
            policy.restore_tick_state(tick.state)  # the re-run starts from the policy's state
            raw = _run_generic(prompt, output, ready, policy, config, progress)
        # --- end KV lease
    else:
        raw = _run_generic(prompt, output, ready, policy, config, progress)

    done = raw.cols.finish >= 0
    if raw.generated != int(output[done].sum()) or raw.loads_left:
        raise AssertionError("token conservation violated")  # pragma: no cover
    if saturated:
        arrival = raw.cols.joined if raw.first_joined is None else raw.first_joined
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
    # --- KV lease (SimConfig.lease): re-prefill counts, failures, requests being prefilled again
    lease = config.lease
    reprefills = np.zeros(n, dtype=np.int64)
    failed = np.zeros(n, dtype=bool)
    first_joined = np.full(n, np.nan)
    pending = np.zeros(0, dtype=np.int64)
    # --- end KV lease
    # --- replicas (SimConfig.kv_budget / replica_steps): the engines run the steps; the loop's
    # loads and n_act are the engine's router view (every routed, unfinished request)
    eng = None
    if config.engine_model:
        steps_g = config.steps_per_replica()
        budgets = config.budgets()
        engine = engine_class()
        eng = (CompiledReplicaEngine(prompt, output, g_count, budgets, steps_g,
                                     config.recompute_s_per_token, slots=b_slots)
               if engine is CompiledReplicaEngine else
               engine(prompt, output, g_count, budgets, steps_g, config.recompute_s_per_token))
        loads, n_act = eng.loads, eng.assigned
        idle_sum, loaded_window, loaded_idle = 0.0, (0.0, 0.0), (0.0, 0.0)
        kv_sum, loaded_kv = 0.0, 0.0  # Σ_k Σ_g L_g(k) on the running KV
    # --- end replicas

    # steps with nothing to admit or assign run compiled (same arithmetic, same order)
    skip = HAVE_NUMBA and eng is None
    if skip:
        step = config.step_model
        ints = np.zeros(3, dtype=np.int64)
        floats = np.zeros(4, dtype=np.float64)
        block = np.empty((6, 4096 if series is not None else 0), dtype=np.float64)

    while finished < n:
        if skip and not pending.shape[0]:
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
        # --- KV lease: past forward_by_s a request is prefilled again (rejoins prefill_delay_s
        # after that point, its wait restarted) or, out of re-prefills, failed; never placed
        if lease is not None:
            if take > 0 and saturated:
                first_joined[new] = now
            if pending.shape[0]:
                back = joined[pending] <= now
                pool, pending = np.concatenate([pool, pending[back]]), pending[~back]
            while pool.shape[0]:  # a skipped stretch of full steps can hide several misses
                late = lease.expired(now - joined[pool])
                if not late.any():
                    break
                gone = pool[late]
                pool = pool[~late]
                again = gone[reprefills[gone] < lease.max_reprefills]
                lost = gone[reprefills[gone] >= lease.max_reprefills]
                reprefills[again] += 1
                joined[again] += lease.forward_by_s + config.prefill_delay_s
                failed[lost] = True
                finished += lost.shape[0]
                back = joined[again] <= now
                pool, pending = np.concatenate([pool, again[back]]), np.concatenate(
                    [pending, again[~back]])
        # --- end KV lease

        # (1) the scheduling tick
        assigned_now = False
        chosen = pool[:0]
        free = b_slots - n_act
        if pool.shape[0] and free.sum():
            if eng is None:
                occupied = np.flatnonzero(slot_req >= 0)
                ids = slot_req[occupied]
                state = ClusterState(
                    loads=loads.copy(), free_slots=free, num_active=n_act.copy(), step=k, now=now,
                    active_replica=occupied // b_slots, active_prompt=prompt[ids],
                    active_age=k - start[ids], active_ids=ids,
                )
            else:  # --- replicas: the router's view, with the budgets and the coefficients
                ids = eng.routed_ids()
                state = ClusterState(
                    loads=loads.copy(), free_slots=free, num_active=n_act.copy(), step=k, now=now,
                    active_replica=eng.replica[ids], active_prompt=prompt[ids],
                    active_age=eng.age[ids], active_ids=ids,
                    kv_budget=None if budgets is None else budgets.copy(),
                    step_a=eng.step_a.copy(), step_b=eng.step_b.copy(), step_c=eng.step_c.copy(),
                    output_cap=config.output_cap,
                )
            view = PoolView(prompt_len=prompt[pool], wait=now - joined[pool], request_ids=pool.copy())
            decision = policy.assign(state, view)
            if config.check_assignments:
                validate_assignment(state, view, decision, budget=True)
            if len(decision):
                chosen = pool[decision.pool_index]
                if eng is not None:  # --- replicas: to the replicas' waiting queues
                    eng.route(chosen, decision.replica)
                else:
                    for rid, g in zip(chosen.tolist(), decision.replica.tolist()):
                        row = slot_req[g * b_slots:(g + 1) * b_slots]
                        slot = g * b_slots + int(np.argmax(row < 0))
                        slot_req[slot] = rid
                        slot_end[slot] = k + output[rid] - 1
                    np.add.at(loads, decision.replica, prompt[chosen])
                    n_act += np.bincount(decision.replica, minlength=g_count)
                replica[chosen] = decision.replica
                start[chosen] = k
                tick_time[chosen] = now
                keep = np.ones(pool.shape[0], dtype=bool)
                keep[decision.pool_index] = False
                pool = pool[keep]
                assigned_now = True

        if not n_act.any():
            # idle: nothing runs; jump to the next arrival (open loop only)
            if pool.shape[0] == 0 and nxt < n and not saturated:
                now = max(now, float(ready[nxt]))
                continue
            if pool.shape[0] == 0 and pending.shape[0]:  # KV lease: a re-prefill is due
                now = max(now, float(joined[pending].min()))
                continue
            if finished >= n:  # KV lease: the last requests failed
                break
            raise RuntimeError("no request is running and none can be assigned")  # pragma: no cover

        # --- replicas: the engines schedule and run the step (waiting queues, preemption,
        # τ = max_g τ_g on the running requests); same bookkeeping as (2) and (3) below
        if eng is not None:
            rec = eng.step()
            now += rec.tau
            sum_i += rec.imbalance
            sum_gm += g_count * rec.envelope
            sum_tau += rec.tau
            idle_sum += rec.time_idle
            kv_sum += rec.total
            generated += rec.active
            if assigned_now:
                loaded = (sum_i, sum_gm, k + 1)
                loaded_window = (float(generated), now)
                loaded_idle = (idle_sum, g_count * sum_tau)
                loaded_kv = kv_sum
            first_time[rec.started] = now
            if series is not None:
                series.append(imbalance=rec.imbalance, envelope=rec.envelope,
                              total_load=rec.total, step_time=rec.tau, active=rec.active,
                              pool=pool.shape[0])
            if rec.finished.shape[0]:
                finish[rec.finished] = k
                finish_time[rec.finished] = now
                finished += rec.finished.shape[0]
                if progress is not None:
                    progress(finished)
            k += 1
            continue
        # --- end replicas

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
        reprefills=None if lease is None else reprefills, failed=None if lease is None else failed,
        first_joined=first_joined if lease is not None and saturated else None,
        loaded_window=None if eng is None else loaded_window,
        engine_metrics=None if eng is None else {
            "preemptions": float(eng.preemptions),
            "preemptions_oversize": float(eng.preemptions_oversize),
            "recomputed_tokens": float(eng.recomputed_tokens),
            "replica_wait_mean_steps": eng.waiting_steps / n,
            "step_idle_fraction": loaded_idle[0] / loaded_idle[1] if loaded_idle[1] else 0.0,
            "mean_step_idle_ms": 1e3 * loaded_idle[0] / (g_count * max(loaded[2], 1)),
            **({} if budgets is None else {  # share of the cluster's KV budget in use
                "kv_utilization": loaded_kv / (max(loaded[2], 1) * float(budgets.sum())),
                "kv_oversize": float(np.sum(prompt + output - 1 > budgets.max()))}),
        },
    )


def _result(raw: _Raw, n: int, output: NDArray, arrival: NDArray) -> SimResult:
    """Metrics (:mod:`.dynamics`) and per-request outcomes from either loop."""
    cols = raw.cols
    loaded_i, loaded_gm, loaded_steps = raw.loaded
    tokens, clock = (_loaded_window(cols, loaded_steps) if raw.loaded_window is None
                     else raw.loaded_window)
    per_request, tpot, ttft, wait = request_metrics(output, cols.first_time, cols.finish_time,
                                                     arrival, cols.tick_time, cols.joined)
    # --- KV lease: counts, and the share of requests that missed it at least once
    if raw.reprefills is not None:
        missed = (raw.reprefills > 0) | raw.failed
        if raw.failed.any():  # metrics of the requests that were served
            ok = ~raw.failed
            per_request, *_ = request_metrics(output[ok], cols.first_time[ok],
                                              cols.finish_time[ok], arrival[ok],
                                              cols.tick_time[ok], cols.joined[ok])
        per_request = {**per_request, "kv_lease_missed": float(np.mean(missed)),
                       "kv_lease_reprefilled": float(raw.reprefills.sum()),
                       "kv_lease_failed": float(raw.failed.sum())}
    else:
        per_request = {**per_request, "kv_lease_reprefilled": 0.0, "kv_lease_failed": 0.0}
    # --- end KV lease
    metrics: dict[str, float] = {
        "requests": float(n),
        **step_metrics(steps=raw.steps, generated=raw.generated, sum_i=raw.sum_i,
                       sum_tau=raw.sum_tau, loaded_i=loaded_i, loaded_gm=loaded_gm,
                       loaded_steps=loaded_steps, loaded_tokens=tokens, loaded_clock=clock,
                       makespan=raw.now),
        **per_request,
        **(raw.engine_metrics or {}),  # --- replicas
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
