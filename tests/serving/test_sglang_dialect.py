"""The SGLang PD dialect: both legs carry one bootstrap room; the prefill leg goes out on arrival
and is held open while the request waits in the pool; decode gets ``routed_dp_rank``."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

from balanceroute.serving.kv import SglangDialect, get_dialect

from .conftest import (
    ByteStream,
    assert_drained,
    chunk,
    mock_proxy,
    pd_config,
    running_emulator,
    running_proxy,
    sse_stream,
)


def test_bootstrap_fields() -> None:
    dialect = SglangDialect(random.Random(3))
    a = dialect.bootstrap("http://10.0.0.7:30000", None, 8998)
    b = dialect.bootstrap("http://10.0.0.7:30000", "http://10.0.0.7:9100", 8998)
    assert (a["bootstrap_host"], a["bootstrap_port"], b["bootstrap_port"]) == ("10.0.0.7", 8998, 9100)
    assert a["bootstrap_room"] != b["bootstrap_room"]
    assert all(0 <= f["bootstrap_room"] < 2**63 for f in (a, b))
    assert dialect.decode_fields(None) == {} and dialect.decode_fields(3) == {"routed_dp_rank": 3}
    assert isinstance(get_dialect("sglang"), SglangDialect)


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_both_legs_share_the_room_and_prefill_goes_first(stream: bool) -> None:
    """Prefill gets the client's body (not streamed) with the room before any replica is
    picked, and answers only after decode arrived; decode gets the same room, its DP rank in
    ``routed_dp_rank``, streamed with usage."""
    seen: list[tuple[str, dict, str]] = []
    decode_arrived = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.host, body, request.headers.get("x-data-parallel-rank", "")))
        if request.url.host.startswith("p"):
            await decode_arrived.wait()  # SGLang's prefill answers once decode pulled the KV
            return httpx.Response(200, json={"choices": [{"index": 0, "text": "x"}],
                                             "usage": {"prompt_tokens": 5, "completion_tokens": 1}})
        decode_arrived.set()
        return httpx.Response(200, content=b"".join(sse_stream(3, prompt=5)),
                              headers={"content-type": "text/event-stream"})

    config = pd_config(kv_dialect="sglang", prefill=[{"url": "http://p0:8000", "bootstrap_addr": "http://p0:9001"}],
                       decode=[{"url": "http://d0:8000", "dp_size": 2}])
    async with mock_proxy(config, handler) as (client, proxy):
        resp = await client.post("/v1/completions", json={"prompt": [1, 2, 3, 4, 5], "max_tokens": 3,
                                                          "stream": stream, "stream_options": None})
        assert resp.status_code == 200, resp.text
        await asyncio.sleep(0)
        assert_drained(proxy)
    assert [host for host, _, _ in seen] == ["p0", "d0"]
    (_, pre, _), (_, dec, rank) = seen
    room = {k: pre[k] for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")}
    assert room["bootstrap_host"] == "p0" and room["bootstrap_port"] == 9001
    assert {k: dec[k] for k in room} == room
    assert pre["stream"] is False and "routed_dp_rank" not in pre and "kv_transfer_params" not in pre
    assert dec["stream"] is True and dec["stream_options"]["continuous_usage_stats"] is True
    assert dec["routed_dp_rank"] == int(rank) and rank in ("0", "1")
    assert pre["prompt"] == dec["prompt"] == [1, 2, 3, 4, 5]


@pytest.mark.anyio
async def test_prefill_failure_while_pooled_fails_the_request() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host.startswith("p"):
            return httpx.Response(500, json={"error": {"message": "boom"}})
        raise AssertionError("decode must not be called")

    config = pd_config(kv_dialect="sglang", prefill=[{"url": "http://p0:8000"}],
                       decode=[{"url": "http://d0:8000", "slots": 1}])
    async with mock_proxy(config, handler) as (client, proxy):
        # keep the only slot busy so the request is still pooled when prefill fails
        ticket = proxy.ledger.admit("blocker")
        proxy.ledger.enqueue(ticket, 5, 0.0, 1e9)
        proxy.dispatcher.tick()
        resp = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert resp.status_code == 502 and resp.json()["error"]["code"] == "prefill_failed"
        proxy.dispatcher.finish(ticket, "ok")
        assert_drained(proxy)


@pytest.mark.parametrize("layout", ["ports", "dp"])
def test_emulated_sglang_cluster(layout: str) -> None:
    """Through the emulator speaking the dialect: every request's decode pulled its room's KV
    (no miss, no recompute), token counts exact, the accounting drains."""
    with running_emulator(num_replicas=2, slots=2, num_prefill=1, layout=layout) as emu, \
            running_proxy({**emu.proxy_mapping("sglang"), "health_interval_s": 0}) as (url, proxy, _):

        async def run() -> list[tuple[int, int]]:
            async with httpx.AsyncClient(timeout=30) as http:
                async def one(k: int) -> tuple[int, int]:
                    body = {"model": "balanceroute-emulator", "prompt": f"request number {k}", "max_tokens": 5 + k,
                            "ignore_eos": True}
                    resp = await http.post(url + "/v1/completions", json=body)
                    return resp.status_code, resp.json()["usage"]["completion_tokens"]
                return await asyncio.gather(*(one(k) for k in range(8)))

        results = asyncio.run(run())
        assert results == [(200, 5 + k) for k in range(8)]
        stats = emu.stats()
        assert stats["kv"] == {"hits": 8, "misses": 0, "expired": 0}, stats["kv"]
        assert stats["requests"]["prefilled"] == 8
        assert sum(r["completed"] for r in stats["per_replica"]) == 8
        assert_drained(proxy)


@pytest.mark.anyio
async def test_estimated_prompt_is_corrected_from_decode_usage() -> None:
    """s_i is the proxy's estimate (prefill's usage comes too late); decode's first usage
    replaces it in the replica's load."""
    go = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host.startswith("p"):
            return httpx.Response(200, json={"choices": [], "usage": {"prompt_tokens": 7}})

        async def gen():
            yield chunk(" t0", 1, prompt=7)
            await go.wait()
            yield chunk(" t1", 2, prompt=7, finish="length")
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, stream=ByteStream(gen()))

    config = pd_config(kv_dialect="sglang", prefill=[{"url": "http://p0:8000"}], decode=[{"url": "http://d0:8000"}])
    async with mock_proxy(config, handler) as (client, proxy):
        answer = asyncio.ensure_future(client.post("/v1/completions", json={"prompt": "word " * 40,
                                                                            "max_tokens": 2}))
        for _ in range(300):  # the first token is in: s_i + 1, once decode's usage is read
            if proxy.ledger.loads.sum() == 7 + 1 or proxy.ledger.loads.sum() == 50 + 1:
                break
            await asyncio.sleep(0.01)
        assert proxy.ledger.loads.sum() == 7 + 1  # not the estimate, 50 + 1
        go.set()
        assert (await answer).status_code == 200
        assert_drained(proxy)
