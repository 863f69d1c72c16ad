"""Shared fixtures: seeded generators and the registered solvers grouped by problem."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh seeded generator per test."""
    return np.random.default_rng(20260513)
