"""SGLang's ``GET /v1/loads``: per-rank state, one ``loads`` entry per ``dp_rank``.

Shape (SGLang 0.5.x): ``{"timestamp", "version", "loads": [{"dp_rank", "num_running_reqs",
"num_waiting_reqs", "num_used_tokens", "max_total_num_tokens", "max_running_requests",
"token_usage", "gen_throughput", ...}], "disaggregation": {...}}``. A replica that is DP rank r
reads the entry with ``dp_rank == r``; a whole-server replica the sum over its entries.
"""

from __future__ import annotations

from typing import Any

from . import EngineSample, HttpReader

__all__ = ["SglangLoadsReader", "parse_sglang_loads"]


def parse_sglang_loads(body: Any) -> dict[int, dict[str, int]]:
    """Per ``dp_rank``: ``running``, ``waiting``, ``used`` and ``budget`` (tokens) where given;
    ``ValueError`` for an answer without a ``loads`` list."""
    loads = body.get("loads") if isinstance(body, dict) else None
    if not isinstance(loads, list):
        raise ValueError("/v1/loads answered without a 'loads' list")
    out: dict[int, dict[str, int]] = {}
    keys = (("running", "num_running_reqs"), ("waiting", "num_waiting_reqs"),
            ("used", "num_used_tokens"), ("budget", "max_total_num_tokens"))
    for k, entry in enumerate(loads):
        if not isinstance(entry, dict):
            raise ValueError(f"/v1/loads entry {k} is not an object")
        rank = entry.get("dp_rank", k)
        out[int(rank)] = {name: int(entry[src]) for name, src in keys if isinstance(entry.get(src), (int, float))}
    return out


class SglangLoadsReader(HttpReader):
    """Reads one SGLang server's ``/v1/loads`` for the replicas (``targets``) it hosts."""

    source = "sglang"
    path = "/v1/loads"

    async def read(self) -> list[EngineSample]:
        """One sample per target; raises on an HTTP error, a bad answer or a missing rank."""
        resp, now = await self._get()
        ranks = parse_sglang_loads(resp.json())
        out = []
        for t in self.targets:
            rows = [ranks[t.dp_rank]] if t.dp_rank in ranks else [] if t.dp_rank is not None else list(ranks.values())
            if not rows:
                raise LookupError(f"{self.url}/v1/loads has no dp_rank {t.dp_rank}; ranks: {sorted(ranks)}")

            def total(key: str, rows: list = rows) -> int | None:
                values = [r[key] for r in rows if key in r]
                return sum(values) if len(values) == len(rows) else None

            out.append(EngineSample(t.replica, total("running"), total("waiting"), total("used"),
                                    total("budget"), now))
        return out
