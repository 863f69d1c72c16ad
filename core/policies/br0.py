"""BR-0: the prediction-free BalanceRoute policy (DESIGN §2)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..state import Assignment, ClusterState, PoolView
from ..two_stage import two_stage_assign

_ONE = np.ones(1, dtype=np.float64)


@dataclass(slots=True, kw_only=True)
class BR0Policy:
    """Two-stage tick scoring each candidate set by ``F_g(Q) = Δ − G·(Δ − m_g)_+`` on the
    current loads: fill safe margins 1:1, punish overflow (G − 1)-fold.

    ``s_greedy``: Stage 1 runs while more slots than this are free; ``r_max``: Stage 2 subset
    candidates; ``deadline_s``: pooled requests older than this are placed first (vLLM's NIXL
    KV lease is 30 s).
    """

    s_greedy: int = 8
    r_max: int = 4
    deadline_s: float = 30.0
    name: str = "br0"

    def __post_init__(self) -> None:
        if self.s_greedy < 0:
            raise ValueError(f"{self.s_greedy=} must be >= 0")
        if not 1 <= self.r_max <= 12:
            raise ValueError(f"{self.r_max=} must be in 1..12")
        if self.deadline_s <= 0:
            raise ValueError(f"{self.deadline_s=} must be > 0")

    def assign(self, state: ClusterState, pool: PoolView) -> Assignment:
        """One BR-0 tick on the current loads."""
        return two_stage_assign(
            state.loads[:, None],
            state.free_slots,
            pool.prompt_len,
            pool.wait,
            d=_ONE,
            alpha=1.0,
            beta=float(state.num_replicas),
            s_greedy=self.s_greedy,
            r_max=self.r_max,
            deadline_s=self.deadline_s,
        )
