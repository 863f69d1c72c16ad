"""BR-H's load projection over the window h = 0..H (``papers/horizon_score.md``), vectorised.

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

Each function runs as a compiled kernel (numba) when numba is present, with the numpy
expression it replaces kept as the fallback; both perform the same floating-point operations in
the same order (a weighted ``bincount`` accumulates in request order, ``cumsum`` left to right),
so their results are identical.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from ._jit import HAVE_NUMBA, njit

__all__ = ["departure_steps", "placement_growth", "project_loads", "projected_cost"]


def _departure_steps_numpy(
    p_fin: NDArray, mu_rem: NDArray, horizon: int, *, gate: float = 0.5
) -> NDArray[np.int64]:
    """``dep = H + 1`` where ``p_fin < gate``, else ``clip(⌈(1 − p)·H + p·mu⌉, 1, H + 1)``."""
    p = np.asarray(p_fin, dtype=np.float64)
    c_hat = (1.0 - p) * horizon + p * np.asarray(mu_rem, dtype=np.float64)
    passed = p >= gate  # NaN forecasts fail the gate
    c_hat = np.where(passed & np.isfinite(c_hat), c_hat, horizon + 1.0)
    return np.clip(np.ceil(c_hat), 1, horizon + 1).astype(np.int64)


def _project_loads_numpy(
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


def _placement_growth_numpy(prompt_len: NDArray, dep: NDArray, horizon: int) -> NDArray[np.float64]:
    """``growth`` (P, H+1) for :func:`~balanceroute.core.two_stage.two_stage_assign`: a request
    placed now (age 0) adds ``s + growth[h] = (s + h)·[h < dep]`` to its replica's L̂(h) — the
    same projection as a running request, so the next tick sees it consistently."""
    h = np.arange(horizon + 1, dtype=np.float64)
    s = np.asarray(prompt_len, dtype=np.float64)[:, None]
    present = h[None, :] < np.asarray(dep)[:, None]
    return np.where(present, h[None, :], -s)


# ----------------------------------------------------------------------- compiled kernels


def departure_steps(
    p_fin: NDArray, mu_rem: NDArray, horizon: int, *, gate: float = 0.5
) -> NDArray[np.int64]:
    """``dep = H + 1`` where ``p_fin < gate``, else ``clip(⌈(1 − p)·H + p·mu⌉, 1, H + 1)``."""
    if not HAVE_NUMBA:
        return _departure_steps_numpy(p_fin, mu_rem, horizon, gate=gate)
    p = np.ascontiguousarray(p_fin, dtype=np.float64)
    mu = np.ascontiguousarray(mu_rem, dtype=np.float64)
    if p.ndim != 1 or p.shape != mu.shape:
        return _departure_steps_numpy(p_fin, mu_rem, horizon, gate=gate)
    return _departure_kernel(p, mu, float(horizon), float(gate))


def project_loads(
    loads: NDArray,
    replica: NDArray,
    base: NDArray,
    dep: NDArray,
    horizon: int,
) -> NDArray[np.float64]:
    """``L̂`` of shape (G, H+1) from current ``loads`` (G,) and the listed requests' ``replica``,
    ``base = s + a`` and departure steps ``dep`` (module docstring)."""
    if not HAVE_NUMBA:
        return _project_loads_numpy(loads, replica, base, dep, horizon)
    rep = np.ascontiguousarray(replica, dtype=np.int64)
    dp = np.ascontiguousarray(dep, dtype=np.int64)
    b = np.ascontiguousarray(base, dtype=np.float64)
    cur = np.ascontiguousarray(loads, dtype=np.float64)
    if cur.ndim != 1 or rep.ndim != 1 or rep.shape != dp.shape or rep.shape != b.shape:
        return _project_loads_numpy(loads, replica, base, dep, horizon)
    out = _project_kernel(cur, rep, dp, b, int(horizon))
    if out is None:  # a replica or departure step out of range: numpy's own error
        return _project_loads_numpy(loads, replica, base, dep, horizon)
    return out


def placement_growth(prompt_len: NDArray, dep: NDArray, horizon: int) -> NDArray[np.float64]:
    """``growth`` (P, H+1) for :func:`~balanceroute.core.two_stage.two_stage_assign`: a request
    placed now (age 0) adds ``s + growth[h] = (s + h)·[h < dep]`` to its replica's L̂(h) — the
    same projection as a running request, so the next tick sees it consistently."""
    if not HAVE_NUMBA:
        return _placement_growth_numpy(prompt_len, dep, horizon)
    s = np.ascontiguousarray(prompt_len, dtype=np.float64)
    dp = np.ascontiguousarray(dep)
    if s.ndim != 1 or s.shape != dp.shape or dp.dtype.kind not in "iu":
        return _placement_growth_numpy(prompt_len, dep, horizon)
    return _growth_kernel(s, dp.astype(np.int64, copy=False), int(horizon))


def projected_cost(proj_loads: NDArray, growth: NDArray, prompt_len: NDArray, pool_index: NDArray,
                   replica: NDArray, d: NDArray, weight: float = 1.0) -> float:
    """``J = Σ_h d_h·(w·G·M(h) − Σ_g L_g(h))`` of the loads projected over the window after placing
    pooled request ``pool_index[j]`` on ``replica[j]`` — ``proj_loads`` (G, H+1) is L̂ before, and a
    placed request i adds its trajectory c_i(h) = ``prompt_len[i]`` + ``growth[i, h]``
    (:func:`placement_growth`) to its replica's row. ``weight`` w = 1 is the discounted imbalance
    Σ_h d_h·I(h); w = β/G is the cost whose marginal is BR-0's F with overflow weight β."""
    loads = np.array(proj_loads, dtype=np.float64)
    pi = np.asarray(pool_index, dtype=np.int64)
    placed = growth[pi] + np.asarray(prompt_len, dtype=np.float64)[pi, None]
    np.add.at(loads, np.asarray(replica, dtype=np.int64), placed)
    per_step = weight * loads.shape[0] * loads.max(axis=0) - loads.sum(axis=0)
    return float(per_step @ np.asarray(d, dtype=np.float64))


@njit
def _departure_kernel(p, mu, horizon, gate):  # pragma: no cover - compiled
    out = np.empty(p.shape[0], dtype=np.int64)
    top = horizon + 1.0
    for i in range(p.shape[0]):
        c_hat = (1.0 - p[i]) * horizon + p[i] * mu[i]
        if not (p[i] >= gate and np.isfinite(c_hat)):
            c_hat = top
        v = np.ceil(c_hat)
        if v < 1.0:
            v = 1.0
        elif v > top:
            v = top
        out[i] = np.int64(v)
    return out


@njit
def _project_kernel(loads, replica, dep, base, horizon):  # pragma: no cover - compiled
    g_count = loads.shape[0]
    width = horizon + 2
    size = g_count * width
    gone_n = np.zeros(size, dtype=np.int64)
    gone_b = np.zeros(size)
    for i in range(replica.shape[0]):  # bincount order: request by request
        f = replica[i] * width + dep[i]
        if f < 0 or f >= size:
            return None
        gone_n[f] += 1
        gone_b[f] += base[i]
    out = np.empty((g_count, horizon + 1))
    for g in range(g_count):
        row = g * width
        listed = 0
        for t in range(width):
            listed += gone_n[row + t]
        left_n = 0
        left_b = 0.0
        for h in range(horizon + 1):
            left_n += gone_n[row + h]
            left_b += gone_b[row + h]
            out[g, h] = (loads[g] - left_b) + float(h) * float(listed - left_n)
    return out


@njit
def _growth_kernel(s, dep, horizon):  # pragma: no cover - compiled
    out = np.empty((s.shape[0], horizon + 1))
    for i in range(s.shape[0]):
        neg = -s[i]
        for h in range(horizon + 1):
            out[i, h] = float(h) if float(h) < float(dep[i]) else neg
    return out
