"""Exact integer scaling of fractional data for CP-SAT, which only takes integers."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["integer_scale"]


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
