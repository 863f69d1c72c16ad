"""Parametric workload shapes (core/workloads/shapes.py): known answers and the registry."""

import numpy as np
import pytest

from balanceroute.core.workloads import SHAPES, WORKLOADS, LengthBounds, load_workload
from balanceroute.core.workloads.shapes import Lengths, Shape, generate_shape


def test_every_shape_is_a_registered_seeded_generator():
    for name in SHAPES:
        assert name in WORKLOADS
        a = load_workload(name, requests=200, seed=7)
        b = load_workload(name, requests=200, seed=7)
        c = load_workload(name, requests=200, seed=8)
        assert len(a) == 200 and np.array_equal(a.prompt_len, b.prompt_len)
        assert not np.array_equal(a.prompt_len, c.prompt_len)
        assert np.all(np.diff(a.arrival_s) >= 0) and a.prompt_len.min() >= 1


def test_lognormal_median_pareto_floor_and_rank_correlation():
    rng = np.random.default_rng(0)
    shape = Shape(prompt=Lengths(median=1000, sigma=1.0),
                  output=Lengths(kind="pareto", scale=100, alpha=2.0), rho=0.8)
    w = generate_shape(shape, 20_000, rng, name="t")
    assert np.median(w.prompt_len) == pytest.approx(1000, rel=0.05)
    assert w.output_len.min() >= 100  # x_m·(1 − u)^(−1/α) ≥ x_m
    assert np.median(w.output_len) == pytest.approx(100 * 2 ** 0.5, rel=0.05)  # x_m·2^(1/α)
    ranks = [np.argsort(np.argsort(x)) for x in (w.prompt_len, w.output_len)]
    # Gaussian copula: Spearman ρ_s = (6/π)·asin(ρ/2) ≈ 0.786 at ρ = 0.8
    assert np.corrcoef(*ranks)[0, 1] == pytest.approx(6 / np.pi * np.arcsin(0.4), abs=0.02)


def test_bimodal_mixture_weights_and_bursty_gaps():
    rng = np.random.default_rng(1)
    two = Lengths(kind="mixture", weights=(0.25, 0.75),
                  parts=(Lengths(median=10, sigma=0.1), Lengths(median=10_000, sigma=0.1)))
    w = generate_shape(Shape(prompt=two, burst_cv=3.0, rate=5.0), 20_000, rng, name="t")
    assert np.mean(w.prompt_len < 100) == pytest.approx(0.25, abs=0.01)
    gaps = np.diff(w.arrival_s)
    assert gaps.mean() == pytest.approx(0.2, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.15)


def test_bounds_and_bad_parameters():
    w = generate_shape(SHAPES["shape-summarize"], 300, np.random.default_rng(2), name="t",
                       bounds=LengthBounds(max_output=200))
    assert len(w) == 300 and w.output_len.max() <= 200
    with pytest.raises(ValueError, match="must"):
        Lengths(kind="mixture", weights=(1.0,), parts=())
    with pytest.raises(ValueError, match="rho"):
        Shape(rho=1.0)
