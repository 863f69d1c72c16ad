"""The workload contract: a table of requests as numpy columns."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

__all__ = ["Workload", "WorkloadError"]


class WorkloadError(ValueError):
    """A trace file or workload specification that cannot be used; the message names the
    file, line and field where there is one."""


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests in trace order.

    ``prompt_len`` s_i ≥ 1 and ``output_len`` o_i ≥ 1 (tokens); ``arrival_s`` seconds from the
    start, non-decreasing (``None``: the source has no timestamps, only saturated mode applies);
    ``prefix_hash`` an integer identity of the prompt or its prefix (equal values = repeated
    prompt; ``None`` where the source has none); ``client`` an integer client id (or ``None``).
    ``source`` is the citation of the data it comes from.
    """

    name: str
    prompt_len: NDArray[np.int64]
    output_len: NDArray[np.int64]
    arrival_s: NDArray[np.float64] | None = None
    prefix_hash: NDArray[np.int64] | None = None
    client: NDArray[np.int64] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        n = self.prompt_len.shape[0]
        for col in ("output_len", "arrival_s", "prefix_hash", "client"):
            arr = getattr(self, col)
            if arr is not None and arr.shape != (n,):
                raise WorkloadError(f"{self.name}: column {col} has shape {arr.shape}, expected ({n},)")
        if n and (self.prompt_len.min() < 1 or self.output_len.min() < 1):
            raise WorkloadError(f"{self.name}: prompt and output lengths must be >= 1")

    def __len__(self) -> int:
        return int(self.prompt_len.shape[0])

    def take(self, index: NDArray) -> Workload:
        """The rows ``index`` (a boolean mask or integer positions), in that order."""

        def pick(a: NDArray | None) -> NDArray | None:
            return None if a is None else a[index]

        return replace(
            self,
            prompt_len=self.prompt_len[index],
            output_len=self.output_len[index],
            arrival_s=pick(self.arrival_s),
            prefix_hash=pick(self.prefix_hash),
            client=pick(self.client),
        )
