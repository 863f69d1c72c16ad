"""Engine-reported state: the readers (vLLM ``/metrics``, SGLang ``/v1/loads``), the
reconciliation in :mod:`balanceroute.serving.signals`, a proxy restarted in front of a busy
group, and two proxies in front of one group (docs/engine-state.md)."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from balanceroute.core.state import ClusterState
from balanceroute.serving.engine_readers import EngineSample, Target
from balanceroute.serving.engine_readers.sglang import SglangLoadsReader, parse_sglang_loads
from balanceroute.serving.engine_readers.vllm import VllmMetricsReader, parse_vllm_metrics
from balanceroute.serving.ledger import Ledger
from balanceroute.serving.signals import Signals

from .conftest import (
    assert_drained,
    mock_proxy,
    pd_config,
    prefill_reply,
    running_emulator,
    running_proxy,
    sse_stream,
    wait_until,
)

# What a vLLM 0.x server with --data-parallel-size 2 exports (trimmed: the families read, a
# histogram and a counter around them, HELP/TYPE lines as vLLM writes them).
VLLM_DP2 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny-llama"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 2.0
vllm:num_requests_waiting{engine="1",model_name="tiny-llama"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny-llama"} 0.0625
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="4096"} 1.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="1",num_gpu_blocks="4096"} 1.0
# HELP vllm:num_requests_running_extra not ours
vllm:num_requests_running_extra{engine="0"} 99.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 1234.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny-llama"} 0.0
"""


def test_vllm_metrics_parse_per_engine() -> None:
    engines = parse_vllm_metrics(VLLM_DP2)
    assert engines == {"0": {"running": 3, "waiting": 2, "usage": 0.25, "budget": 65536, "block": 16},
                       "1": {"running": 1, "waiting": 0, "usage": 0.0625, "budget": 65536, "block": 16}}


@pytest.mark.anyio
async def test_vllm_reader_maps_ranks_and_whole_servers() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=VLLM_DP2)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        reader = VllmMetricsReader(client, "http://d:8000", [Target(4, 1), Target(5, 0)], clock=lambda: 7.0)
        got = await reader.read()
        assert got == [EngineSample(4, 1, 0, 4096, 65536, 7.0, 16), EngineSample(5, 3, 2, 16384, 65536, 7.0, 16)]
        whole = await VllmMetricsReader(client, "http://d:8000", [Target(0, None)], clock=lambda: 7.0).read()
        assert whole == [EngineSample(0, 4, 2, 20480, 131072, 7.0, 16)]
        with pytest.raises(LookupError, match="engine 2"):
            await VllmMetricsReader(client, "http://d:8000", [Target(0, 2)]).read()


def test_sglang_loads_parse() -> None:
    body = {"timestamp": 1.0, "version": "0.5.23", "disaggregation": {}, "loads": [
        {"dp_rank": 0, "num_running_reqs": 4, "num_waiting_reqs": 1, "num_used_tokens": 900,
         "max_total_num_tokens": 10000, "max_running_requests": 64, "token_usage": 0.09},
        {"dp_rank": 1, "num_running_reqs": 0, "num_waiting_reqs": 0, "num_used_tokens": 0,
         "max_total_num_tokens": 10000, "max_running_requests": 64, "token_usage": 0.0}]}
    assert parse_sglang_loads(body)[0] == {"running": 4, "waiting": 1, "used": 900, "budget": 10000}
    with pytest.raises(ValueError, match="loads"):
        parse_sglang_loads({"load": 3})


class _Fake:
    source, server = "fake", 0

    def __init__(self) -> None:
        self.samples: list[EngineSample] | Exception = []

    async def read(self) -> list[EngineSample]:
        if isinstance(self.samples, Exception):
            raise self.samples
        return self.samples


def _state(led: Ledger, now: float) -> ClusterState:
    return ClusterState(loads=led.loads.copy(), free_slots=led.free_slots(), num_active=led.num_active.copy(),
                        now=now)


@pytest.mark.anyio
async def test_reconciled_load_is_own_plus_foreign_while_fresh() -> None:
    led = Ledger([4, 4, 4], pool_capacity=8)
    clock = [100.0]
    fake = _Fake()
    sig = Signals(led, [fake], poll_interval_s=1.0, clock=lambda: clock[0])
    assert sig.max_age_s == 3.0
    led.loads[:] = [100, 50, 0]
    led.num_active[:] = [1, 1, 0]
    # replica 0: 400 reported, 100 own -> 300 foreign; 1: engine behind the ledger -> 0, never negative
    fake.samples = [EngineSample(0, 3, 1, 400, 10_000, 100.0), EngineSample(1, 0, 0, 20, None, 100.0)]
    await sig.poll_once()
    led.loads[:] = [40, 50, 0]  # own requests ended since the report: no phantom foreign load
    state = _state(led, 101.0)
    sig.reconcile(state)
    assert state.loads.tolist() == [340, 50, 0]
    assert state.num_active.tolist() == [4, 1, 0]  # 3 running + 1 waiting − 1 own = 3 foreign
    assert state.free_slots.tolist() == [0, 3, 4]
    if hasattr(state, "kv_budget"):
        assert state.kv_budget[0] == 10_000 and state.kv_budget[1] > 10**15
    stale = _state(led, 103.5)  # older than three poll intervals: the ledger alone
    sig.reconcile(stale)
    assert stale.loads.tolist() == [40, 50, 0] and stale.free_slots.tolist() == [3, 3, 4]
    # a failing reader is counted and changes nothing; the tick goes on
    fake.samples = RuntimeError("connection refused")
    seen: list[bool] = []
    sig.on_read = lambda source, server, ok: seen.append(ok)
    await sig.poll_once()
    assert sig.failures == 1 and sig.reads == 1 and seen == [False]
    again = _state(led, 101.0)
    sig.reconcile(again)
    assert again.loads.tolist() == [340, 50, 0]  # the last good report, still fresh


def test_ledger_hook_reconciles_the_tick() -> None:
    led = Ledger([2, 2], pool_capacity=4)
    led.enqueue(led.admit("a"), 10, 0.0, 30.0)
    led.reconcile = lambda state: state.loads.__iadd__(np.array([500, 0]))
    state, _ = led.build_tick(0.0)
    assert state.loads.tolist() == [500, 0] and led.loads.tolist() == [0, 0]

    def full(state: ClusterState) -> None:
        state.free_slots = np.zeros_like(state.free_slots)

    led.reconcile = full
    assert led.build_tick(0.0) is None  # foreign requests hold every slot: nothing is placed


# ------------------------------------------------------------------- on the emulator
def _engine_loads(emu) -> list[int]:
    async def read() -> list[int]:
        return [r.load for r in emu.cluster.replicas]

    return emu.call(read)


@pytest.mark.parametrize("source", ["vllm", "sglang"])
def test_readers_on_the_emulator(source: str) -> None:
    with running_emulator(layout="dp", time_scale=1.0) as emu:
        httpx.post(emu.decode_urls[0] + "/inject", json={"replica": 2, "prompt": 700, "output": 10**6,
                                                         "count": 2}, timeout=60).raise_for_status()
        wait_until(lambda: _engine_loads(emu)[2] >= 1400, what="the injected load")
        kind = VllmMetricsReader if source == "vllm" else SglangLoadsReader

        async def read() -> list[EngineSample]:
            async with httpx.AsyncClient() as client:
                return await kind(client, emu.decode_urls[0], [Target(g, g) for g in range(4)]).read()

        samples = asyncio.run(read())
        loads = _engine_loads(emu)
    assert [s.running for s in samples] == [0, 0, 2, 0]
    assert samples[2].kv_budget == 1_000_000
    # vLLM's usage counts whole blocks (two requests: up to 2 × 15 tokens more than they hold)
    slack = 2 * 15 if source == "vllm" else 0
    assert 1400 <= samples[2].kv_tokens <= loads[2] + slack and loads[2] - samples[2].kv_tokens < 200


def test_restarted_proxy_starts_from_the_engines_loads() -> None:
    """A busy group (load that no proxy sent), then a proxy starts: when it is ready it already
    sees the engines' loads (the first read happens before ready; bound: 2 s), and a new
    request goes to the idle replica, not onto the full ones."""
    busy = {0: (3, 2000), 1: (1, 2000), 3: (5, 500)}  # replica: (requests, prompt); 2 idle
    with running_emulator(time_scale=1.0) as emu:
        for g, (count, prompt) in busy.items():
            httpx.post(emu.decode_urls[g] + "/inject", json={"replica": g, "prompt": prompt, "output": 10**6,
                                                             "count": count}, timeout=60).raise_for_status()
        wait_until(lambda: _engine_loads(emu)[0] >= 6000, what="the busy group")
        mapping = {**emu.proxy_mapping(), "engine_state": "vllm", "engine_poll_interval_s": 0.5,
                   "policy": "least_load"}
        t0 = time.monotonic()
        with running_proxy(mapping) as (url, proxy, _):
            ready = time.monotonic()

            def seen() -> list[int]:
                return (proxy.ledger.loads + proxy.signals.foreign()[0]).tolist()

            def reached() -> bool:
                return all(abs(a - b) <= 0.02 * b + 100 for a, b in zip(seen(), _engine_loads(emu), strict=True))

            assert proxy.signals.reads >= 1, "no engine read before ready"
            wait_until(reached, timeout=2.0, what="the proxy to see the engines' loads")
            reach_s = time.monotonic() - ready
            resp = httpx.post(url + "/v1/completions", json={"model": "balanceroute-emulator", "prompt": "a b c",
                                                             "max_tokens": 3}, timeout=30)
            assert resp.status_code == 200
            assert proxy.ledger.finished["ok"] == 1
            placed = [p["completed"] for p in emu.stats()["per_replica"]]
            text = httpx.get(url + "/metrics", timeout=60).text
            assert re.search(r'balanceroute_replica_foreign_kv_load_tokens\{replica="0"\} [1-9]', text), text
            assert 'balanceroute_engine_reads_total{result="ok",server="0",source="vllm"}' in text
            status = proxy.status()
            first, idle = status["replicas"][0], status["replicas"][2]
            assert first["foreign_kv_load"] > 0 and first["foreign_running"] == 3 and first["engine"]["fresh"]
            assert idle["foreign_kv_load"] == 0 and first["kv_budget"] == 1_000_000
            assert status["engine_state"]["source"] == "vllm" and status["engine_state"]["failures"] == 0
    assert placed == [0, 0, 1, 0], f"the request went elsewhere: {placed}"
    assert reach_s <= 2.0
    print(f"restart: engines' loads seen {reach_s:.3f} s after ready ({ready - t0:.1f} s start-up)")


# ---------------------------------------------------------------------- two routers
def _hold(url: str, words: int, first: threading.Event, stop: threading.Event) -> None:
    """One long stream through ``url``, read as it comes (a client that keeps up), until
    ``stop``: then hang up."""
    body = {"model": "balanceroute-emulator", "prompt": " ".join(["w"] * words), "max_tokens": 10**6,
            "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as client, client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        for _ in r.iter_bytes():
            first.set()
            if stop.is_set():
                return


@pytest.mark.timeout(240)
def test_two_proxies_see_each_other_through_the_engines() -> None:
    """Two proxies in front of one emulated DP group of 4. Three long streams go through the
    first (one per replica: its own ledger spreads them); the second proxy, which sent none of
    them, sees them in the engines' state and places its request on the one idle replica — a
    known answer, whatever the machine's speed. Blind to the engines, its empty ledger would put
    it on replica 0, where the first stream runs."""
    stop = threading.Event()
    with running_emulator(layout="dp", num_replicas=4, slots=4, time_scale=1.0) as emu:
        base = {**emu.proxy_mapping(), "engine_state": "vllm", "engine_poll_interval_s": 0.05,
                "policy": "least_load"}
        with running_proxy(base) as (one, _, _), running_proxy(base) as (two, second, _), \
                ThreadPoolExecutor(3) as pool:
            holds = []
            for _ in range(3):  # one at a time, so the first proxy's ledger sees each
                first = threading.Event()
                holds.append(pool.submit(_hold, one, 500, first, stop))
                wait_until(lambda first=first: first.is_set() or holds[-1].done(), timeout=60,
                           what="a long stream's first token")
            running = [load > 0 for load in _engine_loads(emu)]
            try:
                assert running.count(True) == 3 and running[0], f"the premise failed: {running}"
                idle = running.index(False)

                def seen() -> list[int]:
                    return (second.ledger.loads + second.signals.foreign()[0]).tolist()

                def reached() -> bool:
                    return all((a > 0) == busy for a, busy in zip(seen(), running, strict=True))

                wait_until(reached, timeout=60, what="the second proxy to see the first one's streams")
                resp = httpx.post(two + "/v1/completions", json={"model": "balanceroute-emulator",
                                                                 "prompt": "a b c", "max_tokens": 3}, timeout=60)
                assert resp.status_code == 200
                placed = [p["completed"] for p in emu.stats()["per_replica"]]
            finally:
                stop.set()
            for h in holds:
                h.result(timeout=60)
    want = [0] * 4
    want[idle] = 1
    assert placed == want, f"the second proxy placed its request on {placed}, not on idle replica {idle}"


def test_engine_state_config_and_flags() -> None:
    from balanceroute.cli import build_parser
    from balanceroute.serving.cli import serve_config
    from balanceroute.serving.config import ProxyConfig

    args = ["serve", "--kv-dialect", "none", "--decode", "http://d:8000", "--dp-size", "2",
            "--engine-state", "sglang", "--engine-poll-interval", "0.5"]
    config = serve_config(build_parser().parse_args(args))
    assert (config.engine_state, config.engine_poll_interval_s) == ("sglang", 0.5)
    assert ProxyConfig.from_mapping({"kv_dialect": "none", "decode": ["http://d:8000"]}).engine_state == "off"
    for bad in ({"engine_state": "prometheus"}, {"engine_poll_interval_s": 0}):
        with pytest.raises(ValueError, match="engine_"):
            ProxyConfig.from_mapping({"kv_dialect": "none", "decode": ["http://d:8000"], **bad})


@pytest.mark.anyio
async def test_an_unreadable_engine_is_counted_and_the_ledger_serves() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(500, text="down")
        if request.url.host.startswith("p"):
            return prefill_reply()
        return httpx.Response(200, content=b"".join(sse_stream(3)))

    async with mock_proxy(pd_config(engine_state="vllm", engine_poll_interval_s=0.02), handler) as (client, proxy):
        await asyncio.sleep(0.1)
        resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3, "stream": True})
        assert resp.status_code == 200 and resp.content.endswith(b"data: [DONE]\n\n")
        text = (await client.get("/metrics")).text
        assert proxy.signals.failures >= 2 and proxy.signals.reads == 0
        assert 'balanceroute_engine_reads_total{result="failed",server="1",source="vllm"}' in text
        assert 'balanceroute_replica_engine_report_age_seconds{replica="0"} +Inf' in text
        assert_drained(proxy)


@pytest.mark.anyio
async def test_the_ledger_is_a_reader_too() -> None:
    from balanceroute.serving.engine_readers.ledger import LedgerReader

    led = Ledger([2, 2], pool_capacity=4)
    led.loads[:] = [30, 0]
    led.num_active[:] = [1, 0]
    assert await LedgerReader(led, clock=lambda: 5.0).read() == [EngineSample(0, 1, 0, 30, None, 5.0),
                                                                  EngineSample(1, 0, 0, 0, None, 5.0)]
