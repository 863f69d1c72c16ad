"""Prometheus metrics of the proxy (one registry per app, so several apps can share a process).

Counters and histograms are updated as things happen; the gauges (pool, per-replica KV load
and running count, imbalance I = G·M − Σ L as the proxy sees it) are read from the ledger at
scrape time. Replicas are labelled by index; with ``replica_labels`` (the config's
``metrics_urls``) also by URL.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from .ledger import Ledger

__all__ = ["CONTENT_TYPE_LATEST", "ProxyMetrics"]

_TICK_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1)
_TPOT_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.045, 0.05, 0.06, 0.07, 0.08,
                 0.1, 0.15, 0.2, 0.3, 0.5, 1)
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _LedgerCollector:
    def __init__(self, metrics: ProxyMetrics, ledger: Ledger, labels: list[str] | None,
                 extra: Callable[[], dict[str, Any]]) -> None:
        self.metrics = metrics
        self.ledger = ledger
        self.labels = labels
        self.extra = extra

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        led = self.ledger
        yield GaugeMetricFamily("balanceroute_pool_size", "Prefilled requests waiting for a decode slot.",
                                value=len(led.pool))
        yield GaugeMetricFamily("balanceroute_prefilling", "Accepted requests in the prefill stage.",
                                value=led.prefilling)
        yield GaugeMetricFamily("balanceroute_in_flight", "Accepted requests that have not ended.",
                                value=led.in_flight)
        yield GaugeMetricFamily("balanceroute_imbalance_tokens",
                                "I = G*max_g L_g - sum_g L_g on the proxy's KV-load view.",
                                value=led.imbalance())
        yield GaugeMetricFamily("balanceroute_envelope_tokens", "M = max_g L_g.",
                                value=int(led.loads.max()))
        capacity = len(led.loads) * int(led.loads.max())
        yield GaugeMetricFamily("balanceroute_barrier_idle_fraction",
                                "I / (G*M): the share of the barrier's token capacity idle now.",
                                value=led.imbalance() / capacity if capacity else 0.0)
        now = time.monotonic()
        yield GaugeMetricFamily("balanceroute_pool_oldest_wait_seconds",
                                "Age of the oldest pooled request (0 when the pool is empty).",
                                value=max((now - t.joined for t in led.pool), default=0.0))
        per = [
            ("balanceroute_replica_kv_load_tokens", "L_g: KV tokens (prompt + generated) on replica g.", led.loads),
            ("balanceroute_replica_running", "n_g: requests decoding on replica g.", led.num_active),
            ("balanceroute_replica_free_slots", "Free slots the policy sees (0 when out of service).", led.free_slots()),
            ("balanceroute_replica_available", "1 if replica g is in service.", led.available.astype(int)),
        ]
        yield CounterMetricFamily("balanceroute_relayed_tokens", "Completion tokens relayed to clients.",
                                  value=led.relayed)
        for name, (doc, value) in self.extra().items():
            if isinstance(value, list):
                per.append((name, doc, value))
            else:
                yield GaugeMetricFamily(name, doc, value=value)
        for name, doc, values in per:
            fam = GaugeMetricFamily(name, doc, labels=["replica", "url"] if self.labels else ["replica"])
            for g, value in enumerate(values if isinstance(values, list) else values.tolist()):
                fam.add_metric([str(g), self.labels[g]] if self.labels else [str(g)], value)
            yield fam


class _Labelled:
    """A labelled metric whose ``labels(...)`` children are kept: prometheus_client looks each
    one up under a lock per call, and the request path asks for the same few per request."""

    __slots__ = ("metric", "_children")

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


class ProxyMetrics:
    """The proxy's metric families on their own :class:`CollectorRegistry`."""

    def __init__(self, ledger: Ledger, replica_labels: list[str] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = _Labelled(Counter("balanceroute_requests", "Requests ended, by endpoint and outcome.",
                                          ["endpoint", "outcome"], registry=self.registry))
        self.accepted = _Labelled(Counter("balanceroute_requests_accepted", "Requests accepted into the pool path.",
                                          ["endpoint"], registry=self.registry))
        self.errors = _Labelled(Counter("balanceroute_errors", "Errors by kind.", ["kind"], registry=self.registry))
        self.retries = _Labelled(Counter("balanceroute_retries", "Upstream attempts retried, by stage.", ["stage"],
                                         registry=self.registry))
        self.tick = Histogram("balanceroute_tick_seconds", "Duration of a scheduling tick (policy included).",
                              buckets=_TICK_BUCKETS, registry=self.registry)
        self.pool_wait = Histogram("balanceroute_pool_wait_seconds", "Time from prefill done to decode slot.",
                                   buckets=_WAIT_BUCKETS, registry=self.registry)
        self.ttft = Histogram("balanceroute_ttft_seconds", "Time from acceptance to the first decoded token.",
                              buckets=_WAIT_BUCKETS, registry=self.registry)
        self.tpot = Histogram("balanceroute_tpot_seconds", "Mean time per output token after the first, "
                              "one observation per request that ended ok.", buckets=_TPOT_BUCKETS,
                              registry=self.registry)
        self.engine_reads = _Labelled(Counter(
            "balanceroute_engine_reads", "Engine-state reads (docs/engine-state.md) by source, server and "
            "result (ok / failed; a failed read leaves the server's replicas on the ledger once their last "
            "report is stale).", ["source", "server", "result"], registry=self.registry))
        self.ejections = _Labelled(Counter("balanceroute_ejections", "Outlier ejections, by stage and reason.",
                                           ["stage", "reason"], registry=self.registry))
        self.poison = _Labelled(Counter("balanceroute_poison_requests", "Requests that failed on several hosts "
                                        "(their failures eject nobody), by stage.", ["stage"],
                                        registry=self.registry))
        self.loop_stalls = Counter("balanceroute_loop_stalls", "Times the event loop ran over 1 s late (every "
                                   "stream waited; docs/operator.md, loop lag).", registry=self.registry)
        self._ledger, self._labels = ledger, replica_labels

    @property
    def relayed_tokens(self) -> int:
        """Completion tokens relayed to clients: counted by the ledger as a_i grows (per token on
        the hot path, a plain int), exported at scrape time."""
        return self._ledger.relayed

    def register_gauges(self, extra: Callable[[], dict[str, Any]] = dict) -> None:
        """Add the gauges read at scrape time: the ledger's, and ``extra()`` — name → (doc,
        value), a list value being one per replica."""
        self.registry.register(_LedgerCollector(self, self._ledger, self._labels, extra))

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
