"""The proxy's own ledger as a reader: what this proxy sent, exact and always fresh."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..ledger import Ledger
from . import EngineSample

__all__ = ["LedgerReader"]


class LedgerReader:
    """Samples of the ledger's loads and running counts (no budget: the ledger has none)."""

    source = "ledger"
    server = -1

    def __init__(self, ledger: Ledger, clock: Callable[[], float] = time.monotonic) -> None:
        self.ledger = ledger
        self.clock = clock

    async def read(self) -> list[EngineSample]:
        """One sample per replica, now."""
        return self.sample()

    def sample(self) -> list[EngineSample]:
        """As :meth:`read`, synchronously."""
        now, led = self.clock(), self.ledger
        return [EngineSample(g, int(led.num_active[g]), 0, int(led.loads[g]), None, now)
                for g in range(led.num_replicas)]
