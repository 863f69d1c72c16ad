"""The compiled-tick contract: what a policy declares so that an engine may run its tick
compiled.

A policy owns its fast path (:class:`CompiledPolicy`): ``policy.compiled_tick(slots)`` returns a
:class:`CompiledTick` — which compiled tick, its parameters and its state — or ``None``, and
``policy.restore_tick_state(state)`` takes back the state the run left. This module knows no
engine: the simulator's fused loop (:mod:`~balanceroute.core.fused`) reads the declaration, and
the tick kernels themselves live in :mod:`~balanceroute.core._tick_kernels`. BR-0 declares the
two-stage tick (the very kernel :func:`~balanceroute.core.two_stage.two_stage_assign` runs); the
deterministic FIFO baselines (JSQ, LeastLoad, RoundRobin) declare the FIFO tick with their key,
ranked by the one chooser their ``assign`` also calls
(:func:`~balanceroute.core._tick_kernels.fifo_choose`), and RoundRobin's cursor as state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

__all__ = ["FIFO", "TWO_STAGE", "CompiledPolicy", "CompiledTick"]

TWO_STAGE, FIFO = 0, 1
"""The compiled ticks an engine can run (a policy declares which one it uses)."""

_NO_INTS = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)  # array fields: no ==
class CompiledTick:
    """A policy's tick as an engine runs it compiled, declared by the policy.

    ``kind``: :data:`TWO_STAGE` (BR-0's tick with ``s_greedy``, ``r_max``, ``deadline_s`` and the
    relative deadline's ``deadline_factor`` (``inf``: off), β =
    ``beta_per_replica``·G, ``fit_stage1``, Stage 1's T = ``growth_steps``, ``ttft_slo_s``,
    ``lpt_batches``) or
    :data:`FIFO` (the pool head to the free replica with the smallest ``key``, see
    :class:`~balanceroute.core.policies.base.FifoPolicy`). ``state``: the policy's integer
    state (FIFO: ``[cursor]``); the run returns it updated.
    """

    kind: int
    key: NDArray[np.int64] = field(default_factory=lambda: _NO_INTS)
    state: NDArray[np.int64] = field(default_factory=lambda: _NO_INTS)
    s_greedy: int = 0
    r_max: int = 1
    deadline_s: float = float("inf")
    deadline_factor: float = float("inf")
    beta_per_replica: float = 1.0
    fit_stage1: bool = True
    growth_steps: float = 0.0
    ttft_slo_s: float = float("inf")
    lpt_batches: bool = False

    def __post_init__(self) -> None:
        if self.kind not in (TWO_STAGE, FIFO):
            raise ValueError(f"{self.kind=} must be TWO_STAGE or FIFO")
        if self.kind == FIFO and self.state.shape != (1,):
            raise ValueError(f"{self.state=} must be [cursor] for the FIFO tick")


@runtime_checkable
class CompiledPolicy(Protocol):
    """A policy with a compiled tick (found by duck typing, never by class)."""

    def compiled_tick(self, slots: int) -> CompiledTick | None:
        """The tick for replicas of ``slots`` slots, or ``None`` (then the generic loop runs)."""
        ...

    def restore_tick_state(self, state: NDArray[np.int64]) -> None:
        """Take back ``CompiledTick.state`` as a compiled run left it."""
        ...
