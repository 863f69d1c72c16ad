"""BR-0: the prediction-free BalanceRoute policy (the two-stage tick, :mod:`.two_stage`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ..lease import DEFAULT_LEASE
from ..state import Assignment, ClusterState, PoolView
from ..tick_contract import TWO_STAGE, CompiledTick
from ..two_stage import two_stage_assign

__all__ = ["GROWTH_TOKENS", "KV_GROWTH_STEPS", "KV_MAX_COLUMNS", "BR0Policy", "check_tick_params",
           "kv_until_end", "kv_window", "replica_extras", "stage1_growth_steps", "step_weights"]

_ONE = np.ones(1, dtype=np.float64)

GROWTH_TOKENS = 16_384.0
"""Stage 1's default growth window is T = GROWTH_TOKENS / B steps: a replica's free share of its B
slots is worth up to 16,384 tokens of margin (T = 256 at B = 64, 4,096 at B = 4)."""


DEADLINE_FACTOR = 3.0
"""The relative deadline's f (BR-0's and BR-H's ``deadline_factor``): a pooled request that has
waited f·2·w̃ — w̃ the pool's median wait, so 2·w̃ is about the wait FIFO would give — is placed
first, as at the KV lease's deadline (``papers/ttft.md``, "A relative deadline"). Chosen on
training draws 100–103 of the bundled and parametric groups (G = 8 and 16, saturated, 3,000
requests, the default step model at B = 64 and the calibrated one at B = 16; ``papers/quality.md``):
the largest f of 2 / 3 / 4 — the least balance given up — whose worst group keeps br0's TTFT P99
within 1.25× JSQ's (1.21 / 1.24 / 1.29; 1.53 without, on ``shape-correlated``)."""


KV_GROWTH_STEPS = 256
"""BR-0's KV budget window: a request may join replica g only while its load, grown T steps with
no departure, fits — L_g + n_g·T + Σ_{i∈Q} (s_i + T) ≤ B^KV_g — T = 256 steps (≈ 15 s at 60 ms).
Chosen on training draws (seeds 100–101, budgets 0.6 and 0.8 of the unconstrained peak,
``docs/replicas.md``): of T = 64 / 256 / 1024, 256 gave the highest loaded throughput on every
draw, 2.5–4× fewer preemptions than 64 and none on mooncake-conv; 1024 all but removes them on
azure-2024-long but holds back so much load that throughput falls below 64's."""


def step_weights(state: ClusterState) -> tuple[NDArray | None, NDArray | None]:
    """The tick's step-time form of the replicas: weights w_g = a_g / min a and
    offsets o_g = (b_g + c_g·n_g − min_r(b_r + c_r·n_r)) / min a, so that the loads w_g·L_g + o_g
    order the replicas as τ_g = b_g + a_g·L_g + c_g·n_g does. ``(None, None)`` — §1's token form,
    decision for decision — when the state carries no coefficients or every replica has the same
    ones."""
    if state.step_a is None:
        return None, None
    g = state.num_replicas
    a = np.asarray(state.step_a, dtype=np.float64)
    b = np.zeros(g) if state.step_b is None else np.asarray(state.step_b, dtype=np.float64)
    c = np.zeros(g) if state.step_c is None else np.asarray(state.step_c, dtype=np.float64)
    if np.all(a == a[0]) and np.all(b == b[0]) and np.all(c == c[0]):
        return None, None
    if not (np.all(a > 0) and np.all(np.isfinite(a))):
        raise ValueError(f"{state.step_a=} must be finite and > 0 for replicas of different speed")
    a_ref = float(a.min())
    base = b + c * state.num_active
    return a / a_ref, (base - base.min()) / a_ref


def kv_window(state: ClusterState, prompt_len: NDArray, *, steps: int = KV_GROWTH_STEPS,
              proj: NDArray | None = None, growth: NDArray | None = None,
              until_end: bool = True,
              plan: int | None = None) -> tuple[NDArray | None, NDArray | None]:
    """The tick's KV budget window (``room``, ``cost``) or ``(None, None)`` without budgets.
    BR-0 (``proj`` None) foresees no departure: room_g = B_g − L_g − n_g·T, cost_i = s_i + T
    (one column, T = ``steps``). BR-H: room_g(h) = B_g − L̂_g(h) on its projection, cost_i(h) =
    s_i + growth_i(h), h = 0..H. With ``state.output_cap`` known and ``until_end``, either way the
    window that holds until every request there has ended (:func:`kv_until_end`, with its
    ``plan``): never a preemption."""
    if state.kv_budget is None:
        return None, None
    if until_end and state.output_cap is not None:  # outputs bounded: plan until every end
        return kv_until_end(state, prompt_len, plan=plan)
    budget = np.asarray(state.kv_budget, dtype=np.float64)
    sizes = np.asarray(prompt_len, dtype=np.float64)
    if proj is None:
        room = budget - state.loads - state.num_active * float(steps)
        return room[:, None], (sizes + float(steps))[:, None]
    return budget[:, None] - proj, sizes[:, None] + growth


KV_MAX_COLUMNS = 64
"""At most this many checkpoints in :func:`kv_until_end`'s window (more departures than this are
merged into intervals, each checked at its worst point: still safe, slightly conservative)."""


def kv_until_end(state: ClusterState, prompt_len: NDArray, *, plan: int | None = None,
                 max_columns: int = KV_MAX_COLUMNS) -> tuple[NDArray, NDArray]:
    """The KV window that holds until every request on a replica has ended (``room`` (G, K),
    ``cost`` (P, K)), when no output exceeds ``state.output_cap`` = c.

    A request of prompt s and age a holds s + a + t KV tokens t steps from now while it runs, and
    runs at most until a + t = c − 1 (d = c − 1 − a); a pooled request placed now holds s + t
    until t = c − 1. Whatever the outputs (≤ c), replica g's load t steps ahead is therefore at
    most P_g(t) = Σ_{i on g, d_i ≥ t} (s_i + a_i + t), plus s_j + t for each request j placed now.
    Between two departures this bound grows linearly, so its maximum lies at a departure d_i, at
    t = 0 or at t = c − 1: the columns are those points, room_g(t) = B_g − P_g(t) and
    cost_j(t) = s_j + t, and a set Q fits g iff Σ_{j∈Q} (s_j + t) ≤ room_g(t) at every column — the
    load never passes the budget, so the engine never preempts, by construction. With more than
    ``max_columns`` points, consecutive ones are merged into intervals [t_lo, t_hi] checked at
    their worst (everyone present at t_lo, each at its size at min(t_hi, d_i); new requests at
    t_hi). A request that could not fit even alone (s_j + c − 1 > max_g B_g) costs max_g B_g in
    every column after t = 0: it fits only a replica with nothing running past this step and
    nothing else planned (it runs alone; the engine never preempts a lone request), and nothing
    joins it while it runs.

    ``plan`` (p < c): plan as if every request younger than p stopped by p tokens (a request
    already older is planned to c): no longer a guarantee — an output longer than p can overflow
    the budget — but far less held back when c is much longer than most outputs."""
    cap = int(state.output_cap)
    if cap < 1:
        raise ValueError(f"{state.output_cap=} must be >= 1")
    p = cap if plan is None else min(int(plan), cap)
    if p < 1:
        raise ValueError(f"{plan=} must be >= 1")
    budget = np.asarray(state.kv_budget, dtype=np.float64)
    sizes = np.asarray(prompt_len, dtype=np.float64)
    reps = np.asarray(state.active_replica, dtype=np.int64)
    held = (np.asarray(state.active_prompt, dtype=np.float64)
            + np.asarray(state.active_age, dtype=np.float64))
    age = np.asarray(state.active_age, dtype=np.int64)
    last = np.maximum(np.where(age < p, p, cap) - 1 - age, 0)  # d_i
    points = np.unique(np.concatenate([[0, p - 1], last]))
    if points.shape[0] > max_columns:  # merge into intervals [lo, hi]
        edges = np.unique(np.linspace(0, points.shape[0] - 1, max_columns).round().astype(np.int64))
        hi = points[edges]
        lo = np.concatenate([[0], hi[:-1] + 1])
    else:
        lo = hi = points
    size = held[:, None] + np.minimum(hi[None, :], last[:, None])  # (N, K)
    size[last[:, None] < lo[None, :]] = 0.0  # gone before the interval starts
    onehot = np.zeros((state.num_replicas, reps.shape[0]))
    onehot[reps, np.arange(reps.shape[0])] = 1.0
    proj = onehot @ size
    cost = sizes[:, None] + np.minimum(hi, p - 1)[None, :].astype(np.float64)
    cost[:, lo > p - 1] = 0.0  # (a plan shorter than the cap: gone by then)
    big = sizes + (p - 1) > budget.max()
    cost[big, 1:] = budget.max()  # (a prompt above every budget never fits, at t = 0)
    return budget[:, None] - proj, cost


def replica_extras(state: ClusterState, prompt_len: NDArray, *, steps: int = KV_GROWTH_STEPS,
                   proj: NDArray | None = None, growth: NDArray | None = None,
                   until_end: bool = True, plan: int | None = None) -> dict:
    """The keyword arguments of :func:`two_stage_assign` that carry replica speed and KV budgets
    (``weights``, ``offsets``, ``room``, ``cost``); empty for equal replicas without budgets, so
    any tick function with the original signature still runs."""
    extras: dict = {}
    w, o = step_weights(state)
    if w is not None:
        extras.update(weights=w, offsets=o)
    room, cost = kv_window(state, prompt_len, steps=steps, proj=proj, growth=growth,
                           until_end=until_end, plan=plan)
    if room is not None:
        extras.update(room=room, cost=cost)
    return extras


def stage1_growth_steps(growth_steps: float | None, slots: int) -> float:
    """T for Stage 1: ``growth_steps``, or ``GROWTH_TOKENS / B`` when it is ``None``."""
    return GROWTH_TOKENS / max(int(slots), 1) if growth_steps is None else float(growth_steps)


def check_tick_params(p: object) -> None:
    """Validate the tick parameters BR-0 and BR-H share (``ValueError`` naming the field)."""
    if p.s_greedy < 0:
        raise ValueError(f"{p.s_greedy=} must be >= 0")
    if not 0 <= p.r_max <= 12:
        raise ValueError(f"{p.r_max=} must be in 0..12 (0: the fill)")
    if not p.deadline_s > 0:
        raise ValueError(f"{p.deadline_s=} must be > 0")
    if p.growth_steps is not None and not (p.growth_steps >= 0 and np.isfinite(p.growth_steps)):
        raise ValueError(f"{p.growth_steps=} must be a finite number >= 0 (or None: 16384 / B)")
    if p.stage1 not in ("fit", "paper"):
        raise ValueError(f"{p.stage1=} must be 'fit' or 'paper'")
    if p.ttft_slo_s is not None and not (p.ttft_slo_s > 0 and np.isfinite(p.ttft_slo_s)):
        raise ValueError(f"{p.ttft_slo_s=} must be a number of seconds > 0 (or None: off)")
    f = p.deadline_factor
    if f is not None and not (f > 0 and np.isfinite(f)):
        raise ValueError(f"{p.deadline_factor=} must be a finite number > 0 (or None: off)")
    if not isinstance(p.lpt_batches, (bool, np.bool_)):
        raise ValueError(f"{p.lpt_batches=} must be true or false")


@dataclass(slots=True, kw_only=True)
class BR0Policy:
    """Two-stage tick scoring each candidate set by ``F_g(Q) = Δ − β·(Δ − m_g)_+`` on the
    current loads (β = ``beta_per_replica``·G; 1·G is minus the change of I, the shipped 3·G
    adds a safety margin: training-only sweep, ``papers/quality.md``): fill safe margins 1:1,
    punish overflow.

    ``s_greedy``: Stage 1 runs while more slots than this are free; ``stage1``: ``"fit"`` lets
    the replica with the largest margin ``growth_steps`` (T) steps ahead, m(0) + T·free, take its
    best request (``None``: T = 16384 / B), ``"paper"`` the replica with most free slots;
    ``r_max``: ``0`` (default) is the *fill* tick — Stage 2 visits replicas by margin and each
    takes the best of an exact subset-sum search over the whole pool (``papers/fill.md``; with
    ``stage1="fit"`` Stage 1 spreads by free slots while the pool holds ≥ G requests) — and
    1..12 the paper's Stage 2 (the best subset of the ``r_max`` best single candidates, the
    freest replica first); ``deadline_s``: pooled requests older than this are
    placed first (the KV lease's deadline, 25 s: ``core/lease.py``); ``ttft_slo_s``: the soft
    first-token deadline — a pooled request that has waited w gains the urgency bonus U·w/θ (U:
    the pool's largest single-request value; θ = min(``ttft_slo_s``, twice the pool's median wait):
    :func:`~balanceroute.core.two_stage.urgency_scale`), so at w = θ it outranks any request that
    merely fits (``papers/ttft.md``); ``None`` turns it off; ``deadline_factor`` f (3,
    :data:`DEADLINE_FACTOR`): the *relative deadline* — a pooled request that has waited f times
    twice the pool's median wait is placed first, as at ``deadline_s``
    (:func:`~balanceroute.core.two_stage.pool_deadline`; ``None``, or the guard off: only
    ``deadline_s``); ``lpt_batches``: a small batch
    placed whole in Stage 1 (fewer than 2G pooled requests, Σ free − |pool| ≥ ``s_greedy``: the
    regime below saturation) goes by LPT — largest prompt first, each to the least-loaded
    replica — when that overflows the current envelope less (``papers/quality.md``; chosen on
    training slices only). Replicas as they are: with per-replica step
    coefficients in the state the tick runs in step time (:func:`step_weights`), with KV budgets it
    never plans a replica's load above its budget within ``kv_growth_steps`` steps of growth
    (:func:`kv_window`) or, when the state carries the requests' output cap and
    ``kv_until_end`` (default), until every request on the replica has ended
    (:func:`kv_until_end`: never a preemption; ``kv_plan_output``: plan as if outputs stopped
    there — fewer held back, no longer a guarantee): all off, and the decisions unchanged,
    without them. ``tick_fn``: the routine that
    decides, with :func:`~balanceroute.core.two_stage.two_stage_assign`'s signature (the
    default; a benchmark injects the literal reference); the simulator's fused loop runs the
    default's kernel only while ``tick_fn`` is the default.
    """

    s_greedy: int = 8
    r_max: int = 0
    deadline_s: float = DEFAULT_LEASE.deadline_s  # the KV lease (core/lease.py): 25 s
    beta_per_replica: float = 3.0
    stage1: str = "fit"
    growth_steps: float | None = None
    ttft_slo_s: float | None = 4.0
    deadline_factor: float | None = DEADLINE_FACTOR
    lpt_batches: bool = True
    kv_growth_steps: int = KV_GROWTH_STEPS
    kv_until_end: bool = True
    kv_plan_output: int | None = None
    name: str = "br0"
    tick_fn: Callable[..., Assignment] = field(default=two_stage_assign, repr=False)

    def __post_init__(self) -> None:
        check_tick_params(self)
        if not self.beta_per_replica > 0:
            raise ValueError(f"{self.beta_per_replica=} must be > 0")
        if int(self.kv_growth_steps) != self.kv_growth_steps or self.kv_growth_steps < 0:
            raise ValueError(f"{self.kv_growth_steps=} must be an integer >= 0")
        if not isinstance(self.kv_until_end, (bool, np.bool_)):
            raise ValueError(f"{self.kv_until_end=} must be true or false")
        if self.kv_plan_output is not None and not (
                int(self.kv_plan_output) == self.kv_plan_output and self.kv_plan_output >= 1):
            raise ValueError(f"{self.kv_plan_output=} must be an integer >= 1 (or None: the cap)")

    def assign(self, state: ClusterState, pool: PoolView) -> Assignment:
        """One BR-0 tick on the current loads."""
        return self.tick_fn(
            state.loads[:, None],
            state.free_slots,
            pool.prompt_len,
            pool.wait,
            d=_ONE,
            alpha=1.0,
            beta=self.beta_per_replica * state.num_replicas,
            s_greedy=self.s_greedy,
            r_max=self.r_max,
            deadline_s=self.deadline_s,
            stage1=self.stage1,
            growth_steps=stage1_growth_steps(
                self.growth_steps, int((state.free_slots + state.num_active).max())),
            ttft_slo_s=self.ttft_slo_s,
            deadline_factor=self.deadline_factor,
            lpt_batches=self.lpt_batches,
            **replica_extras(state, pool.prompt_len, steps=self.kv_growth_steps,
                             until_end=self.kv_until_end, plan=self.kv_plan_output),
        )

    def compiled_tick(self, slots: int) -> CompiledTick | None:
        """This tick for the fused loop (the kernel of ``two_stage_assign`` with these
        parameters), or ``None`` if ``tick_fn`` or a subclass's ``assign`` decides instead."""
        if self.tick_fn is not two_stage_assign or type(self).assign is not BR0Policy.assign:
            return None
        return CompiledTick(
            kind=TWO_STAGE, s_greedy=self.s_greedy, r_max=self.r_max, deadline_s=self.deadline_s,
            deadline_factor=float("inf") if self.deadline_factor is None else self.deadline_factor,
            beta_per_replica=self.beta_per_replica, fit_stage1=self.stage1 == "fit",
            growth_steps=stage1_growth_steps(self.growth_steps, slots),
            ttft_slo_s=float("inf") if self.ttft_slo_s is None else float(self.ttft_slo_s),
            lpt_batches=bool(self.lpt_batches),
        )

    def restore_tick_state(self, state: NDArray[np.int64]) -> None:
        """BR-0 keeps no state across ticks."""
