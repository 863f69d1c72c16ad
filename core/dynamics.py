"""The decode step's time, its barrier imbalance and the metrics every engine reports.

One home for the formulas shared by the simulator (:mod:`.simulator`), the emulated cluster
(``serving/emulator.py``), the pure-Python reference (``analysis/reference.py``) and the
experiments: the step time τ(k) (:class:`StepModel`), the per-step barrier record
(:func:`barrier`), the running totals of a measurement window (:class:`StepTotals`) and the
named metrics built from them (:func:`step_metrics`, :func:`request_metrics`). Each metric has
one name, used by every engine, CSV column, table and document.

Definitions. The *loaded phase* is steps 0..k_last, k_last the last step at which any request
was assigned (after it the cluster only drains).

- ``mean_imbalance`` = mean of I(k) = G·M(k) − Σ_g L_g(k) over the loaded phase;
  ``mean_imbalance_all`` over every step.
- ``barrier_idle_fraction`` = Σ I / Σ G·M over the loaded phase (share of replica capacity spent
  waiting at the barrier).
- ``throughput_tok_s`` = Σ o_i / Σ τ(k) over every step (drain included).
- ``throughput_loaded_tok_s`` = tokens generated in steps 0..k_last / the clock at the end of
  step k_last. In saturated mode (and in the emulator, whose emulated clock only moves with
  steps) the clock is Σ_{k ≤ k_last} τ(k); in open loop it also counts the idle gaps waiting
  for arrivals.
- ``mean_step_ms`` = 1000 · Σ τ / steps.
- TPOT_i = (t_last − t_first) / (o_i − 1) over requests with o_i > 1; TTFT_i = end of the first
  decode step − arrival; pool wait = tick time − time joined the pool.
- ``kv_lease_missed`` = share of requests whose pool wait reached ``KV_LEASE_S`` (30 s, vLLM's
  NIXL KV lease): in a PD deployment their prefilled KV would have expired and been prefilled
  again, which the engines do not model — a policy that keeps requests waiting that long buys
  balance with work a real cluster would redo.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from .keyvalue import parse_key_values

__all__ = ["KV_LEASE_S", "StepModel", "StepTotals", "barrier", "percentiles", "replica_loads_at",
           "request_metrics", "step_metrics"]

KV_LEASE_S = 30.0
"""How long a prefilled request's KV stays leased on its prefill node (vLLM NIXL's default), in
seconds: BR-0's and BR-H's pool deadline, and the threshold of ``kv_lease_missed``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepModel:
    """Step time ``τ(k) = b + max_g(a·L_g(k) + c·n_g(k))`` in seconds.

    Defaults (b = 30 ms, a = 0.2 µs per KV token, c = 0) give a ~60 ms step at G = 8, B = 64 on
    the decode-heavy bundled workloads, the regime of the paper (≈60 ms decode step).
    With c = 0 this is ``b + a·M(k)``.
    """

    b: float = 0.030
    a: float = 2.0e-7
    c: float = 0.0

    def __post_init__(self) -> None:
        for name in ("b", "a", "c"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"step model {name}={value!r} must be a finite number >= 0")
        if self.b == 0 and self.a == 0 and self.c == 0:
            raise ValueError("step model b, a, c cannot all be 0")

    @classmethod
    def parse(cls, text: str) -> StepModel:
        """From ``"b=0.03,a=2e-7,c=0"`` (any subset of the keys, each at most once; the rest
        keep defaults)."""
        parts = [p.strip() for p in text.split(",") if p.strip()]
        values = parse_key_values(parts, ("a", "b", "c"), float, what="step model",
                                  expected="a=..., b=... or c=...", kind="a number")
        return cls(**values)

    def step_time(self, loads: NDArray, active: NDArray, slow: NDArray | None = None) -> float:
        """τ for one step given loads L_g and active counts n_g; ``slow`` (a factor per replica,
        the emulator's slowed ranks) scales each replica's work: b + max_g(slow_g·(a·L_g + c·n_g))."""
        if slow is None:
            if self.c == 0.0:
                return self.b + self.a * float(loads.max())
            return self.b + float(np.max(self.a * loads + self.c * active))
        return self.b + float(np.max(slow * (self.a * loads + self.c * active)))


def barrier(loads: NDArray) -> tuple[float, float, float]:
    """(M(k), Σ_g L_g(k), I(k) = G·M(k) − Σ_g L_g(k)) of one step's loads."""
    envelope = loads.max()
    total = loads.sum()
    return envelope, total, loads.shape[0] * envelope - total


def step_metrics(*, steps: int, generated: float, sum_i: float, sum_tau: float,
                 loaded_i: float, loaded_gm: float, loaded_steps: int, loaded_tokens: float,
                 loaded_clock: float, makespan: float | None = None) -> dict[str, float]:
    """The step-level metrics of the module docstring from a window's totals (0 for an empty
    window): Σ I, Σ τ and generated tokens over every step, and Σ I, Σ G·M, steps, tokens and
    clock of the loaded phase; ``makespan_s`` (the clock at the end) when ``makespan`` is given."""
    return {
        "generated_tokens": float(generated),
        "steps": float(steps),
        "loaded_steps": float(loaded_steps),
        "mean_imbalance": loaded_i / max(loaded_steps, 1),
        "mean_imbalance_all": sum_i / steps if steps else 0.0,
        "barrier_idle_fraction": loaded_i / loaded_gm if loaded_gm else 0.0,
        "throughput_tok_s": generated / sum_tau if sum_tau else 0.0,
        "throughput_loaded_tok_s": loaded_tokens / loaded_clock if loaded_clock > 0 else 0.0,
        "busy_time_s": sum_tau,
        **({} if makespan is None else {"makespan_s": makespan}),
        "mean_step_ms": 1e3 * sum_tau / steps if steps else 0.0,
    }


@dataclass(slots=True)
class StepTotals:
    """Running totals of a measurement window, one :meth:`record` per decode step; the emulated
    clock is Σ τ (no idle time). :meth:`metrics` gives :func:`step_metrics`."""

    steps: int = 0
    generated: int = 0
    sum_i: float = 0.0
    sum_gm: float = 0.0
    sum_tau: float = 0.0
    loaded: tuple[float, float, int, float, float] = (0.0, 0.0, 0, 0.0, 0.0)

    def record(self, loads: NDArray, tau: float) -> float:
        """Book one step run on ``loads`` for ``tau`` seconds; returns its I(k)."""
        envelope, _, imbalance = barrier(loads)
        self.sum_i += float(imbalance)
        self.sum_gm += loads.shape[0] * float(envelope)
        self.sum_tau += tau
        self.steps += 1
        return float(imbalance)

    def generate(self, tokens: int, *, assigned: bool) -> None:
        """The step's requests generated ``tokens``; ``assigned``: the step admitted a request
        (it extends the loaded phase to this step)."""
        self.generated += tokens
        if assigned:
            self.loaded = (self.sum_i, self.sum_gm, self.steps, float(self.generated), self.sum_tau)

    def metrics(self) -> dict[str, float]:
        """:func:`step_metrics` of the window."""
        loaded_i, loaded_gm, loaded_steps, loaded_tokens, loaded_clock = self.loaded
        return step_metrics(steps=self.steps, generated=self.generated, sum_i=self.sum_i,
                            sum_tau=self.sum_tau, loaded_i=loaded_i, loaded_gm=loaded_gm,
                            loaded_steps=loaded_steps, loaded_tokens=loaded_tokens,
                            loaded_clock=loaded_clock)


def percentiles(values: NDArray, prefix: str, scale: float) -> dict[str, float]:
    """``{prefix}_p50/_p95/_p99`` of ``values`` times ``scale`` (NaN when empty)."""
    if values.shape[0] == 0:
        return {f"{prefix}_p50": float("nan"), f"{prefix}_p95": float("nan"), f"{prefix}_p99": float("nan")}
    p50, p95, p99 = np.percentile(values, [50, 95, 99]) * scale
    return {f"{prefix}_p50": float(p50), f"{prefix}_p95": float(p95), f"{prefix}_p99": float(p99)}


def request_metrics(output: NDArray, first_time: NDArray, finish_time: NDArray, arrival: NDArray,
                    tick_time: NDArray, joined: NDArray) -> tuple[dict[str, float], NDArray, NDArray, NDArray]:
    """(metrics, TPOT per request with NaN where o_i = 1, TTFT, pool wait): TPOT/TTFT
    percentiles and pool-wait mean and P99, as defined in the module docstring."""
    multi = output > 1
    tpot = np.full(output.shape[0], np.nan)
    tpot[multi] = (finish_time[multi] - first_time[multi]) / (output[multi] - 1)
    ttft = first_time - arrival
    wait = tick_time - joined
    metrics = {
        **percentiles(tpot[multi], "tpot_ms", 1e3),
        **percentiles(ttft, "ttft_s", 1.0),
        "pool_wait_mean_s": float(np.mean(wait)),
        "pool_wait_p99_s": float(np.percentile(wait, 99)),
        "kv_lease_missed": float(np.mean(wait >= KV_LEASE_S)),
    }
    return metrics, tpot, ttft, wait


def replica_loads_at(replica: NDArray, start: NDArray, finish: NDArray, prompt: NDArray,
                     steps: NDArray, num_replicas: int) -> NDArray:
    """Per-replica loads L_g(k) at the given ``steps``, rebuilt from per-request replica, start
    and finish steps: request i adds s_i + (k − start_i) for start_i ≤ k ≤ finish_i.
    Shape (len(steps), G)."""
    out = np.zeros((steps.shape[0], num_replicas))
    for j, k in enumerate(steps.tolist()):
        on = (start <= k) & (finish >= k)
        out[j] = np.bincount(replica[on], weights=prompt[on] + (k - start[on]), minlength=num_replicas)
    return out
