"""Noise: uniformly random forecasts, the robustness test of the confidence gate."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ..workloads.base import Workload
from .base import RequestFeatures, check_horizon

__all__ = ["NoisePredictor"]


@dataclass(slots=True, eq=False)
class NoisePredictor:
    """``p_fin ~ U(0, 1)`` and ``mu_rem ~ U(1, H)``, independent of everything (seeded). Half of
    its forecasts pass the gate ``p_fin ≥ 0.5`` and are pure noise; BR-H must stay close to BR-0
    with it."""

    seed: int = 0
    name: str = "noise"
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    @classmethod
    def fit(cls, train: Workload, *, horizon: int = 80, seed: int = 0) -> NoisePredictor:
        """Nothing to learn; ``seed`` seeds the noise."""
        del train, horizon
        return cls(seed=seed)

    def predict(
        self, features: RequestFeatures, ages: NDArray, horizon: int
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Fresh uniform draws for every row."""
        horizon = check_horizon(horizon)
        n = np.asarray(ages).shape[0]
        p_fin = np.asarray(self.rng.uniform(0.0, 1.0, n), dtype=np.float64)
        return p_fin, np.asarray(self.rng.uniform(1.0, float(horizon), n), dtype=np.float64)
