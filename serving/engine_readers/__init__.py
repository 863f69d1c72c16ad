"""Readers of engine-reported per-replica state, one small module per source, one contract.

A reader's ``async read() -> list[EngineSample]`` returns what the engines behind it report
now, one :class:`EngineSample` per decode replica it covers (a replica is a whole server or one
DP rank of one), and raises on any failure: the caller (:class:`~balanceroute.serving.signals.Signals`)
counts it and keeps the replica on the proxy's own ledger until a fresh sample comes. Sources:

* :mod:`.ledger` — the proxy's own ledger (what it sent; always fresh);
* :mod:`.vllm` — vLLM's ``/metrics`` (gauges per ``engine`` label);
* :mod:`.sglang` — SGLang's ``GET /v1/loads`` (one entry per ``dp_rank``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx

__all__ = ["EngineReader", "EngineSample", "HttpReader", "Target", "group_targets"]


@dataclass(frozen=True, slots=True)
class EngineSample:
    """What one decode replica's engine reported.

    ``replica`` is the index in the proxy's decode list (DP rank resolved); ``running`` and
    ``waiting`` are request counts; ``kv_tokens`` the KV tokens in use (vLLM:
    ``kv_cache_usage_perc`` × the budget, so block-granular); ``kv_budget`` the KV token capacity
    (vLLM ``num_gpu_blocks × block_size``, SGLang ``max_total_num_tokens``); ``kv_block`` the
    tokens of one KV block, allocated whole per request (vLLM ``block_size``); ``None`` where the
    source does not say. ``taken_at`` is the proxy's monotonic clock when the answer came.
    """

    replica: int
    running: int | None
    waiting: int | None
    kv_tokens: int | None
    kv_budget: int | None
    taken_at: float
    kv_block: int | None = None


@dataclass(frozen=True, slots=True)
class Target:
    """One replica a reader covers: its index and its DP rank on the server (``None``: the
    whole server is the replica)."""

    replica: int
    dp_rank: int | None


class EngineReader(Protocol):
    """The reader contract: ``source`` names the kind (``"vllm"``, ``"sglang"``, ``"ledger"``),
    ``server`` the server it reads (an index, for metric labels)."""

    source: str
    server: int

    async def read(self) -> list[EngineSample]:
        """The current samples of every replica this reader covers; raises on failure."""
        ...


class HttpReader:
    """What the HTTP readers share: one server (``url``), the replicas it hosts (``targets``),
    one GET with a timeout and the time its answer came (the sample's age starts there)."""

    source = "http"
    path = "/"

    def __init__(self, client: httpx.AsyncClient, url: str, targets: Sequence[Target], *, server: int = 0,
                 headers: dict[str, str] | None = None, timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.url, self.targets = client, url.rstrip("/"), list(targets)
        self.server, self.headers, self.timeout_s, self.clock = server, headers or {}, timeout_s, clock

    async def _get(self) -> tuple[httpx.Response, float]:
        """GET ``url + path``; raises on an HTTP error; the answer and the clock when it came."""
        resp = await self.client.get(self.url + self.path, headers=self.headers, timeout=self.timeout_s)
        resp.raise_for_status()
        return resp, self.clock()


def group_targets(replicas: Sequence[tuple[str, int | None]]) -> dict[str, list[Target]]:
    """Decode replicas (url, dp_rank) grouped by server url, in first-seen order."""
    out: dict[str, list[Target]] = {}
    for g, (url, rank) in enumerate(replicas):
        out.setdefault(url, []).append(Target(g, rank))
    return out
