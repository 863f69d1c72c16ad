"""Workload transforms: length filters, truncation, length clipping and rate scaling.

Each returns a new :class:`Workload`; the input is never modified. Length bounds are inclusive:
"outputs > 1000" is ``min_output=1001``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from .base import Workload, WorkloadError

__all__ = ["LengthBounds", "clip_lengths", "filter_lengths", "head", "scale_rate"]


@dataclass(frozen=True)
class LengthBounds:
    """Inclusive bounds on prompt and output lengths (``None``: unbounded)."""

    min_prompt: int | None = None
    max_prompt: int | None = None
    min_output: int | None = None
    max_output: int | None = None

    def __post_init__(self) -> None:
        """Reject a minimum above its maximum."""
        for kind in ("prompt", "output"):
            lo, hi = getattr(self, f"min_{kind}"), getattr(self, f"max_{kind}")
            if lo is not None and hi is not None and lo > hi:
                raise WorkloadError(f"min_{kind}={lo} exceeds max_{kind}={hi}")

    @property
    def active(self) -> bool:
        """Whether any bound is set."""
        return any(v is not None for v in vars(self).values())

    def mask(self, prompt: NDArray[np.int64], output: NDArray[np.int64]) -> NDArray[np.bool_]:
        """Which requests satisfy every bound."""
        keep = np.ones(prompt.shape, dtype=bool)
        for values, lo, hi in (
            (prompt, self.min_prompt, self.max_prompt),
            (output, self.min_output, self.max_output),
        ):
            if lo is not None:
                keep &= values >= lo
            if hi is not None:
                keep &= values <= hi
        return keep

    def describe(self) -> str:
        """The bounds as text, e.g. ``"output >= 1001"`` (empty if none)."""
        parts = []
        for key, value in vars(self).items():
            if value is not None:
                side, kind = key.split("_")
                parts.append(f"{kind} {'>=' if side == 'min' else '<='} {value}")
        return ", ".join(parts)


def filter_lengths(
    workload: Workload,
    bounds: LengthBounds | None = None,
    *,
    min_prompt: int | None = None,
    max_prompt: int | None = None,
    min_output: int | None = None,
    max_output: int | None = None,
) -> Workload:
    """The requests within ``bounds`` (or the keyword bounds), in their original order and times."""
    if bounds is None:
        bounds = LengthBounds(min_prompt, max_prompt, min_output, max_output)
    if not bounds.active:
        return workload
    return workload.take(bounds.mask(workload.prompt_len, workload.output_len))


def head(workload: Workload, n: int) -> Workload:
    """The first ``n`` requests (all of them if there are fewer)."""
    if n < 0:
        raise WorkloadError(f"cannot take {n} requests")
    return workload.take(np.arange(min(n, len(workload))))


def clip_lengths(
    workload: Workload, *, max_prompt: int | None = None, max_output: int | None = None
) -> Workload:
    """Lengths capped at ``max_prompt`` / ``max_output`` (requests are kept, not dropped)."""
    for key, cap in (("max_prompt", max_prompt), ("max_output", max_output)):
        if cap is not None and cap < 1:
            raise WorkloadError(f"{key} must be >= 1, not {cap}")
    prompt, output = workload.prompt_len, workload.output_len
    return replace(
        workload,
        prompt_len=prompt if max_prompt is None else np.minimum(prompt, max_prompt),
        output_len=output if max_output is None else np.minimum(output, max_output),
    )


def scale_rate(workload: Workload, factor: float) -> Workload:
    """Arrival rate multiplied by ``factor``: ``arrival_s / factor`` (factor 2 = twice as fast)."""
    if not np.isfinite(factor) or factor <= 0:
        raise WorkloadError(f"rate scale factor must be a positive number, not {factor!r}")
    if workload.arrival_s is None:
        if factor == 1:
            return workload
        raise WorkloadError(f"{workload.name}: has no arrival times to rate-scale")
    return replace(workload, arrival_s=workload.arrival_s / factor)
