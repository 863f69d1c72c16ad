"""Power of two choices: sample two replicas with free slots, keep the lower KV load."""

from __future__ import annotations

import numpy as np

from .base import FifoPolicy


class PowerOfTwoPolicy(FifoPolicy):
    """Two distinct random replicas with a free slot; the one with fewer KV tokens wins
    (ties: the first sampled). With one candidate it takes that one."""

    name = "power_of_two"

    def __init__(self, *, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def choose(self, free, loads, active) -> int:
        """The less loaded of two random replicas with a free slot."""
        candidates = np.flatnonzero(free > 0)
        if candidates.shape[0] == 1:
            return int(candidates[0])
        a, b = candidates[self.rng.choice(candidates.shape[0], size=2, replace=False)]
        return int(b if loads[b] < loads[a] else a)
