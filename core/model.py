"""The barrier model (``papers/theory.md``) as pure numpy functions.

Every function accepts a 1-D array of per-replica values ``(G,)`` or a batch ``(..., G)`` and
reduces over the last axis. Loads are KV tokens: ``L_g = Σ_{i on g} (s_i + a_i)``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "discounts",
    "envelope",
    "exact_horizon_score",
    "f_score",
    "horizon_f_score",
    "imbalance",
    "margins",
]


def envelope(loads: ArrayLike) -> NDArray:
    """``M = max_g L_g``: the load of the slowest replica, which sets the step time."""
    return np.max(np.asarray(loads), axis=-1)


def imbalance(loads: ArrayLike) -> NDArray:
    """``I = G·M − Σ_g L_g ≥ 0``: token-steps the G replicas spend waiting at the barrier."""
    arr = np.asarray(loads)
    return arr.shape[-1] * np.max(arr, axis=-1) - np.sum(arr, axis=-1)


def margins(loads: ArrayLike) -> NDArray:
    """``m_g = M − L_g ≥ 0``: how much replica g can absorb before it becomes the envelope."""
    arr = np.asarray(loads)
    return np.max(arr, axis=-1, keepdims=True) - arr


def f_score(delta: ArrayLike, margin: ArrayLike, num_replicas: int) -> NDArray:
    """BR-0 score ``F = Δ − G·(Δ − m)_+``: minus the change of I when Δ tokens join a replica
    with margin m. Slope 1 inside the margin, −(G − 1) beyond it. Broadcasts Δ against m."""
    d = np.asarray(delta, dtype=np.float64)
    return d - num_replicas * np.maximum(d - np.asarray(margin, dtype=np.float64), 0.0)


def discounts(horizon: int, gamma: float) -> NDArray:
    """``d = (1, γ, …, γ^H)``: the weights of the horizon score."""
    if horizon < 0:
        raise ValueError(f"{horizon=} must be >= 0")
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"{gamma=} must be in (0, 1]")
    return gamma ** np.arange(horizon + 1, dtype=np.float64)


def horizon_f_score(
    delta: ArrayLike, margin_vec: ArrayLike, d: ArrayLike, alpha: float, beta: float
) -> NDArray:
    """BR-H score ``F = α(1ᵀd)Δ − β((Δ·1 − m)_+)ᵀd``.

    ``delta`` has shape ``S`` (any), ``margin_vec`` has shape ``(H+1,)`` (one replica's projected
    margins ``m(h) = M̂(h) − L̂(h)``) and ``d`` shape ``(H+1,)``. With H = 0, α = 1, β = G this is
    :func:`f_score` exactly.
    """
    dd = np.asarray(d, dtype=np.float64)
    dl = np.asarray(delta, dtype=np.float64)
    over = np.maximum(dl[..., None] - np.asarray(margin_vec, dtype=np.float64), 0.0)
    return alpha * dd.sum() * dl - beta * (over @ dd)


def exact_horizon_score(
    traj: ArrayLike, margin_vec: ArrayLike, d: ArrayLike, alpha: float, beta: float
) -> NDArray:
    """The shipped BR-H score ``F = α·dᵀδ − β·dᵀ(δ − m)_+`` of a contribution trajectory
    ``δ(h) = Σ_{i∈Q} c_i(h)`` (``traj``: shape ``(..., H+1)``), with ``c_i(h) = s_i + h`` while h
    is inside request i's projected stay and 0 after. With α = 1, β = G it is minus the change of
    the discounted projected imbalance ``Σ_h d_h·I(h)`` when Q joins the replica whose margins
    are ``margin_vec`` (``papers/horizon_score.md``); with H = 0 it is :func:`f_score`."""
    dd = np.asarray(d, dtype=np.float64)
    tr = np.asarray(traj, dtype=np.float64)
    over = np.maximum(tr - np.asarray(margin_vec, dtype=np.float64), 0.0)
    return alpha * (tr @ dd) - beta * (over @ dd)
