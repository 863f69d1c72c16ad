"""Sanity limits on what a run may ask for, checked once at the edge (CLI flags, trace rows).

The simulator allocates per-token and per-slot arrays, so a typo (an output of 1e12 tokens,
10⁸ replicas) would otherwise surface as a MemoryError after minutes. Every limit is a plain
field: raise one with ``--limit max_tokens=4194304`` (CLI) or ``Limits(max_tokens=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from .keyvalue import parse_key_values
from .workloads.base import Workload, WorkloadError

__all__ = ["DEFAULT_LIMITS", "Limits"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Upper bounds of a sensible run.

    ``max_tokens``: prompt and output length of one request (2²¹ = 2,097,152 tokens, above every
    released model's context); ``max_replicas``: G; ``max_slots``: B per replica;
    ``max_requests``: requests simulated in one run; ``max_pool``: the saturated pool target.
    """

    max_tokens: int = 2**21
    max_replicas: int = 4096
    max_slots: int = 65_536
    max_requests: int = 10_000_000
    max_pool: int = 1_000_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"limit {f.name}={value!r} must be an integer >= 1")

    @classmethod
    def parse(cls, items: list[str] | tuple[str, ...] | None) -> Limits:
        """From ``["max_tokens=4194304", ...]`` (each key at most once)."""
        names = [f.name for f in fields(cls)]
        values = parse_key_values(items or (), names, int, what="--limit", kind="an integer",
                                  expected=f"KEY=N with KEY one of {', '.join(names)}")
        return replace(cls(), **values) if values else cls()

    def check(self, name: str, value: int | None, what: str) -> None:
        """Raise ``ValueError`` when ``value`` exceeds the limit ``name``."""
        limit = getattr(self, name)
        if value is not None and value > limit:
            raise ValueError(f"{what} = {value:,} exceeds the sanity limit {name} = {limit:,} "
                             f"(raise it with --limit {name}=N if you mean it)")

    def check_workload(self, workload: Workload) -> None:
        """Raise :class:`WorkloadError` naming the first request longer than ``max_tokens``."""
        for column in ("prompt_len", "output_len"):
            values = getattr(workload, column)
            bad = np.flatnonzero(values > self.max_tokens)
            if bad.size:
                i = int(bad[0])
                raise WorkloadError(
                    f"{workload.name}: request {i + 1} (of {len(workload):,}): {column} "
                    f"{int(values[i]):,} exceeds the sanity limit max_tokens = {self.max_tokens:,} "
                    "(raise it with --limit max_tokens=N if you mean it)")


DEFAULT_LIMITS = Limits()
"""The limits every command applies unless told otherwise."""
