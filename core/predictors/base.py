"""The predictor contract of BR-H and the data it is fitted and judged on.

A predictor answers, for requests that have generated ``a_i`` tokens so far, the two numbers of
the BR-H contract:

* ``p_fin[i] = P(r_i ≤ H | x_i, a_i)``, the probability that the request finishes within the
  next ``H`` steps, where ``r_i = o_i − a_i ≥ 1`` is the number of steps it still runs;
* ``mu_rem[i] = E[r_i | r_i ≤ H, x_i, a_i]`` in ``[1, H]``, its remaining steps if it does.

``x_i`` are the :class:`RequestFeatures` a router really has: prompt length, a prompt identity
(hash) where the trace carries one, a client id. The true output length rides along in the same
table only so the Oracle can exist; no other predictor reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from ..workloads.base import Workload

__all__ = [
    "FeatureSource",
    "Predictor",
    "RequestFeatures",
    "TrainingTuples",
    "check_horizon",
    "split_workload",
    "training_tuples",
]


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """Per-request columns a predictor may read, one row per request.

    ``prompt_len`` s_i; ``prefix_hash`` prompt identity (``None``: the source has none);
    ``client`` client id (or ``None``); ``output_len`` the true o_i, for the Oracle only
    (``None`` in serving, where it is unknown).
    """

    prompt_len: NDArray[np.int64]
    prefix_hash: NDArray[np.int64] | None = None
    client: NDArray[np.int64] | None = None
    output_len: NDArray[np.int64] | None = None

    @classmethod
    def from_workload(cls, workload: Workload) -> RequestFeatures:
        """The feature table of a workload; row j describes request id j."""
        return cls(
            prompt_len=workload.prompt_len,
            prefix_hash=workload.prefix_hash,
            client=workload.client,
            output_len=workload.output_len,
        )

    def take(self, ids: NDArray) -> RequestFeatures:
        """The rows ``ids`` (request ids are row positions of this table)."""

        def pick(a: NDArray | None) -> NDArray | None:
            return None if a is None else a[ids]

        return replace(
            self,
            prompt_len=self.prompt_len[ids],
            prefix_hash=pick(self.prefix_hash),
            client=pick(self.client),
            output_len=pick(self.output_len),
        )

    def __len__(self) -> int:
        return int(self.prompt_len.shape[0])


@runtime_checkable
class FeatureSource(Protocol):
    """Maps the request ids a policy sees (``ClusterState.active_ids``, ``PoolView.request_ids``)
    to their features. A :class:`RequestFeatures` table is one (ids = rows), bound from a
    workload in simulations. The proxy supplies none: an unbound policy builds the features from
    the prompt lengths the state and pool carry (``active_prompt``, ``prompt_len``)."""

    def take(self, ids: NDArray) -> RequestFeatures:
        """Features of the requests ``ids``, in that order."""
        ...


@runtime_checkable
class Predictor(Protocol):
    """``predict(features, ages, H) -> (p_fin, mu_rem)``, vectorised over requests.

    Invariant: ``0 ≤ p_fin ≤ 1`` and ``1 ≤ mu_rem ≤ H`` (finite) for every row, whatever the
    inputs; ``ages`` are the tokens generated so far (a request with age a is still running, so
    its output is known to exceed a). A predictor whose forecast depends on the age alone may
    declare ``uses_features = False`` (a class attribute; absent means True): callers then pass
    only the prompt lengths they hold instead of gathering its features.

    Optional attributes BR-H reads (:class:`~balanceroute.core.policies.brh.BRHPolicy`), absent
    meaning the cautious answer: ``clairvoyant`` (True: its forecasts are the truth — the
    Oracle), ``spread`` (the coefficient of variation of the output lengths it leaves
    unexplained; NaN or absent: unknown) and ``ready`` (False while it has nothing to forecast
    from — ``OnlineSurvival`` warming up; absent: ready).
    """

    @property
    def name(self) -> str:
        """The registry name (``survival``, ``oracle``, …)."""
        ...

    def predict(
        self, features: RequestFeatures, ages: NDArray, horizon: int
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``(p_fin, mu_rem)`` for each request."""
        ...


def check_horizon(horizon: int) -> int:
    """``horizon`` as an int, or ``ValueError`` unless it is >= 1 (a window must hold a step)."""
    if int(horizon) != horizon or horizon < 1:
        raise ValueError(f"{horizon=} must be an integer >= 1")
    return int(horizon)


def split_workload(workload: Workload, train_fraction: float) -> tuple[Workload, Workload]:
    """``(train, test)``: the first ``round(train_fraction·n)`` requests in trace order and the
    rest. Predictors are fitted on ``train`` and judged (and simulated) on ``test``; both parts
    are non-empty."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"{train_fraction=} must be in (0, 1)")
    n = len(workload)
    if n < 2:
        raise ValueError(f"cannot split a workload of {n} request(s) into train and test")
    cut = min(max(int(round(train_fraction * n)), 1), n - 1)
    train = workload.take(np.arange(cut))
    test = workload.take(np.arange(cut, n))
    return replace(train, name=f"{workload.name}[:{cut}]"), replace(test, name=f"{workload.name}[{cut}:]")


@dataclass(frozen=True, slots=True)
class TrainingTuples:
    """Snapshots ``(request, age)`` of historical trajectories with their outcomes.

    ``row`` indexes the workload, ``age`` a < o, ``remaining`` r = o − a ≥ 1 and
    ``finished`` = [r ≤ H].
    """

    row: NDArray[np.int64]
    age: NDArray[np.int64]
    remaining: NDArray[np.int64]
    finished: NDArray[np.bool_]

    def __len__(self) -> int:
        return int(self.row.shape[0])


def training_tuples(
    workload: Workload,
    horizon: int,
    *,
    stride: int | None = None,
    max_tuples: int | None = None,
    rng: np.random.Generator | None = None,
) -> TrainingTuples:
    """Every request observed at ages ``0, ΔT, 2ΔT, … < o_i`` with ``ΔT = stride`` (default
    ``max(H // 2, 1)``, the paper's sampling), labelled ``finished = [o_i − a ≤ H]``.

    With ``max_tuples``, a uniform subsample of that many (drawn from ``rng``) in row order.
    """
    horizon = check_horizon(horizon)
    step = max(horizon // 2, 1) if stride is None else int(stride)
    if step < 1:
        raise ValueError(f"{stride=} must be >= 1")
    out = workload.output_len.astype(np.int64)
    counts = (out - 1) // step + 1  # ages 0, step, … strictly below o
    row = np.repeat(np.arange(out.shape[0], dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    age = (np.arange(row.shape[0], dtype=np.int64) - np.repeat(first, counts)) * step
    if max_tuples is not None and row.shape[0] > max_tuples:
        gen = rng if rng is not None else np.random.default_rng(0)
        keep = np.sort(gen.choice(row.shape[0], size=max_tuples, replace=False))
        row, age = row[keep], age[keep]
    remaining = out[row] - age
    return TrainingTuples(row=row, age=age, remaining=remaining, finished=remaining <= horizon)
