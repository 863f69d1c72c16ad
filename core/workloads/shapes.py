"""Parametric workload shapes: request sets drawn from named length distributions and arrivals.

Beside the bundled traces, a *shape* generates requests from parameters and a seed
(``np.random.Generator``), so a rule can be tested on workloads it was not fitted to:

- a length distribution (:class:`Lengths`) is ``lognormal`` (median, σ), ``pareto`` (scale
  x_m, tail index α: ``x_m·(1 − u)^(−1/α)``) or a ``mixture`` of those (weights, parts: e.g.
  bimodal), capped at ``cap`` tokens;
- prompt and output lengths are coupled by a Gaussian copula with correlation ``rho`` (0:
  independent); each length is the inverse CDF of the same uniform it maps from, so ``rho`` sets
  the rank correlation whatever the marginals;
- arrivals are a renewal process at ``rate`` requests per second with inter-arrival times of
  coefficient of variation ``burst_cv`` (1: Poisson; > 1: bursty, gamma-distributed gaps);
- a shape with ``classes`` draws each request's class (its own prompt/output distributions)
  with the given weights: a mixed population.

:data:`SHAPES` names the shapes registered as workloads (``--workload shape-summarize``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from .base import Workload, WorkloadError
from .transforms import LengthBounds

__all__ = ["SHAPES", "Lengths", "Shape", "generate_shape"]

_erf = np.frompyfunc(math.erf, 1, 1)


def _phi(z: NDArray) -> NDArray[np.float64]:
    """The standard normal CDF, elementwise."""
    return 0.5 * (1.0 + _erf(z / math.sqrt(2.0)).astype(np.float64))


@dataclass(frozen=True, slots=True, kw_only=True)
class Lengths:
    """A token-length distribution, sampled by inverse CDF from a uniform u (module docstring)."""

    kind: Literal["lognormal", "pareto", "mixture"] = "lognormal"
    median: float = 500.0
    sigma: float = 1.0
    scale: float = 100.0
    alpha: float = 1.5
    weights: tuple[float, ...] = ()
    parts: tuple[Lengths, ...] = ()
    cap: int = 32_768

    def __post_init__(self) -> None:
        if self.kind not in ("lognormal", "pareto", "mixture"):
            raise ValueError(f"{self.kind=} must be 'lognormal', 'pareto' or 'mixture'")
        if not (self.median >= 1 and self.sigma >= 0 and self.scale >= 1 and self.alpha > 0):
            raise ValueError(f"{self.median=}, {self.scale=} must be >= 1, {self.sigma=} >= 0 "
                             f"and {self.alpha=} > 0")
        if self.kind == "mixture" and (len(self.weights) != len(self.parts) or not self.parts
                                       or min(self.weights) <= 0):
            raise ValueError(f"{self.weights=} must be positive, one per part")
        if self.cap < 1:
            raise ValueError(f"{self.cap=} must be >= 1")

    def quantile(self, u: NDArray[np.float64], z: NDArray[np.float64]) -> NDArray[np.float64]:
        """The length at uniform ``u`` (``z`` = Φ⁻¹(u), passed to avoid inverting Φ)."""
        if self.kind == "lognormal":
            return self.median * np.exp(self.sigma * z)
        if self.kind == "pareto":
            return self.scale * np.power(np.maximum(1.0 - u, 1e-12), -1.0 / self.alpha)
        w = np.cumsum(np.asarray(self.weights, dtype=np.float64))
        w /= w[-1]
        out = np.empty_like(u)
        lo = 0.0
        for part, hi in zip(self.parts, w, strict=True):
            inside = (u >= lo) & (u < hi) if hi < 1.0 else u >= lo
            v = np.clip((u[inside] - lo) / (hi - lo), 1e-12, 1 - 1e-12)
            out[inside] = part.quantile(v, _probit(v))
            lo = hi
        return out

    def sample(self, u: NDArray[np.float64], z: NDArray[np.float64]) -> NDArray[np.int64]:
        """Integer lengths in [1, cap] at uniforms ``u``."""
        return np.clip(np.rint(self.quantile(u, z)), 1, self.cap).astype(np.int64)


def _probit(u: NDArray[np.float64]) -> NDArray[np.float64]:
    """Φ⁻¹(u) by bisection on Φ (only the mixture's re-scaled uniforms need it)."""
    lo, hi = np.full_like(u, -9.0), np.full_like(u, 9.0)
    for _ in range(48):
        mid = 0.5 * (lo + hi)
        below = _phi(mid) < u
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """A parametric workload (module docstring): ``prompt`` and ``output`` lengths coupled by
    ``rho``; arrivals at ``rate`` req/s with gaps of CV ``burst_cv``; or ``classes`` (weight,
    shape) drawn per request (their arrivals ignored: the mixture's own ``rate``/``burst_cv``)."""

    prompt: Lengths = field(default_factory=Lengths)
    output: Lengths = field(default_factory=Lengths)
    rho: float = 0.0
    rate: float = 10.0
    burst_cv: float = 1.0
    classes: tuple[tuple[float, Shape], ...] = ()
    doc: str = ""

    def __post_init__(self) -> None:
        if not -1.0 < self.rho < 1.0:
            raise ValueError(f"{self.rho=} must be in (-1, 1)")
        if not (self.rate > 0 and self.burst_cv > 0):
            raise ValueError(f"{self.rate=} and {self.burst_cv=} must be > 0")
        if any(w <= 0 for w, _ in self.classes):
            raise ValueError("class weights must be > 0")


def _lengths(shape: Shape, n: int, rng: np.random.Generator) -> tuple[NDArray, NDArray]:
    if shape.classes:
        w = np.array([c[0] for c in shape.classes], dtype=np.float64)
        cls = rng.choice(len(shape.classes), size=n, p=w / w.sum())
        prompt = np.empty(n, np.int64)
        output = np.empty(n, np.int64)
        for j, (_, sub) in enumerate(shape.classes):
            at = np.flatnonzero(cls == j)
            prompt[at], output[at] = _lengths(sub, at.shape[0], rng)
        return prompt, output
    z1 = rng.standard_normal(n)
    z2 = shape.rho * z1 + math.sqrt(1.0 - shape.rho**2) * rng.standard_normal(n)
    u1 = np.clip(_phi(z1), 1e-12, 1 - 1e-12)
    u2 = np.clip(_phi(z2), 1e-12, 1 - 1e-12)
    return shape.prompt.sample(u1, z1), shape.output.sample(u2, z2)


def generate_shape(shape: Shape, requests: int, rng: np.random.Generator, *, name: str,
                   bounds: LengthBounds | None = None) -> Workload:
    """``requests`` requests of ``shape`` (within ``bounds``, drawing more as needed)."""
    if requests < 0:
        raise WorkloadError(f"requests must be >= 0, not {requests}")
    prompt, output = _lengths(shape, requests, rng)
    if bounds is not None and bounds.active:
        keep = bounds.mask(prompt, output)
        for _ in range(20):
            if keep.sum() >= requests:
                break
            more_p, more_o = _lengths(shape, max(requests, 64), rng)
            prompt, output = np.concatenate([prompt, more_p]), np.concatenate([output, more_o])
            keep = bounds.mask(prompt, output)
        at = np.flatnonzero(keep)[:requests]
        prompt, output = prompt[at], output[at]
    k = 1.0 / shape.burst_cv**2  # gamma gaps: mean 1/rate, CV burst_cv
    gaps = rng.gamma(k, 1.0 / (k * shape.rate), prompt.shape[0])
    arrival = np.cumsum(gaps) - gaps[0] if prompt.shape[0] else np.zeros(0)
    return Workload(name=name, prompt_len=prompt, output_len=output, arrival_s=arrival,
                    source=f"parametric shape {name} (balanceroute.core.workloads.shapes)")


def _ln(median: float, sigma: float, cap: int = 32_768) -> Lengths:
    return Lengths(kind="lognormal", median=median, sigma=sigma, cap=cap)


_CHAT = Shape(prompt=_ln(800, 1.0), output=_ln(300, 1.0))
_SUMMARIZE = Shape(prompt=_ln(3000, 0.5), output=_ln(250, 0.5))
_REASONING = Shape(prompt=_ln(500, 0.8), output=_ln(3000, 0.7, 16_384))

SHAPES: dict[str, Shape] = {
    "shape-lognormal": Shape(prompt=_ln(1000, 1.0), output=_ln(400, 1.0),
                             doc="lognormal prompts (median 1000, σ 1) and outputs (400, σ 1)"),
    "shape-bimodal": Shape(
        prompt=Lengths(kind="mixture", weights=(0.7, 0.3), parts=(_ln(300, 0.4), _ln(4000, 0.4))),
        output=Lengths(kind="mixture", weights=(0.6, 0.4), parts=(_ln(100, 0.5), _ln(1500, 0.5))),
        doc="bimodal prompts (70 % ≈300, 30 % ≈4000) and outputs (60 % ≈100, 40 % ≈1500)"),
    "shape-pareto": Shape(
        prompt=Lengths(kind="pareto", scale=200, alpha=1.5, cap=32_768),
        output=Lengths(kind="pareto", scale=100, alpha=1.3, cap=16_384),
        doc="Pareto-tailed prompts (x_m 200, α 1.5) and outputs (x_m 100, α 1.3)"),
    "shape-summarize": Shape(prompt=_SUMMARIZE.prompt, output=_SUMMARIZE.output,
                             doc="long prompt / short output: prompts ≈3000 (σ 0.5), outputs "
                                 "≈250 (σ 0.5)"),
    "shape-reasoning": Shape(prompt=_REASONING.prompt, output=_REASONING.output,
                             doc="long-output reasoning: prompts ≈500 (σ 0.8), outputs ≈3000 "
                                 "(σ 0.7, cap 16384)"),
    "shape-correlated": Shape(prompt=_ln(800, 1.0), output=_ln(400, 1.0), rho=0.7,
                              doc="lognormal prompts and outputs with rank correlation from ρ = 0.7"),
    "shape-bursty": Shape(prompt=_CHAT.prompt, output=_CHAT.output, burst_cv=3.0,
                          doc="chat lengths (prompts ≈800, outputs ≈300, σ 1) with bursty "
                              "arrivals (gamma gaps, CV 3)"),
    "shape-mixed": Shape(classes=((0.5, _CHAT), (0.3, _SUMMARIZE), (0.2, _REASONING)),
                         doc="mixed population: 50 % chat, 30 % summarization, 20 % reasoning"),
}
"""The registered shapes (``--workload NAME``); each generated at 10 req/s unless its ``rate``
says otherwise (open-loop experiments rescale arrivals to an offered load anyway)."""
