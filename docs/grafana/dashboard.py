"""The proxy's Grafana dashboard, written from one list of panels.

``python docs/grafana/dashboard.py`` rewrites ``balanceroute-proxy.json`` (import it in Grafana:
Dashboards → New → Import; pick your Prometheus data source). Each panel's targets carry the
PromQL Grafana runs *and* the same quantity as a small local recipe, which ``render_panels.py``
evaluates on scraped ``/metrics`` samples to draw the screenshot in the docs — so the picture and
the dashboard cannot drift apart. ``tests/analysis/test_frontdoor.py`` checks that every query
names a metric the proxy exports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "balanceroute-proxy.json"
SEL = '{instance=~"$instance"}'


@dataclass(frozen=True, slots=True)
class Target:
    """One query: PromQL for Grafana, a legend, and the local recipe for the screenshot —
    ``("gauge", name)``, ``("per_replica", name)``, ``("rate", name)`` (per second over the
    window, summed over labels), ``("rate_by", name, label)``, ``("rate_where", name, label, value)`` (the series with that
    label value only), ``("quantile", histogram, q)``; ``("none",)``: not drawn."""

    expr: str
    legend: str
    local: tuple


@dataclass(frozen=True, slots=True)
class Panel:
    """A time-series panel: title, unit (Grafana's unit id), description, targets, width."""

    title: str
    unit: str
    description: str
    targets: tuple[Target, ...]
    width: int = 12


def _q(hist: str, q: float) -> Target:
    return Target(f"histogram_quantile({q}, sum by (le) (rate({hist}_bucket{SEL}[$__rate_interval])))",
                  f"P{round(100 * q)}", ("quantile", hist, q))


PANELS: tuple[Panel, ...] = (
    Panel("Barrier idle share I / (G·M)", "percentunit",
          "The share of the decode barrier's token capacity idle right now: I = G·M − Σ L over G·M, "
          "on the proxy's KV-load view. BalanceRoute exists to keep this low.",
          (Target(f"balanceroute_barrier_idle_fraction{SEL}", "idle share",
                  ("gauge", "balanceroute_barrier_idle_fraction")),)),
    Panel("Imbalance I(k) and envelope M(k)", "none",
          "I = G·max_g L_g − Σ_g L_g (token-steps lost at the barrier per step) and M = max_g L_g.",
          (Target(f"balanceroute_imbalance_tokens{SEL}", "I (tokens)",
                  ("gauge", "balanceroute_imbalance_tokens")),
           Target(f"balanceroute_envelope_tokens{SEL}", "M (tokens)",
                  ("gauge", "balanceroute_envelope_tokens")))),
    Panel("KV load per replica L_g", "none",
          "KV tokens (prompt + generated) the proxy has placed on each decode replica.",
          (Target(f"balanceroute_replica_kv_load_tokens{SEL}", "replica {{replica}}",
                  ("per_replica", "balanceroute_replica_kv_load_tokens")),)),
    Panel("Running requests per replica n_g", "none",
          "Requests decoding on each replica (the slots in use).",
          (Target(f"balanceroute_replica_running{SEL}", "replica {{replica}}",
                  ("per_replica", "balanceroute_replica_running")),)),
    Panel("Replica speed: fitted step cost per KV token a_g", "s",
          "The speed fit's per-KV-token step cost a_g of each decode replica (τ_g = b_g + a_g·L_g "
          "+ c_g·n_g); a slower replica has a larger a_g. Needs speed_fit = true in the config.",
          (Target(f"balanceroute_replica_step_a_seconds_per_token{SEL}", "replica {{replica}}",
                  ("per_replica", "balanceroute_replica_step_a_seconds_per_token")),)),
    Panel("Replica speed: fitted fixed step time b_g", "s",
          "The speed fit's fixed part b_g of each replica's step time. Needs speed_fit = true.",
          (Target(f"balanceroute_replica_step_b_seconds{SEL}", "replica {{replica}}",
                  ("per_replica", "balanceroute_replica_step_b_seconds")),)),
    Panel("Engine-reported load beyond this proxy's", "none",
          "KV tokens each decode engine reports beyond what this proxy placed (other clients, a "
          "second proxy, before a restart); 0 while the report is stale. Needs engine_state.",
          (Target(f"balanceroute_replica_foreign_kv_load_tokens{SEL}", "replica {{replica}}",
                  ("per_replica", "balanceroute_replica_foreign_kv_load_tokens")),)),
    Panel("Engine report age and KV budget", "s",
          "Age of each replica's last engine report (a report is trusted for three poll periods); "
          "the budget the engine reports is in the table view. Needs engine_state.",
          (Target(f"balanceroute_replica_engine_report_age_seconds{SEL}", "replica {{replica}}",
                  ("per_replica", "balanceroute_replica_engine_report_age_seconds")),
           Target(f"balanceroute_replica_kv_budget_tokens{SEL}", "budget, replica {{replica}}",
                  ("none",)))),
    Panel("Pool size", "none", "Prefilled requests waiting for a decode slot.",
          (Target(f"balanceroute_pool_size{SEL}", "pooled", ("gauge", "balanceroute_pool_size")),
           Target(f"balanceroute_prefilling{SEL}", "prefilling", ("gauge", "balanceroute_prefilling"))),
          width=8),
    Panel("Oldest pooled request", "s",
          "Age of the oldest request in the pool; the KV lease bounds it (a request past it is "
          "prefilled again or failed).",
          (Target(f"balanceroute_pool_oldest_wait_seconds{SEL}", "oldest wait",
                  ("gauge", "balanceroute_pool_oldest_wait_seconds")),), width=8),
    Panel("Relayed tokens per second", "short", "Completion tokens relayed to clients per second.",
          (Target(f"rate(balanceroute_relayed_tokens_total{SEL}[$__rate_interval])", "tokens/s",
                  ("rate", "balanceroute_relayed_tokens_total")),), width=8),
    Panel("Time to first token", "s", "From acceptance to the first decoded token (histogram).",
          (_q("balanceroute_ttft_seconds", 0.5), _q("balanceroute_ttft_seconds", 0.99)), width=8),
    Panel("Time per output token", "s",
          "Per request that ended ok: (end − first token) / tokens after the first (histogram).",
          (_q("balanceroute_tpot_seconds", 0.5), _q("balanceroute_tpot_seconds", 0.99)), width=8),
    Panel("Pool wait", "s", "From prefill done to a decode slot (histogram).",
          (_q("balanceroute_pool_wait_seconds", 0.5), _q("balanceroute_pool_wait_seconds", 0.99)),
          width=8),
    Panel("Scheduling tick duration", "s", "Tick duration (policy included), P50 and P99.",
          (_q("balanceroute_tick_seconds", 0.5), _q("balanceroute_tick_seconds", 0.99)), width=8),
    Panel("Scheduling ticks per second", "short", "Ticks run per second (one per decode step "
          "the pool and free slots call for).",
          (Target(f"rate(balanceroute_tick_seconds_count{SEL}[$__rate_interval])", "ticks/s",
                  ("rate", "balanceroute_tick_seconds_count")),), width=8),
    Panel("Requests ended, by outcome", "reqps", "Requests per second by how they ended.",
          (Target(f"sum by (outcome) (rate(balanceroute_requests_total{SEL}[$__rate_interval]))",
                  "{{outcome}}", ("rate_by", "balanceroute_requests_total", "outcome")),), width=8),
    Panel("Ejections and health", "none",
          "Outlier ejections per stage and reason (increase over 5 min), replicas ejected now, "
          "panic mode, policy errors.",
          (Target(f"sum by (stage, reason) (increase(balanceroute_ejections_total{SEL}[5m]))",
                  "ejected: {{stage}} {{reason}}", ("rate_by", "balanceroute_ejections_total", "reason")),
           Target(f"sum(balanceroute_replica_ejected{SEL})", "replicas ejected now",
                  ("gauge_sum", "balanceroute_replica_ejected")),
           Target(f"balanceroute_panic{SEL}", "panic", ("gauge", "balanceroute_panic")),
           Target(f"balanceroute_policy_errors{SEL}", "policy errors (ticks)",
                  ("gauge", "balanceroute_policy_errors")))),
    Panel("Errors, retries and engine reads", "reqps",
          "Errors by kind, upstream attempts retried by stage, poison requests, and engine-state "
          "reads that failed (per second).",
          (Target(f"sum by (kind) (rate(balanceroute_errors_total{SEL}[$__rate_interval]))",
                  "error: {{kind}}", ("rate_by", "balanceroute_errors_total", "kind")),
           Target(f"sum by (stage) (rate(balanceroute_retries_total{SEL}[$__rate_interval]))",
                  "retry: {{stage}}", ("rate_by", "balanceroute_retries_total", "stage")),
           Target(f"sum(rate(balanceroute_poison_requests_total{SEL}[$__rate_interval]))",
                  "poison requests", ("rate", "balanceroute_poison_requests_total")),
           Target('sum(rate(balanceroute_engine_reads_total{instance=~"$instance", result="failed"}'
                  "[$__rate_interval]))", "engine reads failed",
                  ("rate_where", "balanceroute_engine_reads_total", "result", "failed")))),
    Panel("Replicas in service", "none", "Decode replicas available (1) per replica, and prefill readiness.",
          (Target(f"balanceroute_replica_available{SEL}", "replica {{replica}}",
                  ("per_replica", "balanceroute_replica_available")),
           Target(f"balanceroute_prefill_ready{SEL}", "prefill ready",
                  ("gauge", "balanceroute_prefill_ready")))),
)
"""The dashboard's panels, in reading order (rows of 24 grid units)."""


def dashboard() -> dict:
    """The Grafana dashboard model (schema 39) of :data:`PANELS`."""
    panels, x, y, row_h = [], 0, 0, 8
    for i, p in enumerate(PANELS):
        if x + p.width > 24:
            x, y = 0, y + row_h
        targets = [{"datasource": {"type": "prometheus", "uid": "${datasource}"}, "expr": t.expr,
                    "legendFormat": t.legend, "refId": chr(ord("A") + j)}
                   for j, t in enumerate(p.targets)]
        panels.append({
            "id": i + 1, "type": "timeseries", "title": p.title, "description": p.description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": row_h, "w": p.width, "x": x, "y": y},
            "fieldConfig": {"defaults": {"unit": p.unit, "custom": {"lineWidth": 1, "fillOpacity": 5}},
                            "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                        "tooltip": {"mode": "multi"}},
            "targets": targets,
        })
        x += p.width
    return {
        "title": "BalanceRoute proxy", "uid": "balanceroute-proxy", "schemaVersion": 39,
        "tags": ["balanceroute", "llm", "vllm"], "timezone": "browser", "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"}, "editable": True,
        "description": "The balanceroute serve proxy: the decode barrier (I, idle share), per-replica "
                       "loads, the pool, TTFT/TPOT, ticks and outlier ejections.",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "instance", "type": "query", "label": "proxy",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": "label_values(balanceroute_pool_size, instance)", "refId": "instance"},
             "definition": "label_values(balanceroute_pool_size, instance)",
             "includeAll": True, "multi": True, "refresh": 2},
        ]},
        "panels": panels,
    }


def main() -> None:
    """Write ``balanceroute-proxy.json`` next to this file."""
    OUT.write_text(json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(OUT)


if __name__ == "__main__":
    main()
