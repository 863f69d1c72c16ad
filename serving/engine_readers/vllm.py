"""vLLM's ``/metrics``: per-rank state from the gauges labelled by ``engine``.

Read: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
(a fraction: 1 means full; the v0 name ``vllm:gpu_cache_usage_perc`` too) and
``vllm:cache_config_info`` (labels ``num_gpu_blocks`` and ``block_size``: the KV budget in
tokens). A replica that is DP rank r of a server reads ``engine="r"``; a replica that is a whole
server reads its only engine (or the sum of its engines). Only the lines of these families are
parsed (prometheus_client's text parser), so a scrape costs little beside the histograms.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from . import EngineSample, HttpReader, Target

__all__ = ["VllmMetricsReader", "parse_vllm_metrics"]

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_CACHE = "vllm:cache_config_info"
_WANTED = (_RUNNING, _WAITING, *_USAGE, _CACHE)


def parse_vllm_metrics(text: str) -> dict[str, dict[str, float]]:
    """Per ``engine`` label: ``running``, ``waiting``, ``usage`` (fraction) and ``budget``
    (tokens) where exported. Engines without a label are ``""``."""
    lines = "\n".join(line for line in text.splitlines()
                      if line.startswith(_WANTED) and line.split("{", 1)[0].split(" ", 1)[0] in _WANTED)
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(lines + "\n"):
        for s in family.samples:
            engine = s.labels.get("engine", "")
            row = out.setdefault(engine, {})
            if s.name == _RUNNING:
                row["running"] = s.value
            elif s.name == _WAITING:
                row["waiting"] = s.value
            elif s.name in _USAGE:
                row.setdefault("usage", s.value)
            elif s.name == _CACHE:
                try:
                    blocks, size = int(s.labels["num_gpu_blocks"]), int(s.labels["block_size"])
                except (KeyError, ValueError):
                    continue
                row["budget"] = float(blocks * size)
                row["block"] = float(size)
    return out


def _int(value: float | None) -> int | None:
    return None if value is None or not math.isfinite(value) else int(round(value))


class VllmMetricsReader(HttpReader):
    """Reads one vLLM server's ``/metrics`` for the replicas (``targets``) it hosts."""

    source = "vllm"
    path = "/metrics"

    async def read(self) -> list[EngineSample]:
        """One sample per target; raises on an HTTP error, a bad answer or a missing engine."""
        resp, now = await self._get()
        engines = parse_vllm_metrics(resp.text)
        return [self._sample(t, engines, now) for t in self.targets]

    def _sample(self, target: Target, engines: dict[str, dict[str, float]], now: float) -> EngineSample:
        if target.dp_rank is not None:
            rows = [engines[str(target.dp_rank)]] if str(target.dp_rank) in engines else []
        else:
            rows = list(engines.values())
        if not rows or not any("running" in r for r in rows):
            raise LookupError(f"{self.url}/metrics has no {_RUNNING} for engine "
                              f"{target.dp_rank if target.dp_rank is not None else '(any)'}; "
                              f"engines seen: {sorted(engines)}")

        def total(key: str) -> float | None:
            values = [r[key] for r in rows if key in r]
            return sum(values) if len(values) == len(rows) else None

        budget = total("budget")
        used = (sum(r["usage"] * r["budget"] for r in rows)
                if all("usage" in r and "budget" in r for r in rows) else None)
        block = max((r["block"] for r in rows), default=None) if all("block" in r for r in rows) else None
        return EngineSample(target.replica, _int(total("running")), _int(total("waiting")),
                            _int(used), _int(budget), now, _int(block))
