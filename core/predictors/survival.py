"""EmpiricalSurvival: the ECDF of output lengths seen in training, conditioned on the age."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from .._jit import HAVE_NUMBA, njit
from ..workloads.base import Workload
from .base import RequestFeatures, check_horizon

__all__ = ["EmpiricalSurvival", "OnlineSurvival", "survival_estimates"]


def survival_estimates(
    keys: NDArray[np.int64],
    prefix: NDArray[np.float64],
    offset: NDArray[np.int64] | int,
    hi: NDArray[np.int64] | int,
    ages: NDArray[np.int64],
    horizon: int,
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64]]:
    """Conditional ECDF estimates, O(log n) per query: two ``searchsorted`` and prefix sums.

    ``keys`` are sorted ``offset_g + o`` (one block per group g of training outputs o, ``offset``
    per query naming its block; a single ECDF has offset 0), ``hi`` the end of the query's
    block and ``prefix = [0, cumsum(o)]`` in key order. Returns
    ``p_fin = #{a < o ≤ a+H} / #{o > a}``, ``mu_rem = mean(o | a < o ≤ a+H) − a`` (H where there
    is no such o, clipped to [1, H]) and the support ``#{o > a}`` (``p_fin = 0`` where it is 0).
    """
    a = np.asarray(ages, dtype=np.int64)
    starts = np.searchsorted(keys, offset + a, side="right")
    ends = np.searchsorted(keys, offset + a + horizon, side="right")
    return _from_counts(starts, ends, hi, prefix, a, horizon)


def _from_counts(
    starts: NDArray, ends: NDArray, hi: NDArray | int, prefix: NDArray, a: NDArray, horizon: int
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.int64]]:
    """The estimates of :func:`survival_estimates` from the key counts ``#{key ≤ a}`` and
    ``#{key ≤ a+H}``."""
    alive = hi - starts
    done = ends - starts
    p_fin = np.where(alive > 0, done / np.maximum(alive, 1), 0.0)
    mean_out = (prefix[ends] - prefix[starts]) / np.maximum(done, 1)
    mu_rem = np.where(done > 0, mean_out - a, float(horizon))
    return p_fin.astype(np.float64), np.clip(mu_rem, 1.0, float(horizon)), alive


@njit
def _table_kernel(count_le, prefix, n_out, ages, horizon):  # pragma: no cover - compiled
    """``predict``'s table look-ups and :func:`_from_counts` fused, request by request (the same
    operations: int counts divided as float64, ``mean − a`` then clipped to [1, H])."""
    top = count_le.shape[0] - 1
    p_fin = np.empty(ages.shape[0])
    mu_rem = np.empty(ages.shape[0])
    for i in range(ages.shape[0]):
        a = ages[i]
        start = count_le[min(max(a, 0), top)]
        end = count_le[min(max(a + horizon, 0), top)]
        alive = n_out - start
        done = end - start
        p_fin[i] = done / max(alive, 1) if alive > 0 else 0.0
        mean_out = (prefix[end] - prefix[start]) / max(done, 1)
        mu = mean_out - a if done > 0 else float(horizon)
        mu_rem[i] = min(max(mu, 1.0), float(horizon))
    return p_fin, mu_rem


@dataclass(frozen=True, slots=True, eq=False)
class EmpiricalSurvival:
    """``p_fin = P(o ≤ a+H | o > a)`` and ``mu_rem = E[o − a | a < o ≤ a+H]`` from the ECDF of
    the training outputs; features other than the age are ignored.

    Beyond the longest output seen (no training output exceeds a) nothing is known:
    ``p_fin = 0``, i.e. the request is expected to stay the whole window.
    """

    sorted_out: NDArray[np.int64]
    prefix: NDArray[np.float64]
    count_le: NDArray[np.int64]
    spread: float = float("nan")
    """The coefficient of variation of the training outputs (``std / mean``; ``inf`` if they are
    all 0): how much of a request's length the age alone leaves unexplained — BR-H's sharpness
    test (:data:`~balanceroute.core.policies.brh.SHARP_SPREAD`; NaN: unknown, never sharp)."""
    name: str = "survival"
    uses_features: ClassVar[bool] = False  # the age alone: callers may skip gathering features

    @classmethod
    def fit(cls, train: Workload, *, horizon: int = 80, seed: int = 0) -> EmpiricalSurvival:
        """Fit on the output lengths of ``train`` (``horizon`` and ``seed`` are unused: the
        ECDF answers any H)."""
        del horizon, seed
        return cls.from_lengths(train.output_len)

    @classmethod
    def from_lengths(cls, output_len: NDArray) -> EmpiricalSurvival:
        """The ECDF of ``output_len`` (at least one length)."""
        out = np.sort(np.asarray(output_len, dtype=np.int64))
        if out.shape[0] == 0:
            raise ValueError("EmpiricalSurvival needs at least one training output length")
        if out[0] < 0:
            raise ValueError("output lengths must be >= 0")
        prefix = np.concatenate([[0.0], np.cumsum(out, dtype=np.float64)])
        # count_le[v] = #{o <= v} for v = 0..max(o): turns each searchsorted into one lookup
        count_le = np.cumsum(np.bincount(out, minlength=int(out[-1]) + 1)).astype(np.int64)
        mean = float(out.mean())
        spread = float(out.std()) / mean if mean > 0 else float("inf")
        return cls(sorted_out=out, prefix=prefix, count_le=count_le, spread=spread)

    def predict(
        self, features: RequestFeatures, ages: NDArray, horizon: int
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Vectorised conditional ECDF look-ups: O(1) per request through the ``count_le``
        table (the same counts ``survival_estimates`` gets from ``searchsorted``)."""
        horizon = check_horizon(horizon)
        a = np.asarray(ages, dtype=np.int64)
        if HAVE_NUMBA and a.ndim == 1:
            return _table_kernel(self.count_le, self.prefix, self.sorted_out.shape[0],
                                 np.ascontiguousarray(a), horizon)
        top = self.count_le.shape[0] - 1
        starts = self.count_le[np.clip(a, 0, top)]
        ends = self.count_le[np.clip(a + horizon, 0, top)]
        p_fin, mu_rem, _ = _from_counts(
            starts, ends, self.sorted_out.shape[0], self.prefix, a, horizon
        )
        return p_fin, mu_rem


class OnlineSurvival:
    """:class:`EmpiricalSurvival` of the output lengths observed so far — what the proxy learns
    from its own finished requests (:meth:`observe`), so that BR-H serves with a survival
    forecast and no training trace.

    It keeps the last ``window`` lengths and refits after every ``refit_every`` new ones. Until
    it holds ``min_samples`` it is not :attr:`ready`: it forecasts no departure (``p_fin = 0``)
    and reports no :attr:`spread`, and BR-H then ticks as it does without a predictor (no
    backlog window, never sharp).
    """

    __slots__ = ("_count", "_fit", "_lengths", "_pending", "min_samples", "refit_every", "window")
    name = "survival-online"
    uses_features: ClassVar[bool] = False

    def __init__(self, *, window: int = 10_000, min_samples: int = 200,
                 refit_every: int = 100) -> None:
        for key, value in (("window", window), ("min_samples", min_samples),
                           ("refit_every", refit_every)):
            if int(value) != value or value < 1:
                raise ValueError(f"{key}={value!r} must be an integer >= 1")
        if min_samples > window:
            raise ValueError(f"{min_samples=} must be <= {window=}")
        self.window, self.min_samples, self.refit_every = int(window), int(min_samples), int(refit_every)
        self._lengths = np.zeros(self.window, dtype=np.int64)  # a ring: the last `window` lengths
        self._count = 0
        self._pending = 0
        self._fit: EmpiricalSurvival | None = None

    @property
    def samples(self) -> int:
        """How many lengths the forecast rests on (at most ``window``)."""
        return min(self._count, self.window)

    @property
    def fitted(self) -> EmpiricalSurvival | None:
        """The curve it forecasts with now (``None`` until ready)."""
        return self._fit

    @property
    def ready(self) -> bool:
        """Whether it has seen ``min_samples`` lengths (and forecasts from them)."""
        return self._fit is not None

    @property
    def spread(self) -> float:
        """The current fit's :attr:`EmpiricalSurvival.spread`; NaN (never sharp) until ready."""
        return self._fit.spread if self._fit is not None else float("nan")

    def observe(self, output_len: int) -> None:
        """One finished request's output length (tokens ≥ 0)."""
        if int(output_len) != output_len or output_len < 0:
            raise ValueError(f"{output_len=} must be an integer >= 0")
        self._lengths[self._count % self.window] = int(output_len)
        self._count += 1
        self._pending += 1
        if self._count >= self.min_samples and (self._fit is None or self._pending >= self.refit_every):
            self._fit = EmpiricalSurvival.from_lengths(self._lengths[:self.samples])
            self._pending = 0

    def predict(
        self, features: RequestFeatures, ages: NDArray, horizon: int
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """The current fit's forecast; before it is ready, no departure within the window."""
        if self._fit is not None:
            return self._fit.predict(features, ages, horizon)
        n = np.asarray(ages).shape[0]
        return np.zeros(n), np.full(n, float(check_horizon(horizon)))
