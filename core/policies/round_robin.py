"""Round robin: replicas take the pool head in cyclic order, skipping full ones."""

from __future__ import annotations

import numpy as np

from .base import FifoPolicy


class RoundRobinPolicy(FifoPolicy):
    """Cyclic order over replicas; the cursor persists across ticks, full replicas are skipped."""

    name = "round_robin"

    def __init__(self) -> None:
        self.cursor = 0

    def choose(self, free, loads, active) -> int:
        """The next replica in cyclic order that has a free slot."""
        g_count = free.shape[0]
        order = (self.cursor + np.arange(g_count)) % g_count
        g = int(order[np.argmax(free[order] > 0)])
        self.cursor = (g + 1) % g_count
        return g
