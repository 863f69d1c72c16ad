"""The KV lease: one rule for when a prefilled request must reach decode.

A prefill server holds a request's KV for ``lease_s`` seconds after it answers (vLLM NIXL's
``kv_lease_duration``, 30 s). The transfer to decode takes up to ``margin_s``, so a request is
forwarded no later than ``forward_by_s = lease_s − margin_s`` after it joined the pool; past that
it is never forwarded. The policies place it first from ``deadline_s = forward_by_s −
priority_s`` on (their pool deadline). A request that passed ``forward_by_s`` is prefilled again
(it rejoins the pool and its wait restarts) up to ``max_reprefills`` times, then failed with a
clear error. The simulator and the proxy apply the same :class:`LeaseRule`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from .dynamics import KV_LEASE_S

__all__ = ["DEFAULT_LEASE", "LeaseRule"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRule:
    """When a pooled request must be forwarded, when policies place it first, and what happens
    to one that missed it.

    ``lease_s``: the prefill server's KV lease; ``margin_s``: the transfer's worst case
    (forward no later than ``lease_s − margin_s``); ``priority_s``: policies place a request
    first this long before that point; ``max_reprefills``: a request that missed it is prefilled
    again this many times, then failed. Defaults give the policies' deadline 25 s.
    """

    lease_s: float = KV_LEASE_S
    margin_s: float = 2.0
    priority_s: float = 3.0
    max_reprefills: int = 1

    def __post_init__(self) -> None:
        if not (self.lease_s > 0 and np.isfinite(self.lease_s)):
            raise ValueError(f"{self.lease_s=} must be a finite number > 0")
        if not 0 <= self.margin_s < self.lease_s:
            raise ValueError(f"{self.margin_s=} must be in [0, lease_s)")
        if not 0 <= self.priority_s < self.lease_s - self.margin_s:
            raise ValueError(f"{self.priority_s=} must be in [0, lease_s - margin_s)")
        if self.max_reprefills < 0:
            raise ValueError(f"{self.max_reprefills=} must be >= 0")

    @property
    def forward_by_s(self) -> float:
        """``lease_s − margin_s``: a request that waited this long is never forwarded."""
        return self.lease_s - self.margin_s

    @property
    def deadline_s(self) -> float:
        """``forward_by_s − priority_s``: the policies' pool deadline (placed first from here)."""
        return self.forward_by_s - self.priority_s

    def expired(self, wait: float | NDArray[np.float64]) -> bool | NDArray[np.bool_]:
        """``wait >= forward_by_s`` (elementwise for arrays): too late to forward."""
        if isinstance(wait, np.ndarray):
            return wait >= self.forward_by_s
        return bool(wait >= self.forward_by_s)


DEFAULT_LEASE = LeaseRule()
"""The shipped rule: 30 s lease, 2 s transfer margin, placed first from 25 s, one re-prefill."""
