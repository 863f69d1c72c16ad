"""Join the shortest queue: the replica running the fewest requests."""

from __future__ import annotations

import numpy as np

from .base import FifoPolicy


class JSQPolicy(FifoPolicy):
    """Fewest active requests among replicas with a free slot (ties: lower KV load, then index)."""

    name = "jsq"

    def choose(self, free, loads, active) -> int:
        """argmin of (active requests, KV load) over replicas with a free slot."""
        candidates = np.flatnonzero(free > 0)
        order = np.lexsort((loads[candidates], active[candidates]))
        return int(candidates[order[0]])
