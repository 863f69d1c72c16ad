"""Termination predictors for BR-H behind one interface: ``(features, ages, H) -> (p_fin, mu_rem)``.

``fit_predictor("survival", train, horizon=80)`` fits one on a training workload; the registry
``PREDICTORS`` maps each name to its class (each has ``fit(train, *, horizon, seed)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..workloads.base import Workload
from .base import (
    FeatureSource,
    Predictor,
    RequestFeatures,
    TrainingTuples,
    split_workload,
    training_tuples,
)
from .calibration import auc, brier_score, evaluate_predictor, expected_calibration_error
from .exact_match import ExactMatch
from .learned import LearnedTermination
from .noise import NoisePredictor
from .oracle import Oracle
from .survival import EmpiricalSurvival, OnlineSurvival

__all__ = [
    "PREDICTORS",
    "EmpiricalSurvival",
    "ExactMatch",
    "FeatureSource",
    "LearnedTermination",
    "NoisePredictor",
    "OnlineSurvival",
    "Oracle",
    "Predictor",
    "RequestFeatures",
    "TrainingTuples",
    "auc",
    "brier_score",
    "evaluate_predictor",
    "expected_calibration_error",
    "fit_predictor",
    "split_workload",
    "training_tuples",
]

PREDICTORS: dict[str, Callable[..., Predictor]] = {
    "oracle": Oracle.fit,
    "survival": EmpiricalSurvival.fit,
    "exact_match": ExactMatch.fit,
    "learned": LearnedTermination.fit,
    "noise": NoisePredictor.fit,
}
"""Predictor name → ``fit(train, *, horizon, seed, **params)``. ``learned`` needs torch."""


def fit_predictor(
    name: str, train: Workload, *, horizon: int, seed: int = 0, **params: Any
) -> Predictor:
    """Fit the predictor registered as ``name`` on ``train`` for horizon H.

    Raises ``ValueError`` listing the valid names for an unknown one.
    """
    try:
        fit = PREDICTORS[name]
    except KeyError:
        raise ValueError(f"unknown predictor {name!r}; valid: {', '.join(PREDICTORS)}") from None
    return fit(train, horizon=horizon, seed=seed, **params)
