"""Seeded instance factories shared by tests, benchmarks and ``balanceroute gap``.

Randomness comes in as a ``np.random.Generator``; the same generator state gives the same
instance.
"""

from __future__ import annotations

import numpy as np

from ..core.workloads.base import Workload
from .instances import ClairvoyantInstance, ClairvoyantObjective, TickInstance, TickObjective

__all__ = [
    "clairvoyant_from_workload",
    "random_clairvoyant_instance",
    "random_tick_instance",
    "tiny_clairvoyant_instance",
    "tiny_tick_instance",
]


def random_tick_instance(
    rng: np.random.Generator, *, num_replicas: int = 4, pool_size: int = 16, max_free: int = 3,
    prompt_median: float = 600.0, prompt_sigma: float = 0.9, load_base: int = 40_000,
    load_spread: int = 4_000, horizon: int = 0, gamma: float = 0.9,
    objective: TickObjective = "f_score", name: str = "",
) -> TickInstance:
    """A decode-cluster tick in the saturated regime: loads ``load_base`` + U[0, ``load_spread``)
    KV tokens, 0..``max_free`` free slots per replica (at least one in total), a pool of
    ``pool_size`` log-normal prompt lengths (median ``prompt_median``, clipped to [8, 8192]).

    With ``horizon`` H > 0 the loads are projected H steps ahead (each replica's 40–64 running
    requests grow by one token per step until a geometric number of them finish) and scored
    BR-H style with d = (1, γ, …, γ^H), α = 1, β = G.
    """
    g = num_replicas
    loads = load_base + rng.integers(0, max(load_spread, 1), g)
    free = rng.integers(0, max_free + 1, g)
    if free.sum() == 0:
        free[rng.integers(g)] = 1
    sizes = np.clip(np.rint(rng.lognormal(np.log(prompt_median), prompt_sigma, pool_size)), 8, 8192)
    if horizon == 0:
        return TickInstance.br0(loads, free, sizes.astype(np.int64), objective=objective, name=name)
    active = rng.integers(40, 65, g)
    proj = np.empty((g, horizon + 1))
    proj[:, 0] = loads
    running = active.astype(np.float64)
    for h in range(1, horizon + 1):
        leaving = rng.binomial(running.astype(np.int64), 0.02)
        per_req = proj[:, h - 1] / np.maximum(running, 1)
        running = running - leaving
        proj[:, h] = np.maximum(proj[:, h - 1] - leaving * per_req + running, 0.0)
    proj = np.rint(proj)
    d = gamma ** np.arange(horizon + 1)
    return TickInstance(proj_loads=proj, free_slots=free, prompt_len=sizes.astype(np.int64), d=d,
                        alpha=1.0, beta=float(g), objective=objective, name=name)


def tiny_tick_instance(rng: np.random.Generator, *, objective: TickObjective = "f_score") -> TickInstance:
    """A brute-forceable tick: G ∈ 2..3, P ∈ 2..6, loads 0..40, prompts 1..20, 0..2 free slots
    per replica; a quarter of them BR-H shaped (H ∈ 1..2, γ = 0.5, α = 1, β = G)."""
    g = int(rng.integers(2, 4))
    p = int(rng.integers(2, 7))
    free = rng.integers(0, 3, g)
    if free.sum() == 0:
        free[0] = 1
    sizes = rng.integers(1, 21, p)
    if rng.random() < 0.75:
        return TickInstance.br0(rng.integers(0, 41, g), free, sizes, objective=objective)
    h = int(rng.integers(1, 3))
    proj = np.cumsum(rng.integers(-5, 6, (g, h + 1)), axis=1) + rng.integers(10, 41, (g, 1))
    return TickInstance(proj_loads=np.maximum(proj, 0), free_slots=free, prompt_len=sizes,
                        d=0.5 ** np.arange(h + 1), alpha=1.0, beta=float(g), objective=objective)


def random_clairvoyant_instance(
    rng: np.random.Generator, *, num_requests: int = 8, num_replicas: int = 2, slots: int = 2,
    max_prompt: int = 20, max_output: int = 6, max_release: int = 4, step: int = 1,
    objective: ClairvoyantObjective = "imbalance", work_conserving: bool = True, name: str = "",
) -> ClairvoyantInstance:
    """Small synthetic episode: uniform prompts 1..``max_prompt``, outputs 1..``max_output``,
    sorted releases 0..``max_release`` (all 0 when ``max_release`` = 0)."""
    n = num_requests
    return ClairvoyantInstance(
        num_replicas=num_replicas, slots=slots, prompt_len=rng.integers(1, max_prompt + 1, n),
        output_len=rng.integers(1, max_output + 1, n),
        release=np.sort(rng.integers(0, max_release + 1, n)), step=step, objective=objective,
        work_conserving=work_conserving, name=name,
    )


def tiny_clairvoyant_instance(rng: np.random.Generator, **kw) -> ClairvoyantInstance:
    """A clairvoyant instance small enough for every solver in well under a second."""
    kw.setdefault("num_requests", int(rng.integers(3, 7)))
    kw.setdefault("max_output", 4)
    kw.setdefault("max_release", 3)
    return random_clairvoyant_instance(rng, **kw)


def clairvoyant_from_workload(
    workload: Workload, *, first: int = 0, num_requests: int = 32, num_replicas: int = 4,
    slots: int = 4, release: str = "zero", step_seconds: float = 0.06, step: int = 1,
    objective: ClairvoyantObjective = "imbalance", name: str = "",
) -> ClairvoyantInstance:
    """Requests ``first`` … ``first + num_requests − 1`` of a trace as a clairvoyant episode.

    ``release="zero"``: all available at step 0 (the saturated pool); ``"arrival"``: released at
    step ⌊(arrival_i − arrival_first) / step_seconds⌋ (the trace's timestamps at a nominal step).
    """
    stop = first + num_requests
    if not 0 <= first < stop <= len(workload):
        raise ValueError(f"the slice {first}:{stop} is outside the workload ({len(workload)} requests)")
    part = workload.take(np.arange(first, stop))
    if release == "zero":
        rel = np.zeros(num_requests, dtype=np.int64)
    elif release == "arrival":
        if part.arrival_s is None:
            raise ValueError(f"workload {workload.name!r} has no timestamps: use release='zero'")
        if not step_seconds > 0:
            raise ValueError(f"{step_seconds=} must be > 0")
        rel = np.floor((part.arrival_s - part.arrival_s[0]) / step_seconds).astype(np.int64)
    else:
        raise ValueError(f"{release=} must be 'zero' or 'arrival'")
    return ClairvoyantInstance(
        num_replicas=num_replicas, slots=slots, prompt_len=part.prompt_len,
        output_len=part.output_len, release=rel, step=step, objective=objective,
        name=name or f"{workload.name}[{first}:{stop}]",
    )
