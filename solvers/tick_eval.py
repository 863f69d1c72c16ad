"""Exact evaluation of per-tick assignments, and replaying online policies on a tick instance.

An assignment is ``replica`` (P,): the replica each pooled request joins, −1 for "stays pooled".
Both objectives are computed here in numpy; every tick solver reports these values.

- ``f_score``: Σ_g F_g(Δ_g) with F_g(Δ) = α(1ᵀd)Δ − β((Δ·1 − m_g)_+)ᵀd and start-of-tick margins
  (the paper's tick objective). For BR-0 it equals ΣΔ − G·Σ_g (Δ_g − m_g)_+, a lower bound on
  the true decrease of imbalance I(L) − I(L + Δ) = ΣΔ − G·max_g (Δ_g − m_g)_+ (a sum of
  overflows instead of their maximum).
- ``imbalance``: the post-tick I(L + Δ) = G·max_g(L_g + Δ_g) − Σ_g(L_g + Δ_g). The two-stage
  heuristic updates margins after each placement, so for BR-0 the F values it greedily collects
  add up to exactly I(L) − I(L + Δ): it is a greedy for this objective.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ..core.model import horizon_f_score
from ..core.state import ClusterState, PoolView
from .instances import TickInstance

__all__ = [
    "check_tick_assignment",
    "f_score_sum",
    "policy_tick",
    "post_tick_imbalance",
    "tick_deltas",
    "tick_objective",
]


def check_tick_assignment(instance: TickInstance, replica: NDArray) -> NDArray[np.int64]:
    """Return ``replica`` as int64 after checking it: one entry per pooled request, values in
    −1..G−1, at most ``free_slots[g]`` requests per replica and an allowed count."""
    rep = np.asarray(replica, dtype=np.int64)
    g = instance.num_replicas
    if rep.shape != (instance.pool_size,):
        raise ValueError(f"assignment has shape {rep.shape}, expected ({instance.pool_size},)")
    if rep.size and (rep.min() < -1 or rep.max() >= g):
        raise ValueError(f"assignment names a replica outside -1..{g - 1}")
    per = np.bincount(rep[rep >= 0], minlength=g)
    if np.any(per > instance.free_slots):
        raise ValueError("assignment exceeds a replica's free slots")
    lo, hi = instance.required
    placed = int((rep >= 0).sum())
    if not lo <= placed <= hi:
        raise ValueError(f"assignment places {placed} requests, must place {lo}..{hi}")
    return rep


def tick_deltas(instance: TickInstance, replica: NDArray) -> NDArray:
    """Δ_g = Σ_{i → g} s_i, shape (G,)."""
    rep = np.asarray(replica, dtype=np.int64)
    on = rep >= 0
    return np.bincount(rep[on], weights=instance.prompt_len[on].astype(np.float64),
                       minlength=instance.num_replicas)


def f_score_sum(instance: TickInstance, replica: NDArray) -> float:
    """Σ_g F_g(Δ_g) on start-of-tick margins (F_g(0) = 0)."""
    delta = tick_deltas(instance, replica)
    m = instance.margins
    total = 0.0
    for g in range(instance.num_replicas):
        if delta[g] > 0:
            total += float(horizon_f_score(delta[g], m[g], instance.d, instance.alpha,
                                           float(instance.beta)))
    return total


def post_tick_imbalance(instance: TickInstance, replica: NDArray) -> float:
    """I(L + Δ) = G·max_g(L_g + Δ_g) − Σ_g(L_g + Δ_g) on the h = 0 loads."""
    after = instance.loads + tick_deltas(instance, replica)
    return float(instance.num_replicas * after.max() - after.sum())


def tick_objective(instance: TickInstance, replica: NDArray, objective: str | None = None) -> float:
    """The instance's objective (or ``objective``) of an assignment."""
    which = instance.objective if objective is None else objective
    if which == "f_score":
        return f_score_sum(instance, replica)
    if which == "imbalance":
        return post_tick_imbalance(instance, replica)
    raise ValueError(f"objective={which!r} must be 'f_score' or 'imbalance'")


def policy_tick(instance: TickInstance, policy: object | str = "br0", **params) -> NDArray[np.int64]:
    """The assignment an online policy makes on this tick, as ``replica`` (P,).

    ``"br0"`` replays :func:`two_stage_assign` with the instance's own (d, α, β) and projected
    loads (so BR-H-shaped instances replay the BR-H tick); ``params`` are ``s_greedy``, ``r_max``,
    ``deadline_s``. Any other name (or a policy object) is called through the ``Policy`` contract
    on a :class:`ClusterState` with the h = 0 loads.
    """
    if policy == "br0":
        from ..core.two_stage import two_stage_assign  # numba: only when a tick is replayed

        out = two_stage_assign(
            instance.proj_loads, instance.free_slots, instance.prompt_len, instance.wait,
            d=instance.d, alpha=instance.alpha, beta=float(instance.beta),
            s_greedy=int(params.get("s_greedy", 8)), r_max=int(params.get("r_max", 4)),
            deadline_s=float(params.get("deadline_s", 30.0)),
        )
    else:
        if isinstance(policy, str):
            from ..core.policies import get_policy

            policy = get_policy(policy, **params)
        state = ClusterState(
            loads=np.rint(instance.loads).astype(np.int64), free_slots=instance.free_slots.copy(),
            num_active=instance.num_active.copy(),
        )
        pool = PoolView(prompt_len=instance.prompt_len.copy(), wait=instance.wait.copy(),
                        request_ids=np.arange(instance.pool_size, dtype=np.int64))
        out = policy.assign(state, pool)  # type: ignore[attr-defined]
    replica = np.full(instance.pool_size, -1, dtype=np.int64)
    replica[out.pool_index] = out.replica
    return replica
