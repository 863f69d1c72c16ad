"""The KV lease in the proxy: one rule (:class:`~balanceroute.core.lease.LeaseRule`) per prefill
server; a pooled request is never forwarded to decode past ``forward_by_s``; one that missed it
is prefilled again (``max_reprefills`` times), then answered 503 ``kv_lease_expired``."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from balanceroute.core.lease import LeaseRule
from balanceroute.serving.config import ProxyConfig

from .conftest import (
    ByteStream,
    assert_drained,
    chunk,
    mock_proxy,
    pd_config,
    prefill_reply,
    running_emulator,
    running_proxy,
    wait_until,
)


def test_lease_rule_per_prefill_server() -> None:
    config = pd_config(prefill=[{"url": "http://p0:8000"}, {"url": "http://p1:8000", "kv_lease_s": 8}],
                       kv_lease_s=30, lease_margin_s=5, max_reprefills=2)
    assert config.lease_rule(0) == LeaseRule(lease_s=30, margin_s=2, priority_s=3, max_reprefills=2)
    assert config.lease_rule(0) == config.lease_rule()
    short = config.lease_rule(1)
    assert (short.forward_by_s, short.deadline_s) == (6, 3)
    assert config.policy_lease() == short  # the policy's pool deadline: the shortest lease's
    # a margin below the transfer's 2 s is the transfer margin itself (no time to place first)
    tight = pd_config(kv_lease_s=0.3, lease_margin_s=0.1).lease_rule()
    assert (tight.margin_s, tight.priority_s) == (0.1, 0)


@pytest.mark.parametrize(("entry", "message"), [
    ({"url": "http://p0:8000", "kv_lease_s": 0}, "kv_lease_s"),
    ({"url": "http://p0:8000", "kv_lease_s": 4}, "must be > lease_margin_s"),
])
def test_bad_prefill_lease(entry: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProxyConfig.from_mapping({"prefill": [entry], "decode": ["http://d0:8000"], "lease_margin_s": 5})


@pytest.mark.anyio
@pytest.mark.parametrize("max_reprefills", [0, 2])
async def test_late_request_is_prefilled_again_then_fails(max_reprefills: int) -> None:
    """One decode slot held by a stream: a second request misses its lease in the pool, is
    prefilled ``max_reprefills`` more times, under a new request id each time, never reaches
    decode, and gets 503 ``kv_lease_expired``."""
    hold = asyncio.Event()
    calls: list[tuple[str, str]] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append((request.url.host, request.headers["x-request-id"]))
        if request.url.host.startswith("p"):
            return prefill_reply()

        async def gen():
            yield chunk(" t0", 1)
            await hold.wait()
            yield chunk(" t1", 2, finish="length")
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, stream=ByteStream(gen()))

    config = pd_config(prefill=[{"url": "http://p0:8000"}], decode=[{"url": "http://d0:8000", "slots": 1}],
                       kv_lease_s=0.3, lease_margin_s=0.1, max_reprefills=max_reprefills)
    async with mock_proxy(config, handler) as (client, proxy):
        first = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "x", "stream": True}))
        while not any(host == "d0" for host, _ in calls):  # the first stream holds the slot
            await asyncio.sleep(0.01)
        calls.clear()
        resp = await client.post("/v1/completions", json={"prompt": "y"})
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "kv_lease_expired"
        assert f"prefilled {max_reprefills + 1} time(s)" in resp.json()["error"]["message"]
        assert [host for host, _ in calls] == ["p0"] * (max_reprefills + 1)  # never sent to decode
        ids = [rid for _, rid in calls]
        assert ids == [ids[0]] + [f"{ids[0]}-r{k}" for k in range(1, max_reprefills + 1)]
        assert proxy.metrics.retries.labels("reprefill")._value.get() == max_reprefills
        hold.set()
        assert (await first).status_code == 200
        assert_drained(proxy)


@pytest.mark.anyio
async def test_reprefilled_request_takes_the_new_kv() -> None:
    """The slot frees while the request is prefilled again: it is forwarded with the second
    prefill's ``kv_transfer_params``, never the expired first ones."""
    hold = asyncio.Event()
    prefills = 0
    decoded: list[dict] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal prefills
        body = json.loads(request.content)
        if request.url.host.startswith("p"):
            prefills += 1
            if prefills == 3:  # the second request's second prefill: let the first stream end
                hold.set()
            return prefill_reply(kv={"do_remote_prefill": True, "remote_request_id": f"kv-{prefills}"})
        decoded.append(body.get("kv_transfer_params"))

        async def gen():
            yield chunk(" t0", 1)
            if len(decoded) == 1:
                await hold.wait()
            yield chunk(" t1", 2, finish="length")
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, stream=ByteStream(gen()))

    config = pd_config(prefill=[{"url": "http://p0:8000"}], decode=[{"url": "http://d0:8000", "slots": 1}],
                       kv_lease_s=0.3, lease_margin_s=0.1, max_reprefills=1)
    async with mock_proxy(config, handler) as (client, proxy):
        first = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "x", "stream": True}))
        while not proxy.ledger.num_active.any():
            await asyncio.sleep(0.01)
        resp = await client.post("/v1/completions", json={"prompt": "y"})
        assert resp.status_code == 200, resp.text
        assert [kv["remote_request_id"] for kv in decoded] == ["kv-1", "kv-3"]
        assert (await first).status_code == 200
        assert_drained(proxy)


@pytest.mark.parametrize("dialect", ["nixl", "sglang"])
def test_emulated_pool_that_cannot_drain_never_pulls_late(dialect: str) -> None:
    """Two decode slots, six 2-second requests at once, prefill holding KV for 1 s (SGLang: its
    bootstrap timeout): the four that wait are prefilled again and then fail; the emulated
    decode servers never pull a KV that was released (no ``misses``), and the accounting
    drains."""
    with running_emulator(num_replicas=2, slots=1, num_prefill=1, time_scale=1.0, kv_lease_s=1.0) as emu, \
            running_proxy({**emu.proxy_mapping(dialect), "health_interval_s": 0, "kv_lease_s": 1.0,
                           "lease_margin_s": 0.5}) as (url, proxy, server):

        def one(k: int) -> tuple[int, dict]:
            body = {"model": "balanceroute-emulator", "prompt": f"request {k}", "max_tokens": 100,
                    "ignore_eos": True}
            resp = httpx.post(url + "/v1/completions", json=body, timeout=60)
            return resp.status_code, resp.json()

        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(one, range(6)))
        wait_until(lambda: proxy.ledger.in_flight == 0, what="the proxy to drain")
        stats = emu.stats()
        statuses = sorted(status for status, _ in results)
        assert stats["kv"]["misses"] == 0, (stats["kv"], results)
        assert statuses.count(200) == stats["kv"]["hits"] >= 2
        assert statuses.count(503) >= 1, "the premise failed: the pool drained within the lease"
        assert all(body["error"]["code"] == "kv_lease_expired" for status, body in results if status == 503)
        if dialect == "nixl":  # (an SGLang leg the proxy closed is never answered)
            assert stats["requests"]["prefilled"] == 6 + proxy.metrics.retries.labels("reprefill")._value.get()
        assert_drained(proxy)
