"""The fused simulation loop: :func:`~balanceroute.core.simulator.simulate`'s dynamics and a
policy's tick compiled together (numba), for the policies that have a compiled tick.

The generic loop calls ``policy.assign`` once per tick through the Python contract; here the
whole run — admission, tick, step, finishes — is one compiled loop with no per-request Python
objects and no per-step allocation. Same dynamics, same floating-point operations in the same
order, so the per-request outcomes and the metrics are identical to the generic loop's (a test
checks it). Policies with a compiled tick are registered in :data:`FUSED_POLICIES` by exact
type (a subclass may override the rule, so it takes the generic path): BR-0 (the very kernel
:func:`~balanceroute.core.two_stage.two_stage_assign` runs) and the deterministic FIFO
baselines JSQ, LeastLoad and RoundRobin. Random and PowerOfTwo keep the generic path (their
draws come from a ``np.random.Generator``), as does BR-H (its predictor is Python).

Requests finish through a calendar ring indexed by finish step (one linked list per step), so
a step costs O(G + finishes + tick), not O(G·B).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import _kernels as kern
from ._jit import HAVE_NUMBA
from .outcomes import RequestColumns
from .policies.br0 import BR0Policy, stage1_growth_steps
from .policies.jsq import JSQPolicy
from .policies.least_load import LeastLoadPolicy
from .policies.round_robin import RoundRobinPolicy

__all__ = ["FUSED_POLICIES", "FusedPolicy", "fused_policy", "run_fused"]



@dataclass(frozen=True, slots=True)
class FusedPolicy:
    """A policy's tick as the fused loop runs it: ``kind`` and its parameters."""

    kind: int
    s_greedy: int = 0
    r_max: int = 1
    deadline_s: float = float("inf")
    beta_per_replica: float = 1.0
    fit_stage1: bool = True
    growth_steps: float | None = 0.0
    ttft_slo_s: float = float("inf")


def _br0(p: BR0Policy) -> FusedPolicy:
    return FusedPolicy(
        kind=kern.TWO_STAGE, s_greedy=p.s_greedy, r_max=p.r_max, deadline_s=p.deadline_s,
        beta_per_replica=p.beta_per_replica, fit_stage1=p.stage1 == "fit",
        growth_steps=p.growth_steps,
        ttft_slo_s=float("inf") if p.ttft_slo_s is None else float(p.ttft_slo_s),
    )


FUSED_POLICIES: dict[type, Callable[[Any], FusedPolicy]] = {
    BR0Policy: _br0,
    JSQPolicy: lambda p: FusedPolicy(kind=kern.JSQ),
    LeastLoadPolicy: lambda p: FusedPolicy(kind=kern.LEAST_LOAD),
    RoundRobinPolicy: lambda p: FusedPolicy(kind=kern.ROUND_ROBIN),
}
"""Policy class (exact type) → its compiled tick."""


def fused_policy(policy: object) -> FusedPolicy | None:
    """The compiled tick of ``policy``, or ``None`` if it has none (or numba is missing)."""
    if not HAVE_NUMBA:
        return None
    build = FUSED_POLICIES.get(type(policy))
    return None if build is None else build(policy)


@dataclass(slots=True)
class FusedRun:
    """What the fused loop leaves behind: per-request columns and the running totals."""

    cols: RequestColumns
    loads: NDArray[np.int64]
    ints: NDArray[np.int64]
    floats: NDArray[np.float64]
    series: NDArray[np.float64] | None

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
    def cursor(self) -> int:
        """RoundRobin's cursor after the run."""
        return int(self.ints[kern.CURSOR])

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
    spec: FusedPolicy,
    cursor: int,
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
        ints=np.zeros(9, dtype=np.int64),
        floats=np.zeros(6, dtype=np.float64),
        series=np.empty((6, 1024), dtype=np.float64) if record_series else None,
    )
    run.ints[kern.CURSOR] = cursor
    n_act = np.zeros(g_count, dtype=np.int64)
    pool = np.empty(max(cap, 1), dtype=np.int64)
    head = np.full(ring, -1, dtype=np.int64)
    link = np.full(n, -1, dtype=np.int64)
    series = run.series if run.series is not None else np.empty((6, 0), dtype=np.float64)
    budget = chunk_steps if progress is not None else max_steps + 1
    reported = 0
    while True:
        series = kern.simulate_loop(
            prompt, output, ready, saturated, target, g_count, slots, spec.kind, spec.s_greedy,
            spec.r_max, float(spec.deadline_s), float(spec.beta_per_replica * g_count),
            bool(spec.fit_stage1), stage1_growth_steps(spec.growth_steps, slots), float(spec.ttft_slo_s), step_b, step_a, step_c, max_steps, budget,
            record_series, *run.cols.arrays(), run.loads, n_act, pool, head, link, run.ints,
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
