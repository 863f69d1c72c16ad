"""BR-H: BalanceRoute with a short-horizon lookahead driven by a termination predictor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..guard import BR0_ARM, GuardLedger, OnlineGuard
from ..lease import DEFAULT_LEASE
from ..model import discounts
from ..predictors.base import FeatureSource, Predictor, RequestFeatures
from ..projection import departure_steps, placement_growth, project_loads, projected_cost
from ..state import Assignment, ClusterState, PoolView
from ..two_stage import BACKLOG_PER_REPLICA, two_stage_assign
from ..workloads.base import Workload
from .br0 import (
    DEADLINE_FACTOR,
    BR0Policy,
    check_tick_params,
    replica_extras,
    stage1_growth_steps,
)

__all__ = ["DEFAULT_BETA_PER_REPLICA", "DEFAULT_SAFEGUARD", "SHARP_SPREAD", "BRHPolicy"]

DEFAULT_BETA_PER_REPLICA = 3.0
"""β = 3·G by default — BR-0's own β (``BR0Policy.beta_per_replica``): with H = 0 BR-H's tick *is*
BR-0's, so the lookahead changes a decision only through what it sees ahead, never through a
different price of overflow. (It was 2·G, from a sweep on the bundle; at H = 0 that alone made the
clairvoyant row lose to br0 on workloads outside the bundle: ``papers/quality.md``, "A lookahead
that departs from BR-0 only by what it sees".)"""

DEFAULT_SAFEGUARD = 0.05
"""The lookahead's plan replaces BR-0's only when it projects ≥ 5 % less discounted imbalance
(training-only sweep ``sweep_defaults safeguard``, ``papers/quality.md``)."""

SHARP_SPREAD = 0.5
"""A forecast whose ``spread`` (the coefficient of variation of the output lengths it leaves
unexplained: the survival ECDF's training outputs) is at most this is *sharp*: after a settled
backlog the safeguard stands aside on its backlog window (``BRHPolicy.backlog_settle_s``). The
training data bracket it: azure-2024-long's outputs spread 0.31 (the unguarded window helps),
servegen-r1's 1.44 (unguarded it reaches 1.30× br0); 0.5 is the cautious end (``papers/quality.md``,
"A settled backlog")."""


@dataclass(slots=True, kw_only=True)
class BRHPolicy:
    """Two-stage tick (shared with BR-0) on projected loads, scoring a candidate set Q on
    replica g by the exact change of the discounted projected imbalance (``score="exact"``,
    ``papers/horizon_score.md``)

        ``F_g(Q) = α·dᵀδ − β·dᵀ(δ − m_g)_+``,  ``δ(h) = Σ_{i∈Q} (s_i + h)·[h < r̂_i]``,
        ``d = (1, γ, …, γ^H)``

    (``score="paper"``: the paper's ``α(1ᵀd)Δ − β((Δ·1 − m_g)_+)ᵀd``, candidates staying the
    window without growing), where ``m_g(h) = M̂(h) − L̂_g(h)`` are the margins of the loads
    projected h steps ahead
    (:mod:`~balanceroute.core.projection`). Each tick the predictor forecasts, for every running
    and pooled request, ``(p_fin, mu_rem)``; the contribution ``ĉ = (1 − p_fin)·H + p_fin·mu_rem``
    sets when it leaves the window, and the confidence gate (``p_fin < gate`` → it stays the
    whole window) keeps an unsure forecast from ever predicting a departure. A placed request
    joins the projection as ``(s + h)·[h < ĉ]``.

    ``predictor``: ``None`` forecasts nothing (everyone stays: pure growth lookahead); one with a
    false ``ready`` (the proxy's :class:`~balanceroute.core.predictors.survival.OnlineSurvival`
    before it has seen enough finished requests) has no backlog window.
    ``features``: maps request ids to features (:meth:`bind` sets it from a workload; ``None``
    passes only the prompt lengths the state carries). ``beta``: ``None`` means 3·G, BR-0's
    (:data:`DEFAULT_BETA_PER_REPLICA`).
    ``stage1``, ``growth_steps``, ``r_max`` (0: the fill tick), ``ttft_slo_s``,
    ``deadline_factor``, ``lpt_batches``
    (the small-burst check, on the current loads), ``tick_fn``: as for BR-0.
    ``fill_order``: the order in which the fill (``r_max = 0``) serves replicas — ``"level"``
    (default): the largest *fill level*, the constant Δ that maximises the paper's score of its
    margin profile m_g(h) (``papers/fill.md``); ``"margin"``: the largest current margin m_g(0).
    ``safeguard`` (ε): each tick also computes BR-0's plan (:class:`BR0Policy` with this policy's
    tick parameters and BR-0's own β) and keeps the lookahead's plan only when, on the same
    projection, it lowers the window cost ``J = Σ_h d_h·(w·G·M̂(h) − Σ_g L̂_g(h))`` below
    (1 − ε)·J(BR-0's plan) (:func:`~balanceroute.core.projection.projected_cost`); otherwise BR-0's
    plan is placed. ``safeguard_weight`` w: ``None`` (default) is β/G, this tick's own β — the
    cost whose marginal the tick's score is, so both plans are judged by the objective the tick
    maximises (``papers/quality.md``, "A lookahead that departs from BR-0 only by what it sees");
    1 judges by the discounted projected imbalance Σ_h d_h·I(h) alone, which prefers plans that
    overflow now for a margin the projection promises later. The lookahead departs from BR-0
    only where its own model says it gains clearly;
    ``safeguard=None`` turns the safeguard off (the lookahead alone).
    *Backlog window* (``backlog_horizon``, ``backlog_gamma``, ``backlog_beta_per_replica``,
    ``backlog_share``): a tick with a backlog (≥ ``BACKLOG_PER_REPLICA``·G pooled requests, the
    fill tick's batch rule) on decode-heavy traffic — the running requests' decode growth is at
    least ``backlog_share`` of their KV load, Σ a_i / Σ (s_i + a_i) — looks ``backlog_horizon``
    steps ahead with γ = ``backlog_gamma`` and β = ``backlog_beta_per_replica``·G (the safeguard
    judges on that window, unless ``backlog_safeguard`` says it stands aside there). Why: with a
    backlog the tick chooses *which* requests start, and on decode-heavy traffic the loads are
    shaped by growth and departures far beyond the short window; on prefill-heavy traffic
    (growth a small share of the load) a long window misjudges the many departures it sees
    (1.4–3.9× br0 in 7 of 8 training runs), so the short window stays there, and below
    saturation (no backlog) too, and without a predictor (no departure is forecast, so a long
    window sees growth alone: 0.99–1.10× its short one on three training slices;
    ``papers/quality.md``, "BR-H's backlog window"). A predictor trained for one horizon (it
    carries it as ``.horizon``: ``learned``) keeps its window. ``backlog_horizon=None`` turns
    it off.
    ``backlog_safeguard``: whether the safeguard also judges the backlog window's ticks —
    ``None`` (default): yes, unless the predictor is clairvoyant (it says so with a true
    ``clairvoyant`` attribute: the :class:`~balanceroute.core.predictors.oracle.Oracle`), or it
    is sharp (a ``spread`` ≤ :data:`SHARP_SPREAD`: the survival ECDF of a concentrated length
    distribution) and the backlog has lasted ``backlog_settle_s`` seconds of the tick clock
    (``None``: a sharp forecast is always judged). The
    safeguard guards the lookahead against its forecast's errors, and a clairvoyant forecast of
    the running requests' departures has none: on the 20,000-request training draws the long
    window unguarded takes the oracle from 0.55–0.70× br0 to 0.23–0.39× on azure-2024-long and
    from 0.77–1.07× to 0.64–1.03× on servegen-r1 (``papers/quality.md``, "The clairvoyant
    backlog window"). The survival forecast unguarded reaches 1.46× br0 on the 3,000-request
    draws, whose loaded phase is mostly the start of the backlog, and 1.30× on servegen-r1
    (outputs spread 1.44); once an azure-2024-long backlog (spread 0.31) has lasted 45 s (≈ 900
    steps, two thirds of a mean output's decode) it gains on every 20,000-request draw
    (0.64–0.75× br0) and stays ≤ 1.04× on the short ones (``sweep_defaults settle``,
    ``papers/quality.md``, "A settled backlog"). The tick records when the current backlog began
    (the policy's only state; a clock that runs backwards starts afresh). ``True`` / ``False``
    force it either way.
    ``guard``: an :class:`~balanceroute.core.guard.OnlineGuard` (``True``: its default
    constants) lets BR-0 decide every tick unless the lookahead has *proved*, on the realised
    imbalance of paired blocks of steps, that it does better; unproved it decides at most one
    block in ``probe_every`` and ``max_probes`` blocks in all (``papers/guard.md``). ``None``
    (default): no guard, the decisions as before.
    Defaults H = 80, γ = 0.86 come from a training-only multi-workload sweep (README,
    "Defaults"); β = 3·G is BR-0's, so with ``horizon=0, alpha=1`` and ``backlog_horizon=None``
    the decisions are exactly BR-0's, with the safeguard on or off.
    """

    predictor: Predictor | None = None
    features: FeatureSource | None = None
    horizon: int = 80
    gamma: float = 0.86
    alpha: float = 1.0
    beta: float | None = None
    s_greedy: int = 8
    r_max: int = 0
    deadline_s: float = DEFAULT_LEASE.deadline_s  # the KV lease (core/lease.py): 25 s
    gate: float = 0.5
    score: str = "exact"
    stage1: str = "fit"
    growth_steps: float | None = None
    ttft_slo_s: float | None = 4.0
    deadline_factor: float | None = DEADLINE_FACTOR
    lpt_batches: bool = True
    fill_order: str = "level"
    safeguard: float | None = DEFAULT_SAFEGUARD
    safeguard_weight: float | None = None
    backlog_horizon: int | None = 160
    backlog_gamma: float = 0.98
    backlog_beta_per_replica: float = 16.0
    backlog_share: float = 0.2
    backlog_safeguard: bool | None = None
    backlog_settle_s: float | None = 45.0
    guard: OnlineGuard | None = None
    name: str = "brh"
    tick_fn: Callable[..., Assignment] = field(default=two_stage_assign, repr=False)
    _base: BR0Policy = field(init=False, repr=False, compare=False)
    _since: float | None = field(default=None, init=False, repr=False, compare=False)
    _guard: GuardLedger | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if int(self.horizon) != self.horizon or self.horizon < 0:
            raise ValueError(f"{self.horizon=} must be an integer >= 0")
        discounts(0, self.gamma)  # validates gamma in (0, 1]
        if not self.alpha > 0:
            raise ValueError(f"{self.alpha=} must be > 0")
        if self.beta is not None and not self.beta > 0:
            raise ValueError(f"{self.beta=} must be > 0 (or None for 3·G)")
        check_tick_params(self)
        if self.score not in ("exact", "paper"):
            raise ValueError(f"{self.score=} must be 'exact' or 'paper'")
        if not 0.0 <= self.gate <= 1.0:
            raise ValueError(f"{self.gate=} must be in [0, 1]")
        if self.fill_order not in ("level", "margin"):
            raise ValueError(f"{self.fill_order=} must be 'level' or 'margin'")
        if self.safeguard is not None and not 0.0 <= self.safeguard < 1.0:
            raise ValueError(f"{self.safeguard=} must be in [0, 1) (or None: off)")
        w = self.safeguard_weight
        if w is not None and not (w >= 1.0 and np.isfinite(w)):
            raise ValueError(f"{self.safeguard_weight=} must be a finite number >= 1 (or None: β/G)")
        if self.backlog_horizon is not None:
            if int(self.backlog_horizon) != self.backlog_horizon or self.backlog_horizon < 0:
                raise ValueError(f"{self.backlog_horizon=} must be an integer >= 0 (or None: off)")
            discounts(0, self.backlog_gamma)
            beta = self.backlog_beta_per_replica
            if not (beta > 0 and np.isfinite(beta)):
                raise ValueError(f"{self.backlog_beta_per_replica=} must be a finite number > 0")
            if not 0.0 <= self.backlog_share <= 1.0:
                raise ValueError(f"{self.backlog_share=} must be in [0, 1]")
        if self.backlog_safeguard not in (None, True, False):
            raise ValueError(f"{self.backlog_safeguard=} must be True, False or None (auto)")
        settle = self.backlog_settle_s
        if settle is not None and not (settle >= 0 and np.isfinite(settle)):
            raise ValueError(f"{self.backlog_settle_s=} must be a finite number >= 0 (or None)")
        if self.guard is True:  # ``--policy-param guard=true``: the default constants
            self.guard = OnlineGuard()
        elif self.guard is False:
            self.guard = None
        if self.guard is not None and not isinstance(self.guard, OnlineGuard):
            raise ValueError(f"{self.guard=} must be an OnlineGuard, true or false (or None: off)")
        self._guard = None if self.guard is None else GuardLedger(self.guard)
        self._base = BR0Policy(s_greedy=self.s_greedy, r_max=self.r_max, deadline_s=self.deadline_s,
                               stage1=self.stage1, growth_steps=self.growth_steps,
                               ttft_slo_s=self.ttft_slo_s, deadline_factor=self.deadline_factor,
                               lpt_batches=self.lpt_batches, tick_fn=self.tick_fn)

    def beta_for(self, num_replicas: int) -> float:
        """β for a cluster of G replicas: ``beta``, or ``DEFAULT_BETA_PER_REPLICA·G``."""
        return DEFAULT_BETA_PER_REPLICA * num_replicas if self.beta is None else float(self.beta)

    def bind(self, workload: Workload) -> BRHPolicy:
        """A copy whose request ids are rows of ``workload`` (the simulator's ids)."""
        return replace(self, features=RequestFeatures.from_workload(workload))

    def in_backlog(self, state: ClusterState, pool: PoolView) -> bool:
        """Whether this tick looks through the backlog window: a decode-heavy backlog (class
        docstring) and a ready predictor that answers any H."""
        if (self.backlog_horizon is None or self.predictor is None
                or not getattr(self.predictor, "ready", True)  # OnlineSurvival still warming up
                or getattr(self.predictor, "horizon", None) is not None  # trained for one H
                or len(pool) < BACKLOG_PER_REPLICA * state.num_replicas):
            return False
        grown = float(state.active_age.sum())
        return grown > 0 and grown >= self.backlog_share * float(state.active_prompt.sum() + grown)

    def window(self, state: ClusterState, pool: PoolView,
               backlog: bool | None = None) -> tuple[int, float, float]:
        """(H, γ, β) of this tick: the backlog window on a decode-heavy backlog, else the
        policy's own (class docstring); ``backlog``: :meth:`in_backlog`, if already known."""
        if self.in_backlog(state, pool) if backlog is None else backlog:
            return (int(self.backlog_horizon), float(self.backlog_gamma),
                    float(self.backlog_beta_per_replica) * state.num_replicas)
        return int(self.horizon), float(self.gamma), self.beta_for(state.num_replicas)

    def track_backlog(self, state: ClusterState, pool: PoolView) -> bool:
        """:meth:`in_backlog`, recording the clock at which the current backlog began (reset off
        the backlog, and when the clock runs backwards: a new run)."""
        backlog = self.in_backlog(state, pool)
        if not backlog or self._since is None or state.now < self._since:
            self._since = state.now if backlog else None
        return backlog

    def guards_backlog(self, now: float | None = None) -> bool:
        """Whether the safeguard judges a backlog window's tick at clock ``now``
        (``backlog_safeguard``; a backlog counts as settled from ``backlog_settle_s`` after
        :meth:`track_backlog` saw it begin)."""
        if self.backlog_safeguard is not None:
            return bool(self.backlog_safeguard)
        if getattr(self.predictor, "clairvoyant", False):
            return False
        spread = getattr(self.predictor, "spread", None)
        settled = (self.backlog_settle_s is not None and now is not None
                   and self._since is not None and now - self._since >= self.backlog_settle_s)
        return not (settled and spread is not None and spread <= SHARP_SPREAD)

    def forecast(self, state: ClusterState, pool: PoolView,
                 horizon: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Departure steps (1..H+1) of the running requests and of the pooled ones (if placed
        now, at age 0), from one predictor call over both; H = ``horizon`` (default: the
        policy's)."""
        h = int(self.horizon if horizon is None else horizon)
        n_act, n_pool = state.active_age.shape[0], len(pool)
        if self.predictor is None or h == 0:
            return np.full(n_act, h + 1, np.int64), np.full(n_pool, h + 1, np.int64)
        ages = np.concatenate([state.active_age, np.zeros(n_pool, np.int64)])
        if self.features is not None and getattr(self.predictor, "uses_features", True):
            feats = self.features.take(np.concatenate([state.active_ids, pool.request_ids]))
        else:
            feats = RequestFeatures(prompt_len=np.concatenate([state.active_prompt, pool.prompt_len]))
        p_fin, mu_rem = self.predictor.predict(feats, ages, h)
        dep = departure_steps(p_fin, mu_rem, h, gate=self.gate)
        return dep[:n_act], dep[n_act:]

    def assign(self, state: ClusterState, pool: PoolView) -> Assignment:
        """One BR-H tick: forecast, project L̂ (G, H+1), run the two-stage tick on it; with the
        safeguard, place BR-0's plan unless this one projects clearly less imbalance. With the
        online ``guard`` (:mod:`~balanceroute.core.guard`) the guard's arm decides the tick —
        BR-0's tick or this one — and the guard records the loads the step runs on."""
        backlog = self.track_backlog(state, pool)
        if len(pool) == 0 or not state.free_slots.any():
            return Assignment()
        if self._guard is None:
            return self._lookahead(state, pool, backlog)
        if self._guard.arm(state.step) == BR0_ARM:
            out = self._base.assign(state, pool)
        else:
            out = self._lookahead(state, pool, backlog)
        g = state.num_replicas
        placed = np.bincount(out.replica, weights=pool.prompt_len[out.pool_index], minlength=g)
        self._guard.observe(state.step, state.loads + placed,
                            state.num_active + np.bincount(out.replica, minlength=g))
        return out

    @property
    def guard_record(self) -> GuardLedger | None:
        """The online guard's record of the current run (``None`` without a guard)."""
        return self._guard

    def _lookahead(self, state: ClusterState, pool: PoolView, backlog: bool) -> Assignment:
        """The lookahead's own tick (with its safeguard); ``backlog``: :meth:`track_backlog`."""
        h, gamma, beta = self.window(state, pool, backlog)
        dep_act, dep_pool = self.forecast(state, pool, h)
        proj = project_loads(
            state.loads, state.active_replica, state.active_prompt + state.active_age, dep_act, h
        )
        growth = placement_growth(pool.prompt_len, dep_pool, h)
        d = discounts(h, gamma)
        own = self.tick_fn(
            proj,
            state.free_slots,
            pool.prompt_len,
            pool.wait,
            d=d,
            alpha=self.alpha,
            beta=beta,
            s_greedy=self.s_greedy,
            r_max=self.r_max,
            deadline_s=self.deadline_s,
            growth=growth,
            score=self.score,
            stage1=self.stage1,
            growth_steps=stage1_growth_steps(
                self.growth_steps, int((state.free_slots + state.num_active).max())),
            ttft_slo_s=self.ttft_slo_s,
            deadline_factor=self.deadline_factor,
            fill_order=self.fill_order,
            lpt_batches=self.lpt_batches,
            **replica_extras(state, pool.prompt_len, proj=proj, growth=growth),
        )
        if self.safeguard is None or (backlog and not self.guards_backlog(state.now)):
            return own
        base = self._base.assign(state, pool)
        if np.array_equal(own.pool_index, base.pool_index) and np.array_equal(own.replica, base.replica):
            return own
        w = beta / state.num_replicas if self.safeguard_weight is None else self.safeguard_weight
        s = pool.prompt_len
        j_own = projected_cost(proj, growth, s, own.pool_index, own.replica, d, w)
        j_base = projected_cost(proj, growth, s, base.pool_index, base.replica, d, w)
        return own if j_own < (1.0 - self.safeguard) * j_base else base
