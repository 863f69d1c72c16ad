"""Bridges between the exact models and ``core.simulator``.

- :func:`simulate_schedule` runs an online policy through the simulator on a clairvoyant
  instance and returns its schedule (replica, start step) and Σ_k I(k), so the policy and the
  clairvoyant optimum are compared on the same episode. All releases 0: saturated mode with the
  pool holding every request. Otherwise open-loop mode on a clock where one step lasts exactly
  ``CLOCK_STEP_S`` (a = 0): request i joins the pool at step r_i exactly. Either way the step
  dynamics are the simulator's own.
- :class:`TickRecorder` wraps a policy and records the tick instances it meets in a simulation,
  for per-tick gaps on real traces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from ..core.dynamics import StepModel
from ..core.policies import get_policy
from ..core.simulator import SimConfig, simulate
from ..core.state import Assignment, ClusterState, PoolView
from ..core.workloads.base import Workload
from .clairvoyant_eval import evaluate_schedule
from .instances import ClairvoyantInstance, TickInstance

__all__ = ["CLOCK_STEP_S", "PolicySchedule", "TickRecorder", "simulate_schedule"]

#: Step duration (s) of the open-loop bridge clock: a power of two, so k·τ is exact in floats.
CLOCK_STEP_S = 2.0**-5


@dataclass(slots=True)
class PolicySchedule:
    """A policy's schedule on a clairvoyant instance and its exact metrics
    (:func:`~balanceroute.solvers.clairvoyant_eval.evaluate_schedule`); ``sim_imbalance`` is the
    simulator's own Σ_k I(k), equal to ``metrics["imbalance"]``."""

    policy: str
    replica: NDArray[np.int64]
    start: NDArray[np.int64]
    metrics: dict[str, float]
    sim_imbalance: float


def simulate_schedule(instance: ClairvoyantInstance, policy: str = "br0", *, seed: int = 0,
                      **params) -> PolicySchedule:
    """Run ``policy`` (a registered name) on ``instance`` in the simulator."""
    n = instance.num_requests
    saturated = not instance.release.any()
    clock = CLOCK_STEP_S
    workload = Workload(
        name=instance.name or "clairvoyant", prompt_len=instance.prompt_len.copy(),
        output_len=instance.output_len.copy(), arrival_s=instance.release * clock,
    )
    if saturated:
        config = SimConfig(num_replicas=instance.num_replicas, slots=instance.slots,
                           mode="saturated", pool_size=n,
                           step_model=StepModel(b=instance.step_b or clock, a=instance.step_a))
    else:
        config = SimConfig(num_replicas=instance.num_replicas, slots=instance.slots,
                           mode="open_loop", step_model=StepModel(b=clock, a=0.0))
    result = simulate(workload, get_policy(policy, seed=seed, **params), config)
    if saturated:
        start = result.start_step.astype(np.int64)
    else:
        tick_time = instance.release * clock + result.pool_wait_s
        start = np.rint(tick_time / clock).astype(np.int64)
    metrics = evaluate_schedule(instance, result.replica, start)
    sim_i = result.metrics["mean_imbalance_all"] * result.metrics["steps"]
    return PolicySchedule(policy=policy, replica=result.replica.astype(np.int64), start=start,
                          metrics=metrics, sim_imbalance=float(sim_i))


@dataclass(slots=True)
class TickRecorder:
    """A policy wrapper that records every ``every``-th non-trivial tick (pool and free slots
    both non-empty) as a BR-0 :class:`TickInstance`, then delegates to ``inner``."""

    inner: object
    every: int = 1
    limit: int = 1_000_000
    objective: str = "f_score"
    ticks: list[TickInstance] = field(default_factory=list)
    seen: int = 0
    name: str = "recorder"

    def assign(self, state: ClusterState, pool: PoolView) -> Assignment:
        """Record the tick (maybe), then return the inner policy's decision."""
        if len(pool) and state.free_slots.sum() and len(self.ticks) < self.limit:
            if self.seen % self.every == 0:
                self.ticks.append(TickInstance.br0(
                    state.loads, state.free_slots, pool.prompt_len, wait=pool.wait,
                    num_active=state.num_active, objective=self.objective,
                    name=f"step{state.step}",
                ))
            self.seen += 1
        return self.inner.assign(state, pool)  # type: ignore[attr-defined]
