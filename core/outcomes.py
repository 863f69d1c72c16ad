"""Per-request outcome columns that both simulation loops (generic and fused) fill in."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["RequestColumns"]


@dataclass(slots=True)
class RequestColumns:
    """Replica, start/finish step, and the times a request joined the pool, was placed, got its
    first token and finished; −1 / NaN until it happens."""

    replica: NDArray[np.int64]
    start: NDArray[np.int64]
    finish: NDArray[np.int64]
    joined: NDArray[np.float64]
    tick_time: NDArray[np.float64]
    first_time: NDArray[np.float64]
    finish_time: NDArray[np.float64]

    @classmethod
    def empty(cls, ready: NDArray[np.float64]) -> RequestColumns:
        """Columns for ``len(ready)`` requests; ``joined`` starts as the ready times (NaN in
        saturated mode, set when each request joins the pool)."""
        n = ready.shape[0]
        return cls(
            replica=np.full(n, -1, dtype=np.int64),
            start=np.full(n, -1, dtype=np.int64),
            finish=np.full(n, -1, dtype=np.int64),
            joined=np.array(ready, dtype=np.float64, copy=True),
            tick_time=np.full(n, np.nan),
            first_time=np.full(n, np.nan),
            finish_time=np.full(n, np.nan),
        )

    def arrays(self) -> tuple[NDArray, ...]:
        """The seven columns in field order (the compiled loop's argument order)."""
        return (self.replica, self.start, self.finish, self.joined, self.tick_time,
                self.first_time, self.finish_time)
