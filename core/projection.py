"""BR-H's load projection over the window h = 0..H (DESIGN §1, Horizon), vectorised.

A request is *present* at step k + h while h < its departure step ``dep`` (``1 ≤ dep ≤ H + 1``;
``H + 1`` = it stays the whole window). While present it holds s + a + h KV tokens (it grows one
token per step), after it holds none. From the forecast ``(p_fin, mu_rem)``:

* predicted contribution ``ĉ = (1 − p_fin)·H + p_fin·mu_rem``;
* confidence gate: ``p_fin < gate`` (½) → the request stays the whole window (``dep = H + 1``);
  otherwise ``dep = ⌈ĉ⌉`` (present iff h < ĉ), at least 1: it is running now.

Projected loads ``L̂_g(h) = L_g + Σ_{i on g} ((s_i + a_i + h)·[h < dep_i] − (s_i + a_i))``: the
current loads, each listed request replaced by its projected trajectory (load a caller does not
list stays constant). Built with departure histograms (``np.bincount``) and cumulative sums, in
O(n + G·H): no (n, H+1) matrix and no Python loop over requests.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["departure_steps", "placement_growth", "project_loads"]


def departure_steps(
    p_fin: NDArray, mu_rem: NDArray, horizon: int, *, gate: float = 0.5
) -> NDArray[np.int64]:
    """``dep = H + 1`` where ``p_fin < gate``, else ``clip(⌈(1 − p)·H + p·mu⌉, 1, H + 1)``."""
    p = np.asarray(p_fin, dtype=np.float64)
    c_hat = (1.0 - p) * horizon + p * np.asarray(mu_rem, dtype=np.float64)
    passed = p >= gate  # NaN forecasts fail the gate
    c_hat = np.where(passed & np.isfinite(c_hat), c_hat, horizon + 1.0)
    return np.clip(np.ceil(c_hat), 1, horizon + 1).astype(np.int64)


def project_loads(
    loads: NDArray,
    replica: NDArray,
    base: NDArray,
    dep: NDArray,
    horizon: int,
) -> NDArray[np.float64]:
    """``L̂`` of shape (G, H+1) from current ``loads`` (G,) and the listed requests' ``replica``,
    ``base = s + a`` and departure steps ``dep`` (module docstring)."""
    g_count = loads.shape[0]
    width = horizon + 2  # departure bins 1..H+1 (H+1: never within the window)
    flat = np.asarray(replica, dtype=np.int64) * width + np.asarray(dep, dtype=np.int64)
    b = np.asarray(base, dtype=np.float64)
    gone_n = np.bincount(flat, minlength=g_count * width).reshape(g_count, width)
    gone_b = np.bincount(flat, weights=b, minlength=g_count * width).reshape(g_count, width)
    # requests (and their base) that have departed by step h: cumulative over dep ≤ h
    left_n = np.cumsum(gone_n, axis=1)[:, : horizon + 1]
    left_b = np.cumsum(gone_b, axis=1)[:, : horizon + 1]
    n_listed = gone_n.sum(axis=1)
    h = np.arange(horizon + 1, dtype=np.float64)
    # Σ present (s + a + h) − Σ all (s + a) = −(base of departed) + h·(number present)
    return (
        np.asarray(loads, dtype=np.float64)[:, None]
        - left_b
        + h[None, :] * (n_listed[:, None] - left_n)
    )


def placement_growth(prompt_len: NDArray, dep: NDArray, horizon: int) -> NDArray[np.float64]:
    """``growth`` (P, H+1) for :func:`~balanceroute.core.two_stage.two_stage_assign`: a request
    placed now (age 0) adds ``s + growth[h] = (s + h)·[h < dep]`` to its replica's L̂(h) — the
    same projection as a running request, so the next tick sees it consistently."""
    h = np.arange(horizon + 1, dtype=np.float64)
    s = np.asarray(prompt_len, dtype=np.float64)[:, None]
    present = h[None, :] < np.asarray(dep)[:, None]
    return np.where(present, h[None, :], -s)
