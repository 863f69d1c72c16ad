"""Closed-form predictions the reproduction overlays on its measurements (``papers/theory.md``).

- Extreme values of independent loads: if the G replica loads are i.i.d. N(μ, σ²) then
  I = G·(max_g L_g − L̄) and E[I] = G·σ·e_G, with e_G = E[max of G standard normals]
  (exact by quadrature; ≈ √(2 ln G) to first order, Gumbel-corrected otherwise).
- Balls into bins (m balls, n bins): one random choice gives a maximum load of
  (1 + o(1))·ln n / ln ln n for m = n; d ≥ 2 choices give ln ln n / ln d + O(1)
  (Azar, Broder, Karlin, Upfal 1994/1999). Heavily loaded (m ≫ n): m/n + √(2(m/n) ln n)
  for one choice (Raab & Steger 1998), m/n + ln ln n / ln d + O(1) for d ≥ 2
  (Berenbrink, Czumaj, Steger, Vöcking 2000/2006).
- Temporary tasks of unknown duration on G identical machines: no deterministic online
  algorithm beats 2 − 1/G on the peak load (Azar & Epstein 1997); greedy achieves it.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "EULER_GAMMA",
    "balls_into_bins_max_load",
    "expected_max_normal",
    "expected_max_normal_asymptotic",
    "expected_max_normal_gumbel",
    "independent_imbalance",
    "one_choice_gap_heavy",
    "one_choice_max_load",
    "online_temporary_tasks_bound",
    "step_time_gain",
    "two_choice_max_load",
]

EULER_GAMMA = 0.5772156649015329
"""The Euler–Mascheroni constant γ (mean of the standard Gumbel distribution)."""

_X = np.linspace(-12.0, 12.0, 48_001)
_LOG_CDF = np.log(np.maximum(0.5 * np.array([math.erfc(-x / math.sqrt(2.0)) for x in _X]), 1e-300))


@lru_cache(maxsize=1024)
def expected_max_normal(n: int) -> float:
    """e_n = E[max of n i.i.d. N(0, 1)] = ∫ x · n φ(x) Φ(x)ⁿ⁻¹ dx (trapezoid quadrature on
    [−12, 12], error < 1e-8). e_1 = 0, e_2 = 1/√π, e_3 = 3/(2√π)."""
    if n < 1:
        raise ValueError(f"{n=} must be >= 1")
    density = n * np.exp(-0.5 * _X**2 + (n - 1) * _LOG_CDF) / math.sqrt(2.0 * math.pi)
    y = _X * density
    return float(np.sum(0.5 * (y[1:] + y[:-1]) * np.diff(_X)))


def expected_max_normal_asymptotic(n: int | NDArray) -> NDArray | float:
    """First-order extreme-value scaling √(2 ln n) of E[max of n standard normals]."""
    return np.sqrt(2.0 * np.log(n))


def expected_max_normal_gumbel(n: int | NDArray) -> NDArray | float:
    """Gumbel approximation b_n + γ/a_n with a_n = √(2 ln n),
    b_n = a_n − (ln ln n + ln 4π)/(2 a_n) (Gumbel 1958; Leadbetter, Lindgren, Rootzén 1983,
    Thm 1.5.3): max ≈ b_n + Gumbel/a_n, whose mean adds γ/a_n. Valid for n ≥ 3."""
    a = np.sqrt(2.0 * np.log(n))
    b = a - (np.log(np.log(n)) + np.log(4.0 * np.pi)) / (2.0 * a)
    return b + EULER_GAMMA / a


def independent_imbalance(num_replicas: int, sigma: float) -> float:
    """E[I] = E[G·max_g L_g − Σ_g L_g] = G·σ·e_G for i.i.d. N(μ, σ²) replica loads
    (the sample mean is unbiased, so E[max − L̄] = σ·e_G)."""
    return num_replicas * sigma * expected_max_normal(num_replicas)


def one_choice_max_load(n: int | NDArray) -> NDArray | float:
    """ln n / ln ln n: the leading term of the maximum load when n balls go to n bins uniformly
    at random (Gonnet 1981; Raab & Steger 1998). Defined for n ≥ 3."""
    return np.log(n) / np.log(np.log(n))


def two_choice_max_load(n: int | NDArray, d: int = 2) -> NDArray | float:
    """ln ln n / ln d: the leading term of the maximum load with d ≥ 2 choices (ABKU 1999,
    Thm 1.1); the true value is this + Θ(1). Defined for n ≥ 3."""
    if d < 2:
        raise ValueError(f"{d=} must be >= 2")
    return np.log(np.log(n)) / np.log(d)


def one_choice_gap_heavy(m: int | NDArray, n: int | NDArray) -> NDArray | float:
    """√(2 (m/n) ln n): max load − m/n for m ≥ n ln n balls, one random choice (Raab & Steger
    1998, leading term); with d ≥ 2 choices the gap stays ln ln n / ln d + O(1) for every m."""
    return np.sqrt(2.0 * (np.asarray(m) / np.asarray(n)) * np.log(n))


def balls_into_bins_max_load(
    balls: int, bins: int, choices: int, rng: np.random.Generator
) -> int:
    """Monte Carlo: throw ``balls`` balls one by one; each samples ``choices`` bins uniformly
    with replacement and joins the least loaded of them (ties: the first sampled). Returns the
    maximum bin load."""
    if balls < 0 or bins < 1 or choices < 1:
        raise ValueError(f"{balls=} must be >= 0, {bins=} and {choices=} >= 1")
    picks = rng.integers(0, bins, size=(balls, choices))
    if choices == 1:
        return int(np.bincount(picks[:, 0], minlength=bins).max()) if balls else 0
    load = np.zeros(bins, dtype=np.int64)
    for row in picks:
        g = row[int(np.argmin(load[row]))]
        load[g] += 1
    return int(load.max())


def online_temporary_tasks_bound(num_replicas: int | NDArray) -> NDArray | float:
    """2 − 1/G: the competitive ratio of greedy (Graham's 1966 argument, which only uses the
    tasks active when the peak is reached, so it holds for temporary tasks too) and the matching
    lower bound for every deterministic online algorithm on temporary tasks of unknown duration
    on G identical machines (Azar & Epstein 1997). The measure is the peak load
    max_t max_g L_g(t) against the offline optimum's."""
    return 2.0 - 1.0 / np.asarray(num_replicas, dtype=np.float64)


def step_time_gain(
    envelope_base: float, envelope_new: float, *, a: float, b: float,
    tokens_ratio: float = 1.0,
) -> float:
    """Throughput gain of a policy with mean envelope M̄_new over one with M̄_base when every
    step lasts τ = b + a·M and both generate tokens per step in ratio ``tokens_ratio``:
    tokens_ratio·(b + a·M̄_base)/(b + a·M̄_new) − 1. It depends on (a, b) only through
    a/b: the gain vanishes as a/b → 0 and tends to tokens_ratio·M̄_base/M̄_new − 1 as b → 0."""
    return tokens_ratio * (b + a * envelope_base) / (b + a * envelope_new) - 1.0
