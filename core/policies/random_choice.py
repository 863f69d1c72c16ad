"""Random: the pool head goes to a uniformly random replica with a free slot."""

from __future__ import annotations

import numpy as np

from .base import FifoPolicy


class RandomPolicy(FifoPolicy):
    """Uniform over replicas with free slots; seeded, so runs are reproducible."""

    name = "random"

    def __init__(self, *, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def choose(self, free, loads, active) -> int:
        """A uniformly random replica among those with a free slot."""
        candidates = np.flatnonzero(free > 0)
        return int(candidates[self.rng.integers(candidates.shape[0])])
