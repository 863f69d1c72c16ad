"""Round robin: replicas take the pool head in cyclic order, skipping full ones."""

from __future__ import annotations

from .base import TURN, FifoPolicy


class RoundRobinPolicy(FifoPolicy):
    """Cyclic order over replicas; the cursor persists across ticks, full replicas are skipped."""

    name = "round_robin"
    key = (TURN,)  # the first replica with a free slot from the cursor on, cyclically
