"""Least load: the replica holding the fewest KV tokens (SGLang's ``total_tokens`` peer)."""

from __future__ import annotations

import numpy as np

from .base import FifoPolicy


class LeastLoadPolicy(FifoPolicy):
    """Fewest KV tokens among replicas with a free slot (ties: fewer active requests, index)."""

    name = "least_load"

    def choose(self, free, loads, active) -> int:
        """argmin of (KV load, active requests) over replicas with a free slot."""
        candidates = np.flatnonzero(free > 0)
        order = np.lexsort((active[candidates], loads[candidates]))
        return int(candidates[order[0]])
