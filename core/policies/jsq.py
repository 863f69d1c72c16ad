"""Join the shortest queue: the replica running the fewest requests."""

from __future__ import annotations

from .base import ACTIVE, LOAD, FifoPolicy


class JSQPolicy(FifoPolicy):
    """Fewest active requests among replicas with a free slot (ties: lower KV load, then index)."""

    name = "jsq"
    key = (ACTIVE, LOAD)  # argmin of (active requests, KV load), then index
