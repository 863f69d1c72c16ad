"""Calibration metrics of a termination forecast, in numpy: AUC, Brier score, ECE.

``evaluate_predictor`` judges a fitted predictor on held-out trajectories sampled every H/2
steps (the tuples the learned model trains on), so every predictor is scored on the same data.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..workloads.base import Workload
from .base import Predictor, RequestFeatures, training_tuples

__all__ = ["auc", "brier_score", "evaluate_predictor", "expected_calibration_error"]


def _rankdata(values: NDArray) -> NDArray[np.float64]:
    """Ranks 1..n, ties sharing their average rank."""
    order = np.argsort(values, kind="mergesort")
    sorted_v = values[order]
    new = np.concatenate([[True], sorted_v[1:] != sorted_v[:-1]])
    group = np.cumsum(new) - 1
    first = np.flatnonzero(new)
    last = np.concatenate([first[1:], [values.shape[0]]]) - 1
    avg = (first + last) / 2.0 + 1.0
    ranks = np.empty(values.shape[0], dtype=np.float64)
    ranks[order] = avg[group]
    return ranks


def auc(labels: ArrayLike, scores: ArrayLike) -> float:
    """Area under the ROC curve = P(score of a random positive > that of a random negative)
    + ½ P(tie), by the Mann–Whitney rank sum. NaN if one class is absent."""
    y = np.asarray(labels, dtype=bool)
    s = np.asarray(scores, dtype=np.float64)
    n_pos = int(y.sum())
    n_neg = y.shape[0] - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = _rankdata(s)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def brier_score(labels: ArrayLike, probs: ArrayLike) -> float:
    """``mean((p − y)²)``: 0 is perfect, 0.25 is a constant ½."""
    y = np.asarray(labels, dtype=np.float64)
    p = np.asarray(probs, dtype=np.float64)
    return float(np.mean((p - y) ** 2))


def expected_calibration_error(labels: ArrayLike, probs: ArrayLike, *, bins: int = 10) -> float:
    """``ECE = Σ_b (n_b / n)·|mean(y)_b − mean(p)_b|`` over ``bins`` equal-width bins of p on
    [0, 1] (p = 1 falls in the last bin)."""
    if bins < 1:
        raise ValueError(f"{bins=} must be >= 1")
    y = np.asarray(labels, dtype=np.float64)
    p = np.asarray(probs, dtype=np.float64)
    b = np.minimum((p * bins).astype(np.int64), bins - 1)
    count = np.bincount(b, minlength=bins)
    gap = np.abs(np.bincount(b, weights=y, minlength=bins) - np.bincount(b, weights=p, minlength=bins))
    return float(gap.sum() / max(count.sum(), 1))


def evaluate_predictor(
    predictor: Predictor,
    test: Workload,
    horizon: int,
    *,
    max_tuples: int | None = 200_000,
    seed: int = 0,
) -> dict[str, float]:
    """Held-out quality of ``predictor`` at horizon H on ``test``'s trajectories (every H/2
    steps): ``auc``, ``brier``, ``ece`` of p_fin against [r ≤ H]; ``mae_mu_rem`` of mu_rem on
    the tuples that do finish; ``positive_rate``; ``gated_share`` = share with p_fin ≥ ½ (those
    whose forecast BR-H uses); ``tuples``."""
    tuples = training_tuples(test, horizon, max_tuples=max_tuples, rng=np.random.default_rng(seed))
    feats = RequestFeatures.from_workload(test).take(tuples.row)
    p_fin, mu_rem = predictor.predict(feats, tuples.age, horizon)
    y = tuples.finished
    return {
        "auc": auc(y, p_fin),
        "brier": brier_score(y, p_fin),
        "ece": expected_calibration_error(y, p_fin),
        "mae_mu_rem": float(np.mean(np.abs(mu_rem[y] - tuples.remaining[y]))) if y.any() else float("nan"),
        "positive_rate": float(y.mean()),
        "gated_share": float(np.mean(p_fin >= 0.5)),
        "tuples": float(len(tuples)),
    }
