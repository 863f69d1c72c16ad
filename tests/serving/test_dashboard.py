"""The Grafana dashboard (docs/grafana/balanceroute-proxy.json) queries only metrics the proxy
exports, and is the JSON its generator writes."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import sys
from pathlib import Path

import httpx
import pytest

from .conftest import mock_proxy, pd_config
from .test_proxy_unit import Recorder

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "balanceroute-proxy.json"
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def _base(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _queried(dashboard: dict) -> dict[str, set[str]]:
    """Panel title → the metric names its PromQL expressions name (series suffixes dropped)."""
    out: dict[str, set[str]] = {}
    for panel in dashboard["panels"]:
        names = set()
        for target in panel.get("targets", []):
            names |= {_base(n) for n in re.findall(r"\b(balanceroute_[a-z0-9_]+)", target["expr"])}
        out[panel["title"]] = names
    return out


def _exported(text: str) -> set[str]:
    return {_base(n) for n in re.findall(r"^# TYPE (balanceroute_[a-z0-9_]+) ", text, re.M)}


class _WithEngineMetrics(Recorder):
    """The mock upstream, also answering the engines' ``GET /metrics`` (empty: no report)."""

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == "/metrics":
            return httpx.Response(200, text="")
        return await super().__call__(request)


async def _scrape() -> set[str]:
    """Every metric family the proxy exports: with the defaults, and with the optional signals
    the dashboard also charts (engine-reported state, the speed fit) switched on."""
    exported: set[str] = set()
    for overrides in ({}, {"engine_state": "vllm", "speed_fit": True}):
        async with mock_proxy(pd_config(**overrides), _WithEngineMetrics()) as (client, _):
            await asyncio.gather(*(client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
                                   for _ in range(4)))
            exported |= _exported((await client.get("/metrics")).text)
    return exported


async def test_every_dashboard_query_names_an_exported_metric() -> None:
    exported = await _scrape()
    queried = _queried(json.loads(DASHBOARD.read_text(encoding="utf-8")))
    assert len(queried) >= 10 and all(queried.values())
    missing = {title: names - exported for title, names in queried.items() if names - exported}
    assert not missing, f"queried but not exported: {missing}; exported: {sorted(exported)}"
    for needed in ("balanceroute_barrier_idle_fraction", "balanceroute_imbalance_tokens",
                   "balanceroute_replica_kv_load_tokens", "balanceroute_pool_size",
                   "balanceroute_pool_oldest_wait_seconds", "balanceroute_ttft_seconds",
                   "balanceroute_tpot_seconds", "balanceroute_ejections", "balanceroute_tick_seconds",
                   "balanceroute_replica_step_a_seconds_per_token"):
        assert any(needed in names for names in queried.values()), needed


async def test_the_check_catches_a_metric_the_proxy_does_not_export() -> None:
    exported = await _scrape()
    fake = {"panels": [{"title": "t", "targets": [{"expr": "rate(balanceroute_no_such_metric_total[1m])"}]}]}
    assert _queried(fake)["t"] - exported == {"balanceroute_no_such_metric"}


def test_the_committed_json_is_what_the_generator_writes() -> None:
    spec = importlib.util.spec_from_file_location("br_dashboard", ROOT / "docs" / "grafana" / "dashboard.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    assert json.loads(DASHBOARD.read_text(encoding="utf-8")) == module.dashboard()
