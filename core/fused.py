"""The fused simulation loop: :func:`~balanceroute.core.simulator.simulate`'s dynamics and a
policy's tick compiled together (numba), for the policies that declare a compiled tick.

The generic loop calls ``policy.assign`` once per tick through the Python contract; here the
whole run — admission, tick, step, finishes — is one compiled loop with no per-request Python
objects and no per-step allocation. Same dynamics, same floating-point operations in the same
order, so the per-request outcomes and the metrics are identical to the generic loop's (a test
checks it).

A policy owns its fast path through the contract of :mod:`~balanceroute.core.tick_contract`
(:class:`~balanceroute.core.tick_contract.CompiledPolicy`, which this module re-exports):
``policy.compiled_tick(slots)`` returns a :class:`~balanceroute.core.tick_contract.CompiledTick`
— which compiled tick, its parameters and its state — or ``None``, and
``policy.restore_tick_state(state)`` takes back the state the run left. This module knows no
policy class, and no policy imports it. BR-0 declares the two-stage tick (the very kernel
:func:`~balanceroute.core.two_stage.two_stage_assign` runs); the deterministic FIFO baselines
(JSQ, LeastLoad, RoundRobin) declare the FIFO tick with their key, ranked by the one chooser
their ``assign`` also calls (:func:`~balanceroute.core._tick_kernels.fifo_choose`), and
RoundRobin's cursor as state. A subclass that overrides the rule gets no compiled tick (the
declarations check that ``assign`` is still their class's own). Random and PowerOfTwo (their draws
come from a ``np.random.Generator``) and BR-H (its predictor is Python) declare none: the generic
loop runs them.

Requests finish through a calendar ring indexed by finish step (one linked list per step), so
a step costs O(G + finishes + tick), not O(G·B).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from . import _kernels as kern
from ._jit import HAVE_NUMBA
from .outcomes import RequestColumns
from .tick_contract import FIFO, TWO_STAGE, CompiledPolicy, CompiledTick

__all__ = ["FIFO", "TWO_STAGE", "CompiledPolicy", "CompiledTick", "compiled_tick", "run_fused"]


def compiled_tick(policy: object, slots: int) -> CompiledTick | None:
    """The compiled tick ``policy`` declares, or ``None`` if it has none (or numba is missing)."""
    if not HAVE_NUMBA or not isinstance(policy, CompiledPolicy):
        return None
    return policy.compiled_tick(slots)


@dataclass(slots=True)
class FusedRun:
    """What the fused loop leaves behind: per-request columns, the running totals and the
    policy's state."""

    cols: RequestColumns
    loads: NDArray[np.int64]
    ints: NDArray[np.int64]
    floats: NDArray[np.float64]
    series: NDArray[np.float64] | None
    state: NDArray[np.int64]
    """The policy's state after the run (:attr:`CompiledTick.state`, updated)."""

    @property
    def steps(self) -> int:
        """Decode steps run."""
        return int(self.ints[kern.K])

    @property
    def generated(self) -> int:
        """Tokens generated."""
        return int(self.ints[kern.GENERATED])

    @property
    def loaded_steps(self) -> int:
        """Steps up to and including the last one that assigned a request."""
        return int(self.ints[kern.LOADED_STEPS])

    @property
    def totals(self) -> tuple[float, float, float, float, float, float]:
        """``(now, Σ I, Σ G·M, Σ τ, Σ I loaded phase, Σ G·M loaded phase)``."""
        return tuple(float(x) for x in self.floats)  # type: ignore[return-value]


def run_fused(
    prompt: NDArray[np.int64],
    output: NDArray[np.int64],
    ready: NDArray[np.float64],
    *,
    saturated: bool,
    target: int,
    num_replicas: int,
    slots: int,
    tick: CompiledTick,
    step_b: float,
    step_a: float,
    step_c: float,
    max_steps: int,
    record_series: bool,
    progress: Callable[[int], None] | None = None,
    chunk_steps: int = 1 << 15,
) -> FusedRun:
    """Run the whole workload (``ready`` = prefill-completed times, open loop; NaN saturated).

    Raises ``RuntimeError`` like the generic loop (step limit, or nothing can run). With
    ``progress``, the loop returns to Python every ``chunk_steps`` steps to report.
    """
    n = prompt.shape[0]
    g_count = num_replicas
    cap = min(n, target) if saturated else n
    ring = int(output.max()) + 1
    run = FusedRun(
        cols=RequestColumns.empty(ready),
        loads=np.zeros(g_count, dtype=np.int64),
        ints=np.zeros(8, dtype=np.int64),
        floats=np.zeros(6, dtype=np.float64),
        series=np.empty((6, 1024), dtype=np.float64) if record_series else None,
        state=tick.state.astype(np.int64, copy=True),
    )
    n_act = np.zeros(g_count, dtype=np.int64)
    pool = np.empty(max(cap, 1), dtype=np.int64)
    head = np.full(ring, -1, dtype=np.int64)
    link = np.full(n, -1, dtype=np.int64)
    series = run.series if run.series is not None else np.empty((6, 0), dtype=np.float64)
    budget = chunk_steps if progress is not None else max_steps + 1
    key = np.ascontiguousarray(tick.key, dtype=np.int64)
    no_state = np.zeros(1, dtype=np.int64)  # the loop's FIFO slot, unused by stateless ticks
    reported = 0
    while True:
        series = kern.simulate_loop(
            prompt, output, ready, saturated, target, g_count, slots, tick.kind, key,
            run.state if run.state.shape[0] else no_state, tick.s_greedy, tick.r_max,
            float(tick.deadline_s), float(tick.deadline_factor),
            float(tick.beta_per_replica * g_count), bool(tick.fit_stage1),
            float(tick.growth_steps), float(tick.ttft_slo_s), bool(tick.lpt_batches), step_b,
            step_a, step_c, max_steps,
            budget, record_series, *run.cols.arrays(), run.loads, n_act, pool, head, link, run.ints,
            run.floats, series,
        )
        status = run.ints[kern.STATUS]
        finished = int(run.ints[kern.FINISHED])
        if progress is not None and finished != reported:
            progress(finished)
            reported = finished
        if status == kern.MAX_STEPS:
            raise RuntimeError(f"simulation exceeded {max_steps} steps")
        if status == kern.STUCK:  # pragma: no cover - a work-conserving policy never gets here
            raise RuntimeError("no request is running and none can be assigned")
        if status == kern.DONE:
            break
    if record_series:
        run.series = series[:, : run.ints[kern.N_SERIES]].copy()
    return run
