"""Exact integer scaling of fractional data for CP-SAT, which only takes integers."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["inexact_scaling_message", "integer_scale", "step_time_weights"]


def integer_scale(values: ArrayLike, *, max_scale: int = 1_000_000) -> tuple[int, bool]:
    """The smallest integer K ≤ ``max_scale`` with K·v integral for every v, and ``True``;
    or ``(max_scale, False)`` when none exists (then K·v is rounded: a stated approximation).

    Values are read as the short decimals or fractions they were written as (``0.9`` → 9/10),
    so γ = 0.9 discounts scale exactly by a power of 10.
    """
    scale = 1
    for v in np.asarray(values, dtype=np.float64).ravel():
        if v == int(v):
            continue
        frac = Fraction(float(v)).limit_denominator(max_scale)
        if not math.isclose(float(frac), float(v), rel_tol=1e-12, abs_tol=1e-12):
            return max_scale, False
        scale = scale * frac.denominator // math.gcd(scale, frac.denominator)
        if scale > max_scale:
            return max_scale, False
    return scale, True


def inexact_scaling_message(*scales: int) -> str:
    """What a CP-SAT solution means when :func:`integer_scale` could not scale exactly."""
    return (f"inexact integer scaling (scales {', '.join(map(str, scales))}): the data were "
            "rounded, so the schedule is optimal only for the rounded model and no bound is "
            "proven for the exact one")


def step_time_weights(busy: float, envelope: float) -> tuple[int, int, float, bool]:
    """Integer weights for min busy·Σy_k + envelope·ΣM(k) (the ``step_time`` objective, busy =
    b·q, envelope = a): ``(w_busy, w_env, unit, exact)`` with the true objective = unit × the
    integer one; scaled by the weights' ratio, so exact when it is a short decimal."""
    weights = np.array([busy, envelope], dtype=np.float64)
    positive = weights[weights > 0]
    if not positive.size:
        return 0, 0, 1.0, True
    scale, exact = integer_scale(weights / positive.min())
    w_busy, w_env = np.rint(weights / positive.min() * scale).astype(np.int64)
    return int(w_busy), int(w_env), float(positive.min()) / scale, exact
