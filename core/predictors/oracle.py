"""Oracle: the true output lengths (simulation only), the upper bound of any predictor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from ..workloads.base import Workload
from .base import RequestFeatures, check_horizon

__all__ = ["Oracle"]


@dataclass(frozen=True, slots=True)
class Oracle:
    """``p_fin = [o − a ≤ H]`` and ``mu_rem = o − a`` (clipped to [1, H]) from the true o_i in
    ``features.output_len``: a perfect forecast of the window."""

    name: str = "oracle"
    clairvoyant: ClassVar[bool] = True
    """Its forecasts are the truth: BR-H's backlog window then acts without the safeguard
    (:class:`~balanceroute.core.policies.brh.BRHPolicy`, ``backlog_safeguard``)."""

    @classmethod
    def fit(cls, train: Workload, *, horizon: int = 80, seed: int = 0) -> Oracle:
        """Nothing to learn; the signature matches the other predictors."""
        del train, horizon, seed
        return cls()

    def predict(
        self, features: RequestFeatures, ages: NDArray, horizon: int
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Exact indicators from the true lengths; ``ValueError`` if they are not provided."""
        horizon = check_horizon(horizon)
        if features.output_len is None:
            raise ValueError("the Oracle needs the true output lengths (simulation only)")
        remaining = features.output_len.astype(np.int64) - np.asarray(ages, dtype=np.int64)
        p_fin = (remaining <= horizon).astype(np.float64)
        return p_fin, np.clip(remaining, 1, horizon).astype(np.float64)
