"""Least load: the replica holding the fewest KV tokens (SGLang's ``total_tokens`` peer)."""

from __future__ import annotations

from .base import ACTIVE, LOAD, FifoPolicy


class LeastLoadPolicy(FifoPolicy):
    """Fewest KV tokens among replicas with a free slot (ties: fewer active requests, index)."""

    name = "least_load"
    key = (LOAD, ACTIVE)  # argmin of (KV load, active requests), then index
